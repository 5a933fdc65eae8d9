#include "client/cpp/transfer.h"

#include "absl/strings/str_cat.h"
#include "client/cpp/status_convert.h"

namespace tutti::client {

void Retrieval::Rep::OnProgress(uint32_t layer, absl::Span<const uint32_t> failed) {
  absl::MutexLock lock(&mu);
  if (failed_blocks.empty()) failed_blocks.assign(num_blocks, false);
  if (layer != next_layer || layer >= layer_end) {
    out_of_order = true;
    return;
  }
  for (uint32_t i : failed) {
    if (i < num_blocks) failed_blocks[i] = true;
  }
  ++next_layer;
}

void Retrieval::Rep::OnEnd(const absl::Status& status) {
  RetrieveOutcome out;
  bool release = false;
  {
    absl::MutexLock lock(&mu);
    if (failed_blocks.empty()) failed_blocks.assign(num_blocks, false);
    out.layers_done = next_layer - layer_begin;
    if (status.ok() && out_of_order) {
      out.status = Status(StatusCode::kInternal, "tuttid reported layers out of order");
    } else if (status.ok() && next_layer != layer_end) {
      out.status =
          Status(StatusCode::kInternal, absl::StrCat("the transfer ended after ", out.layers_done,
                                                     " of ", layer_end - layer_begin, " layers"));
    } else {
      out.status = FromAbsl(status);
    }
    release = !out.status.ok();
    for (uint32_t i = 0; i < num_blocks; ++i) {
      if (release || failed_blocks[i]) out.failed.push_back(i);
    }
  }
  // Outside the lock: the release waits for the GPU.
  if (release && words != nullptr) {
    absl::Status s = words->ForceRelease(ticket);
    if (!s.ok()) {
      out.status = Status(
          out.status.code(),
          absl::StrCat(out.status.message(), "; releasing the layer waits failed: ", s.ToString()));
    }
  }
  absl::MutexLock lock(&mu);
  outcome = std::move(out);
  ended_ = true;
}

Status Retrieval::Rep::WaitLayer(uint32_t layer, void* cuda_stream) {
  if (layer < layer_begin || layer >= layer_end) {
    return Status(StatusCode::kInvalidArgument,
                  absl::StrCat("layer ", layer, " is outside this Retrieve's layers [", layer_begin,
                               ", ", layer_end, ")"));
  }
  if (words != nullptr) {
    if (cuda_stream == nullptr) {
      return Status(StatusCode::kInvalidArgument, "cuda mode: WaitLayer needs the engine's stream");
    }
    return FromAbsl(words->EnqueueWait(cuda_stream, layer, ticket));
  }
  absl::MutexLock lock(&mu);
  auto landed = [this, layer]()
                    ABSL_SHARED_LOCKS_REQUIRED(mu) { return ended_ || next_layer > layer; };
  mu.Await(absl::Condition(&landed));
  if (next_layer > layer) return Status();
  return Status(StatusCode::kAborted, absl::StrCat("the transfer ended before layer ", layer,
                                                   " landed: ", outcome.status.ToString()));
}

const RetrieveOutcome& Retrieval::Rep::Wait() {
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&ended_));
  return outcome;
}

bool Retrieval::Rep::ended() const {
  absl::MutexLock lock(&mu);
  return ended_;
}

}  // namespace tutti::client

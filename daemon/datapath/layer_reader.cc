#include "daemon/datapath/layer_reader.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "daemon/pool/slot_header.h"

namespace tutti::datapath {

// One layer's reads in flight: its plan, its requests, and their completion. Waits for posted
// reads when destroyed, so staging outlives every read into it.
struct LayerReader::InFlight {
  LayerPlan plan;
  std::vector<io::IoRequest> reqs;
  std::unique_ptr<absl::Notification> done;
  void Wait() const {
    if (done != nullptr) done->WaitForNotification();
  }
  ~InFlight() { Wait(); }
};

// The window's leases and layers in flight. Members are destroyed in reverse order: every read
// in flight has completed before its lease goes back.
struct LayerReader::Window {
  std::vector<StagingLease> leases;
  std::vector<InFlight> layers;
  uint32_t size() const { return static_cast<uint32_t>(layers.size()); }
};

LayerReader::LayerReader(const LayerReaderOptions& options, StagingPool* staging, PostFn post)
    : options_(options), staging_(staging), post_(std::move(post)) {}

absl::Status LayerReader::TakeWindow(uint64_t layer_bytes, uint32_t layers, Window* window) {
  const uint32_t wanted = std::max<uint32_t>(1, std::min(layers, options_.window_layers));
  if (layer_bytes == 0) {  // every item from the DRAM tier, or failed: nothing to stage
    window->layers = std::vector<InFlight>(1);
    return absl::OkStatus();
  }
  if (layer_bytes > staging_->capacity_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("one layer of this read needs ", layer_bytes,
                     " bytes of staging; limits.retrieve_staging_bytes holds ",
                     staging_->capacity_bytes()));
  }
  std::optional<StagingLease> first = staging_->TryTake(layer_bytes);
  if (!first.has_value()) {
    counters_.AddStagingWait();
    absl::StatusOr<StagingLease> waited = staging_->Take(layer_bytes);
    if (!waited.ok()) return waited.status();
    first = std::move(*waited);
  }
  window->leases.push_back(std::move(*first));
  while (window->leases.size() < wanted) {
    std::optional<StagingLease> more = staging_->TryTake(layer_bytes);
    if (!more.has_value()) break;
    window->leases.push_back(std::move(*more));
  }
  window->layers = std::vector<InFlight>(window->leases.size());
  return absl::OkStatus();
}

void LayerReader::Post(const LayerReadRequest& r, uint32_t layer,
                       absl::Span<const ReadFailure> failures, const StagingLease& lease,
                       InFlight* in) {
  std::vector<PlanItem> items(r.items.size());
  for (size_t i = 0; i < r.items.size(); ++i) {
    if (r.items[i].from == ReadSource::From::kSsd && failures[i] == ReadFailure::kNone) {
      items[i].slot = r.items[i].slot;
    }
  }
  in->plan = PlanLayer(options_.layout, PlanRequest{items, layer, r.parts, r.object_len,
                                                    options_.max_read_bytes});
  in->reqs.clear();
  uint64_t bytes = 0, merged = 0;
  for (const PlannedIo& io : in->plan.ios) {
    in->reqs.push_back(io::IoRequest{io::Op::kRead, io.file, io.offset,
                                     lease.data() + io.staging_offset, io.len, 0});
    bytes += io.len;
    merged += io.num_objects > 1;
  }
  counters_.AddLayer(in->reqs.size(), bytes, in->plan.objects.size(), merged);
  in->done = std::make_unique<absl::Notification>();
  absl::Notification* n = in->done.get();
  if (in->reqs.empty()) {
    n->Notify();
  } else {
    post_(absl::MakeSpan(in->reqs), [n] { n->Notify(); });
  }
}

ReadFailure LayerReader::CheckObject(const LayerReadRequest& r, const ReadSource& src,
                                     uint32_t object, const PlannedObject& o, const InFlight& in,
                                     const uint8_t* bytes) const {
  const io::IoRequest& req = in.reqs[o.io];
  const uint64_t end_in_io = o.staging_offset - in.plan.ios[o.io].staging_offset + in.plan.read_len;
  if (req.result < 0) return ReadFailure::kIoError;
  if (static_cast<uint64_t>(req.result) < end_in_io) return ReadFailure::kShortRead;
  if (pool::ObjectChecksum(r.ns, src.key, src.epoch, object, bytes, r.object_len) !=
      src.checksums[object]) {
    return ReadFailure::kChecksum;
  }
  return ReadFailure::kNone;
}

void LayerReader::Check(const LayerReadRequest& r, uint32_t layer, const InFlight& in,
                        const StagingLease& lease, std::vector<ReadFailure>* failures,
                        std::vector<ScatterOp>* ops, std::vector<uint32_t>* failed) const {
  for (uint32_t i = 0; i < r.items.size(); ++i) {
    const ReadSource& src = r.items[i];
    if (src.from == ReadSource::From::kFailed && layer == r.layer_begin) failed->push_back(i);
    if ((*failures)[i] != ReadFailure::kNone) continue;
    const size_t ops_before = ops->size();
    for (uint32_t p = 0; p < r.parts; ++p) {
      const uint32_t object = layer * r.parts + p;
      if (src.from == ReadSource::From::kDram) {
        ops->push_back(ScatterOp{i, object, src.dram + uint64_t{object} * r.object_len, true});
        continue;
      }
      const uint32_t index = in.plan.object_of[i * r.parts + p];
      if (index == kNoObject) {  // not planned: cannot happen for an item not failed
        (*failures)[i] = ReadFailure::kIoError;
        break;
      }
      const PlannedObject& o = in.plan.objects[index];
      const uint8_t* bytes = lease.data() + o.staging_offset;
      const ReadFailure f = CheckObject(r, src, object, o, in, bytes);
      if (f != ReadFailure::kNone) {
        (*failures)[i] = f;
        break;
      }
      ops->push_back(ScatterOp{i, object, bytes, false});
    }
    if ((*failures)[i] != ReadFailure::kNone) {
      ops->resize(ops_before);
      failed->push_back(i);
    }
  }
}

LayerReadResult LayerReader::Read(const LayerReadRequest& r, const Sink& sink) {
  LayerReadResult result;
  result.failures.assign(r.items.size(), ReadFailure::kNone);
  uint64_t ssd_objects = 0;
  for (size_t i = 0; i < r.items.size(); ++i) {
    if (r.items[i].from == ReadSource::From::kFailed) result.failures[i] = ReadFailure::kBeforeRead;
    if (r.items[i].from == ReadSource::From::kSsd) ssd_objects += r.parts;
  }
  const uint64_t layer_bytes = ssd_objects * RoundUp4K(r.object_len);
  Window window;
  result.status = TakeWindow(layer_bytes, r.layer_end - r.layer_begin, &window);
  if (!result.status.ok()) return result;
  const auto started = std::chrono::steady_clock::now();
  static const StagingLease kNoLease;
  auto lease_of = [&](uint32_t layer) -> const StagingLease& {
    return window.leases.empty() ? kNoLease
                                 : window.leases[(layer - r.layer_begin) % window.size()];
  };
  uint32_t next_post = r.layer_begin;
  std::vector<ScatterOp> ops;
  std::vector<uint32_t> failed;
  for (uint32_t layer = r.layer_begin; layer < r.layer_end && result.status.ok(); ++layer) {
    for (; next_post < r.layer_end && next_post < layer + window.size(); ++next_post) {
      InFlight& in = window.layers[(next_post - r.layer_begin) % window.size()];
      Post(r, next_post, result.failures, lease_of(next_post), &in);
    }
    const InFlight& in = window.layers[(layer - r.layer_begin) % window.size()];
    in.Wait();
    ops.clear();
    failed.clear();
    Check(r, layer, in, lease_of(layer), &result.failures, &ops, &failed);
    result.status = sink(layer, ops, failed);
    ++result.layers_done;
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;  // `window` waits for reads still in flight, then gives its leases back
}

}  // namespace tutti::datapath

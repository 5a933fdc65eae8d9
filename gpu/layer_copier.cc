#include "gpu/layer_copier.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"
#include "gpu/cuda_status.h"
#include "gpu/probe.h"

namespace tutti::gpu {
namespace {

constexpr uint64_t kGpuBufferGranularity = 2ull << 20;
// Runs start at this alignment in the GPU buffer (the copy kernel needs 16).
constexpr uint64_t kRunAlign = 256;
// Objects at most this far apart in host memory share a run (the gap is copied too): staging
// frames are 4 KiB-rounded, so an object shorter than its frame leaves a gap below 4 KiB.
constexpr uint64_t kMaxGap = 4096;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

absl::StatusOr<std::unique_ptr<LayerCopier>> LayerCopier::Create(
    const Options& options, IoStream* stream, absl::Span<const StagingRegion> registered) {
  if (options.gpu_staging_bytes == 0) {
    return absl::InvalidArgumentError("LayerCopier: gpu_staging_bytes must be > 0");
  }
  ASSIGN_OR_RETURN(StagingMap map, StagingMap::Create(registered));
  RETURN_IF_ERROR(Probe(stream->device()).status());
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(stream->device()), "cudaSetDevice"));
  std::unique_ptr<LayerCopier> copier(new LayerCopier(options, stream));
  copier->registered_ = std::move(map);
  copier->registered_list_.assign(registered.begin(), registered.end());
  copier->gpu_bytes_ = AlignUp(options.gpu_staging_bytes, kGpuBufferGranularity);
  void* p = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&p, copier->gpu_bytes_), "cudaMalloc(GPU staging for retrieves)"));
  copier->gpu_base_ = static_cast<uint8_t*>(p);
  log::Get("gpu")->info("gpu{}: retrieve copies {}; GPU staging {} MiB", stream->device(),
                        options.mode == Mode::kStaged
                            ? "staged (copy engine, then a device-to-device scatter)"
                            : "mapped (scatter kernel over mapped pinned staging)",
                        copier->gpu_bytes_ >> 20);
  return copier;
}

LayerCopier::~LayerCopier() {
  absl::Status s = stream_->Synchronize();
  if (!s.ok()) log::Get("gpu")->error("gpu{}: closing copier: {}", stream_->device(), s.ToString());
  if (gpu_base_ != nullptr) {
    s = CudaStatus(cudaFree(gpu_base_), "cudaFree(GPU staging)");
    if (!s.ok()) log::Get("gpu")->error("gpu{}: {}", stream_->device(), s.ToString());
  }
}

std::vector<StagingRegion> LayerCopier::staging_regions() const {
  std::vector<StagingRegion> out = registered_list_;
  out.push_back(StagingRegion{gpu_base_, gpu_bytes_, gpu_base_});
  return out;
}

bool LayerCopier::IsRegistered(const uint8_t* host, uint64_t len) const {
  return registered_.ToDevice(host, len) != nullptr;
}

absl::Status LayerCopier::ScatterLayer(CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops,
                                       ReadyWords* words, uint32_t word, uint32_t ticket) {
  const uint64_t len = memory->object_len();
  if (len > gpu_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("objects of ", len,
                                                   " bytes exceed the GPU staging buffer (",
                                                   gpu_bytes_, " bytes)"));
  }
  absl::MutexLock lock(&mu_);
  staged_.clear();
  direct_.clear();
  for (uint32_t i = 0; i < ops.size(); ++i) {
    if (options_.mode == Mode::kMapped && IsRegistered(ops[i].staging, len)) {
      direct_.push_back(ops[i]);
    } else {
      staged_.push_back(i);
    }
  }
  if (!direct_.empty()) RETURN_IF_ERROR(memory->EnqueueScatter(direct_));
  if (!staged_.empty()) RETURN_IF_ERROR(EnqueueStaged(memory, ops, &staged_));
  if (words != nullptr) RETURN_IF_ERROR(words->Signal(word, ticket));
  return stream_->Synchronize();
}

absl::Status LayerCopier::EnqueueStaged(CudaIpcMemory* memory,
                                        absl::Span<const engine::CopyOp> ops,
                                        std::vector<uint32_t>* indices) {
  const uint64_t len = memory->object_len();
  std::sort(indices->begin(), indices->end(),
            [&](uint32_t a, uint32_t b) { return ops[a].staging < ops[b].staging; });
  runs_.clear();
  round_ops_.clear();
  uint64_t used = 0;  // bytes of the GPU buffer taken by this round's runs
  for (uint32_t i : *indices) {
    const engine::CopyOp& op = ops[i];
    Run* run = runs_.empty() ? nullptr : &runs_.back();
    const bool joins = run != nullptr && op.staging >= run->host &&
                       op.staging <= run->host + run->len + kMaxGap;
    if (joins) {
      const uint64_t new_len = std::max<uint64_t>(run->len, op.staging + len - run->host);
      if (run->gpu_offset + new_len <= gpu_bytes_) {
        run->len = new_len;
        used = run->gpu_offset + new_len;
        round_ops_.push_back({op.block, op.object,
                              gpu_base_ + run->gpu_offset + (op.staging - run->host)});
        continue;
      }
    }
    uint64_t offset = AlignUp(used, kRunAlign);
    if (offset + len > gpu_bytes_) {
      RETURN_IF_ERROR(FlushRound(memory));
      offset = 0;
    }
    runs_.push_back(Run{op.staging, len, offset});
    used = offset + len;
    round_ops_.push_back({op.block, op.object, gpu_base_ + offset});
  }
  return FlushRound(memory);
}

absl::Status LayerCopier::FlushRound(CudaIpcMemory* memory) {
  for (const Run& r : runs_) {
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(gpu_base_ + r.gpu_offset, r.host, r.len,
                                               cudaMemcpyHostToDevice, stream_->stream()),
                               "cudaMemcpyAsync(staging -> GPU staging)"));
  }
  absl::Status s = round_ops_.empty() ? absl::OkStatus() : memory->EnqueueScatter(round_ops_);
  runs_.clear();
  round_ops_.clear();
  return s;
}

}  // namespace tutti::gpu

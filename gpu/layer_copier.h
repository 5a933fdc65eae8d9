// Moves one layer of a Retrieve from host staging into an engine's blocks on the I/O stream,
// marks the layer ready, and returns once the host staging may be reused.
//
// Two ways, chosen at creation (config gpu.scatter):
//   kStaged: the layer's objects, sorted by staging address and merged into contiguous runs, are
//     copied by the copy engine (cudaMemcpyAsync host -> device) into a GPU staging buffer
//     allocated at creation; then the copy kernel places them from there into the engine's blocks,
//     device to device. The kernel runs at HBM speed, so the I/O SMs work for a few percent of
//     the transfer time instead of all of it. A layer larger than the GPU buffer goes in rounds
//     (stream order keeps a round's copy from overwriting the buffer before the previous round's
//     kernel has read it).
//   kMapped: the copy kernel reads the mapped pinned staging over PCIe (the SMs are busy for the
//     whole transfer).
// Objects whose staging is not in the registered regions given at creation (the store's DRAM tier
// is ordinary heap memory) take the kStaged way in both modes; their host -> device copies are
// pageable, which the driver bounces through pinned buffers of its own (much slower).
//
// Nothing is allocated per call once the internal vectors have grown to a layer's size.
//
// Thread-safety: every method may be called from any thread. ScatterLayer calls are serialized
// (one layer uses the GPU staging buffer at a time). Lifetimes: the IoStream and the registered
// regions must outlive the copier; the copier must outlive every CudaIpcMemory opened with its
// staging_regions().
#ifndef TUTTI_GPU_LAYER_COPIER_H_
#define TUTTI_GPU_LAYER_COPIER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/engine/engine_memory.h"
#include "gpu/cuda_ipc_memory.h"
#include "gpu/io_stream.h"
#include "gpu/placement.h"
#include "gpu/ready_words.h"

namespace tutti::gpu {

class LayerCopier {
 public:
  enum class Mode { kStaged, kMapped };
  struct Options {
    Mode mode = Mode::kStaged;
    // Size of the GPU staging buffer (rounded up to 2 MiB): the bytes of one round. Must hold the
    // largest object. One layer of a maximal Retrieve (max_blocks_per_call x 2 x object_bytes)
    // makes every layer one round.
    uint64_t gpu_staging_bytes = 128ull << 20;
  };

  // Allocates the GPU staging buffer on the stream's device. INVALID_ARGUMENT for an empty buffer
  // or a bad registered region; RESOURCE_EXHAUSTED when GPU memory is short; UNAVAILABLE without
  // a GPU.
  static absl::StatusOr<std::unique_ptr<LayerCopier>> Create(
      const Options& options, IoStream* stream, absl::Span<const StagingRegion> registered);
  LayerCopier(const LayerCopier&) = delete;
  LayerCopier& operator=(const LayerCopier&) = delete;
  // Waits for the I/O stream, then frees the GPU staging buffer.
  ~LayerCopier();

  Mode mode() const { return options_.mode; }
  // The staging regions an engine memory must know (CudaIpcMemory::Open / WrapLocal): the
  // registered host regions and the GPU staging buffer.
  std::vector<StagingRegion> staging_regions() const;

  // Copies each op's object from host staging (op.staging, a host address) into `memory`, then,
  // if `words` is not null, enqueues words->Signal(word, ticket), then waits until the I/O stream
  // has passed all of it. INVALID_ARGUMENT for an op outside `memory`'s layout or an object
  // larger than the GPU buffer; INTERNAL for CUDA errors. On error some copies may have run and
  // the word is not written: the caller decides (the server still writes it, see
  // daemon/server/engine_io.h).
  [[nodiscard]] absl::Status ScatterLayer(CudaIpcMemory* memory,
                                          absl::Span<const engine::CopyOp> ops, ReadyWords* words,
                                          uint32_t word, uint32_t ticket);

 private:
  struct Run {  // bytes [host, host + len) go to gpu_base_ + gpu_offset
    const uint8_t* host;
    uint64_t len;
    uint64_t gpu_offset;
  };

  LayerCopier(const Options& options, IoStream* stream) : options_(options), stream_(stream) {}
  // Enqueues the copy-engine part of `ops` (the ones at `indices`): runs into the GPU buffer and
  // the device-to-device scatter, in rounds.
  absl::Status EnqueueStaged(CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops,
                             std::vector<uint32_t>* indices) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FlushRound(CudaIpcMemory* memory) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsRegistered(const uint8_t* host, uint64_t len) const;

  const Options options_;
  IoStream* const stream_;
  StagingMap registered_;
  std::vector<StagingRegion> registered_list_;
  uint8_t* gpu_base_ = nullptr;
  uint64_t gpu_bytes_ = 0;

  absl::Mutex mu_;
  // Scratch, reused across calls.
  std::vector<uint32_t> staged_ ABSL_GUARDED_BY(mu_);
  std::vector<engine::CopyOp> direct_ ABSL_GUARDED_BY(mu_);
  std::vector<Run> runs_ ABSL_GUARDED_BY(mu_);
  std::vector<engine::CopyOp> round_ops_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_LAYER_COPIER_H_

// Internal to bench/nvme_gpu: the GPU-initiated read kernel's parameters and its launch.
// gpu_queue.h is the public interface; this header is plain C++ and CUDA's runtime types only, so
// nvcc compiles the kernel without Abseil.
//
// One launch runs a whole read plan on one NVMe I/O queue pair, in one CTA: thread 0 is the
// queue's owner (it builds SQEs with queue.h from the bounce ring's prebuilt RegionDescriptor,
// rings the SQ doorbell, polls the CQ by phase bit and rings the CQ doorbell); every thread of the
// CTA scatters each landed I/O from its bounce slot into the engine's device memory; thread 0 then
// writes the layer's ready word when the layer's last I/O has landed and none of it failed.
//
// The CID of a command is its bounce slot, so completions may come in any order. The kernel gives
// up when no completion arrives for `timeout_ns` while commands are in flight: it marks those
// I/Os kGpuIoTimedOut (their CIDs in the results), the ones it never submitted kGpuIoNotSubmitted,
// writes the ring indices back to `state` and returns; the host then recovers the queue (Abort or
// reset through the CPU controller). The GPU only writes the doorbells, never reads them.
#ifndef TUTTI_BENCH_NVME_GPU_GPU_READ_KERNEL_H_
#define TUTTI_BENCH_NVME_GPU_GPU_READ_KERNEL_H_

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "bench/nvme_gpu/plan_types.h"
#include "daemon/io/nvme/queue.h"

namespace tutti::io::nvme::gpu {

struct GpuReadParams {
  // The queue pair, as device pointers: rings in host DMA memory, doorbells host-mapped words
  // (or BAR0 registered as I/O memory).
  Sqe* sq = nullptr;
  Cqe* cq = nullptr;
  volatile uint32_t* sq_doorbell = nullptr;
  volatile uint32_t* cq_doorbell = nullptr;
  uint32_t depth = 0;
  uint16_t qid = 0;
  uint32_t nsid = 1;
  uint32_t lba_shift = 12;
  // The bounce ring: slots x slot_bytes of DMA memory, `bounce` as the controller addresses it,
  // `bounce_data` as the GPU does. slots <= min(kMaxGpuSlots, depth - 1).
  RegionDescriptor bounce;
  const uint8_t* bounce_data = nullptr;
  uint32_t slots = 0;
  uint32_t slot_bytes = 0;
  // The plan (device memory).
  const GpuReadIo* ios = nullptr;
  uint32_t num_ios = 0;
  const GpuPiece* pieces = nullptr;
  // Per layer: I/Os still to land, and a failed flag (device memory, filled by the host).
  uint32_t* layer_remaining = nullptr;
  uint32_t* layer_failed = nullptr;
  uint32_t num_layers = 0;
  // Destination (device memory) and the ready words (device memory, word l for layer l; null:
  // none are written).
  uint8_t* engine = nullptr;
  uint32_t* ready_words = nullptr;
  uint32_t ticket = 0;
  // Results (host-mapped).
  GpuIoResult* results = nullptr;
  GpuRingState* state = nullptr;
  GpuReadSummary* summary = nullptr;
  uint64_t timeout_ns = 0;
  uint32_t threads = 256;  // CTA size, a multiple of 32, at most 1024
};

// Enqueues the read kernel on `stream`; returns the launch's error (cudaSuccess once enqueued).
cudaError_t LaunchGpuRead(const GpuReadParams& params, cudaStream_t stream);

}  // namespace tutti::io::nvme::gpu

#endif  // TUTTI_BENCH_NVME_GPU_GPU_READ_KERNEL_H_

// The scatter/gather copy kernel: copies many equal-sized objects between arbitrary device
// addresses (device memory, or pinned host memory mapped into the device's address space) in as
// few launches as possible.
//
// The descriptors travel as kernel parameters (up to kMaxDescsPerLaunch per launch, 32 KiB of
// parameters, which Hopper-class GPUs and CUDA 12.1+ allow), so an enqueue allocates nothing and
// the caller's descriptor array may be reused as soon as the launch call returns.
//
// Each CTA takes objects i = blockIdx.x, blockIdx.x + gridDim.x, ...; its threads move an object in
// 16-byte vectors, several loads in flight per thread before the stores.
//
// Thread-safety: LaunchCopyObjects may be called from any thread; launches on one stream run in
// the order they were enqueued.
#ifndef TUTTI_GPU_COPY_KERNEL_H_
#define TUTTI_GPU_COPY_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/copy_desc.h"

namespace tutti::gpu {

// Descriptors per launch (sizeof(CopyDesc) * this + 8 <= 32764 bytes of kernel parameters).
inline constexpr uint32_t kMaxDescsPerLaunch = 2040;
// Threads per CTA.
inline constexpr uint32_t kCopyThreads = 256;

// Enqueues on `stream` copies of `count` objects of `object_len` bytes, with at most `ctas` CTAs
// per launch (ceil(count / kMaxDescsPerLaunch) launches). Returns the first launch error
// (cudaSuccess when all were enqueued); nothing is enqueued after an error. Clears the thread's
// runtime last-error state first (a sticky error is still reported). Preconditions: every
// address and object_len are multiples of kCopyAlign, ctas > 0, the ranges do not overlap, and the
// memory stays valid until the copies have run.
cudaError_t LaunchCopyObjects(const CopyDesc* descs, size_t count, uint32_t object_len,
                              uint32_t ctas, cudaStream_t stream);

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_COPY_KERNEL_H_

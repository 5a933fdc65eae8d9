// A kernel that keeps writing a buffer for a given time: stands in for a long transfer into an
// engine's memory (owner-death experiments) or for an engine keeping SMs busy.
#ifndef TUTTI_GPU_TESTING_BUSY_KERNEL_H_
#define TUTTI_GPU_TESTING_BUSY_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tutti::gpu::testing {

// Enqueues a kernel of `ctas` CTAs that rewrites [dst, dst + bytes) (16-byte aligned, bytes a
// multiple of 16) over and over until `nanoseconds` have passed on the GPU's global timer; word
// 0 of each 16-byte vector holds the pass number. Returns the launch error.
cudaError_t LaunchWriteFor(void* dst, size_t bytes, uint64_t nanoseconds, uint32_t ctas,
                           cudaStream_t stream);

// Enqueues a compute-bound kernel (FMA chains in registers, no memory traffic but one store) of
// `ctas` CTAs of 256 threads, `iters` iterations each: stands in for an engine's prefill.
// `sink` (one float of device memory) receives a value the compiler cannot drop.
cudaError_t LaunchCompute(float* sink, uint32_t iters, uint32_t ctas, cudaStream_t stream);

}  // namespace tutti::gpu::testing

#endif  // TUTTI_GPU_TESTING_BUSY_KERNEL_H_

#include "gpu/testing/busy_kernel.h"

namespace tutti::gpu::testing {
namespace {

__device__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void WriteForKernel(uint4* dst, size_t vecs, uint64_t nanoseconds) {
  const uint64_t start = GlobalTimer();
  uint32_t pass = 1;
  do {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < vecs; i += gridDim.x * blockDim.x) {
      dst[i] = make_uint4(pass, static_cast<uint32_t>(i), 0x600d600d, 0);
    }
    ++pass;
  } while (GlobalTimer() - start < nanoseconds);
}

__global__ void ComputeKernel(float* sink, uint32_t iters) {
  float a = threadIdx.x * 1e-3f, b = blockIdx.x * 1e-3f, c = 1.0f, d = 0.5f;
  for (uint32_t i = 0; i < iters; ++i) {
    a = fmaf(a, 0.999999f, 1e-6f);
    b = fmaf(b, 0.999998f, 2e-6f);
    c = fmaf(c, 0.999997f, 3e-6f);
    d = fmaf(d, 0.999996f, 4e-6f);
  }
  if (a + b + c + d == -1.0f) *sink = a;  // never true; keeps the chains alive
}

}  // namespace

cudaError_t LaunchCompute(float* sink, uint32_t iters, uint32_t ctas, cudaStream_t stream) {
  cudaGetLastError();
  ComputeKernel<<<ctas, 256, 0, stream>>>(sink, iters);
  return cudaGetLastError();
}

cudaError_t LaunchWriteFor(void* dst, size_t bytes, uint64_t nanoseconds, uint32_t ctas,
                           cudaStream_t stream) {
  cudaGetLastError();  // clear errors of earlier calls (see copy_kernel.cu)
  WriteForKernel<<<ctas, 256, 0, stream>>>(static_cast<uint4*>(dst), bytes / 16, nanoseconds);
  return cudaGetLastError();
}

}  // namespace tutti::gpu::testing

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

}  // namespace

cudaError_t LaunchWriteFor(void* dst, size_t bytes, uint64_t nanoseconds, uint32_t ctas,
                           cudaStream_t stream) {
  cudaGetLastError();  // clear errors of earlier calls (see copy_kernel.cu)
  WriteForKernel<<<ctas, 256, 0, stream>>>(static_cast<uint4*>(dst), bytes / 16, nanoseconds);
  return cudaGetLastError();
}

}  // namespace tutti::gpu::testing

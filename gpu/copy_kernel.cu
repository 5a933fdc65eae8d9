#include "gpu/copy_kernel.h"

namespace tutti::gpu {
namespace {

struct CopyBatch {
  uint32_t count;
  uint32_t vecs_per_object;
  CopyDesc descs[kMaxDescsPerLaunch];
};
static_assert(sizeof(CopyBatch) <= 32764, "kernel parameters are limited to 32764 bytes");

// Vectors per thread kept in flight: 256 threads x 8 x 16 B = one 32 KiB object per pass.
constexpr int kUnroll = 8;

__global__ void __launch_bounds__(kCopyThreads)
    CopyObjectsKernel(const __grid_constant__ CopyBatch batch) {
  const uint32_t vecs = batch.vecs_per_object;
  for (uint32_t i = blockIdx.x; i < batch.count; i += gridDim.x) {
    const uint4* __restrict__ src = static_cast<const uint4*>(batch.descs[i].src);
    uint4* __restrict__ dst = static_cast<uint4*>(batch.descs[i].dst);
    for (uint32_t base = threadIdx.x; base < vecs; base += kCopyThreads * kUnroll) {
      uint4 r[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const uint32_t v = base + k * kCopyThreads;
        if (v < vecs) r[k] = __ldcs(src + v);  // streamed: each source byte is read once
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const uint32_t v = base + k * kCopyThreads;
        if (v < vecs) dst[v] = r[k];
      }
    }
  }
}

}  // namespace

cudaError_t LaunchCopyObjects(const CopyDesc* descs, size_t count, uint32_t object_len,
                              uint32_t ctas, cudaStream_t stream) {
  // 32 KiB: too large for some thread stacks; the launch copies it, so one per thread suffices.
  static thread_local CopyBatch batch;
  batch.vecs_per_object = object_len / kCopyAlign;
  // A launch reports errors through cudaGetLastError(), which also returns errors left by any
  // earlier runtime call of this thread: clear those first so they are not taken for ours.
  cudaError_t stale = cudaGetLastError();
  (void)stale;
  for (size_t done = 0; done < count;) {
    const uint32_t n = static_cast<uint32_t>(
        count - done < kMaxDescsPerLaunch ? count - done : kMaxDescsPerLaunch);
    batch.count = n;
    for (uint32_t i = 0; i < n; ++i) batch.descs[i] = descs[done + i];
    const uint32_t grid = n < ctas ? n : ctas;
    CopyObjectsKernel<<<grid, kCopyThreads, 0, stream>>>(batch);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    done += n;
  }
  return cudaSuccess;
}

}  // namespace tutti::gpu

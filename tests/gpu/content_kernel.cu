#include "tests/gpu/content_kernel.h"

namespace tutti::gputest {
namespace {

constexpr uint32_t kThreads = 256;

__device__ __forceinline__ uint64_t Word(uint64_t seed, uint64_t tag, uint64_t i) {
  uint64_t z = seed ^ (tag * 0x9e3779b97f4a7c15ull) ^ (i * 0xd1b54a32d192ed03ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void FillKernel(const ObjectRef* refs, uint32_t count, uint32_t words, uint64_t seed) {
  for (uint32_t o = blockIdx.x; o < count; o += gridDim.x) {
    uint64_t* p = static_cast<uint64_t*>(refs[o].ptr);
    const uint64_t tag = refs[o].tag;
    for (uint32_t i = threadIdx.x; i < words; i += kThreads) p[i] = Word(seed, tag, i);
  }
}

__global__ void CheckKernel(const ObjectRef* refs, uint32_t count, uint32_t words, uint64_t seed,
                            unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (uint32_t o = blockIdx.x; o < count; o += gridDim.x) {
    const uint64_t* p = static_cast<const uint64_t*>(refs[o].ptr);
    const uint64_t tag = refs[o].tag;
    for (uint32_t i = threadIdx.x; i < words; i += kThreads) bad += p[i] != Word(seed, tag, i);
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

uint32_t Grid(uint32_t count) { return count < 1024 ? count : 1024; }

}  // namespace

cudaError_t LaunchFillObjects(const ObjectRef* refs, uint32_t count, uint32_t object_len,
                              uint64_t seed, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  (void)cudaGetLastError();
  FillKernel<<<Grid(count), kThreads, 0, stream>>>(refs, count, object_len / 8, seed);
  return cudaGetLastError();
}

cudaError_t LaunchCountMismatches(const ObjectRef* refs, uint32_t count, uint32_t object_len,
                                  uint64_t seed, unsigned long long* mismatches,
                                  cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  (void)cudaGetLastError();
  CheckKernel<<<Grid(count), kThreads, 0, stream>>>(refs, count, object_len / 8, seed, mismatches);
  return cudaGetLastError();
}

}  // namespace tutti::gputest

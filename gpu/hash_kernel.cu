#include "gpu/hash_kernel.h"

namespace tutti::gpu {
namespace {

constexpr uint32_t kThreads = 256;
constexpr uint32_t kStripe = 64;
constexpr uint32_t kBlockLen = 1024;  // 16 stripes: (secret 192 - stripe 64) / 8
constexpr uint32_t kMaxBlocks = kMaxGpuHashLen / kBlockLen;
constexpr uint32_t kLastAccStart = 7;
constexpr uint32_t kMergeAccsStart = 11;

constexpr uint64_t kPrime32_1 = 0x9E3779B1ull;
constexpr uint64_t kPrime32_2 = 0x85EBCA77ull;
constexpr uint64_t kPrime32_3 = 0xC2B2AE3Dull;
constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ull;
constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ull;

__device__ __forceinline__ uint64_t ReadLE64(const uint8_t* p) {  // any alignment
  uint64_t v = 0;
#pragma unroll
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

__device__ __forceinline__ uint64_t Mul32To64(uint64_t x) {
  return (x & 0xFFFFFFFFull) * (x >> 32);
}

__device__ __forceinline__ uint64_t ShuffleXor64(uint64_t v, int mask) {
  const uint32_t lo = __shfl_xor_sync(0xFFFFFFFFu, static_cast<uint32_t>(v), mask);
  const uint32_t hi = __shfl_xor_sync(0xFFFFFFFFu, static_cast<uint32_t>(v >> 32), mask);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

__device__ __forceinline__ uint64_t Mul128Fold64(uint64_t a, uint64_t b) {
  return (a * b) ^ __umul64hi(a, b);
}

__global__ void __launch_bounds__(kThreads)
    HashObjectsKernel(const HashDesc* __restrict__ descs, uint32_t count,
                      const __grid_constant__ Xxh3Secret base, uint64_t* __restrict__ hashes) {
  __shared__ __align__(16) uint8_t secret[kXxh3SecretBytes];
  // Per block and half block (a warp's 8 stripes), per lane: the sum of the stripes'
  // contributions.
  __shared__ uint64_t sums[kMaxBlocks][2][8];
  __shared__ uint64_t accs[8];
  const uint32_t t = threadIdx.x;
  const uint32_t lane_id = t % 32, warp = t / 32;
  for (uint32_t obj = blockIdx.x; obj < count; obj += gridDim.x) {
    const HashDesc d = descs[obj];
    const uint32_t stripes = d.len / kStripe;
    const uint32_t blocks = (stripes + 15) / 16;
    const uint32_t full_blocks = (d.len - 1) / kBlockLen;  // scrambled after
    // The custom secret of the seed: 64-bit words alternately plus and minus the seed.
    if (t < kXxh3SecretBytes / 8) {
      uint64_t w = ReadLE64(base.bytes + 8 * t);
      w = (t % 2 == 0) ? w + d.seed : w - d.seed;
#pragma unroll
      for (int i = 0; i < 8; ++i) secret[8 * t + i] = static_cast<uint8_t>(w >> (8 * i));
    }
    for (uint32_t i = t; i < blocks * 16; i += kThreads) (&sums[0][0][0])[i] = 0;
    __syncthreads();
    const uint4* __restrict__ data = static_cast<const uint4*>(d.data);
    const uint32_t vecs = d.len / 16;
    const uint32_t j = lane_id % 4;  // this thread's lane pair: lanes 2j and 2j + 1
    for (uint32_t base_v = warp * 32; base_v < vecs; base_v += kThreads) {
      const uint32_t v = base_v + lane_id;
      uint64_t c0 = 0, c1 = 0;
      if (v < vecs) {
        const uint4 x = __ldcs(data + v);
        const uint64_t d0 = (static_cast<uint64_t>(x.y) << 32) | x.x;
        const uint64_t d1 = (static_cast<uint64_t>(x.w) << 32) | x.z;
        const uint32_t s = v / 4;
        const uint8_t* key = s == stripes - 1
                                 ? secret + kXxh3SecretBytes - kStripe - kLastAccStart
                                 : secret + (s % 16) * 8;
        uint64_t k0, k1;
        if (s == stripes - 1) {  // the last stripe's key is not 8-byte aligned
          k0 = ReadLE64(key + 16 * j);
          k1 = ReadLE64(key + 16 * j + 8);
        } else {
          const uint2 k = reinterpret_cast<const uint2*>(key)[2 * j];  // 8-byte aligned
          const uint2 kk = reinterpret_cast<const uint2*>(key)[2 * j + 1];
          k0 = (static_cast<uint64_t>(k.y) << 32) | k.x;
          k1 = (static_cast<uint64_t>(kk.y) << 32) | kk.x;
        }
        c0 = d1 + Mul32To64(d0 ^ k0);
        c1 = d0 + Mul32To64(d1 ^ k1);
      }
      // Sum over the warp's 8 stripes (threads with the same lane pair).
#pragma unroll
      for (int m = 4; m < 32; m *= 2) {
        c0 += ShuffleXor64(c0, m);
        c1 += ShuffleXor64(c1, m);
      }
      const uint32_t block = base_v / 64, half = (base_v / 32) % 2;
      if (lane_id < 4 && base_v < vecs) {
        sums[block][half][2 * j] = c0;
        sums[block][half][2 * j + 1] = c1;
      }
    }
    __syncthreads();
    if (t < 8) {
      const uint64_t init[8] = {kPrime32_3, kPrime64_1, kPrime64_2, kPrime64_3,
                                kPrime64_4, kPrime32_2, kPrime64_5, kPrime32_1};
      uint64_t acc = init[t];
      const uint64_t scramble_key = ReadLE64(secret + kXxh3SecretBytes - kStripe + 8 * t);
      for (uint32_t b = 0; b < blocks; ++b) {
        acc += sums[b][0][t] + sums[b][1][t];
        if (b < full_blocks) {
          acc ^= acc >> 47;
          acc ^= scramble_key;
          acc *= kPrime32_1;
        }
      }
      accs[t] = acc;
    }
    __syncthreads();
    if (t == 0) {
      uint64_t h = static_cast<uint64_t>(d.len) * kPrime64_1;
      for (int i = 0; i < 4; ++i) {
        const uint8_t* s = secret + kMergeAccsStart + 16 * i;
        h += Mul128Fold64(accs[2 * i] ^ ReadLE64(s), accs[2 * i + 1] ^ ReadLE64(s + 8));
      }
      h ^= h >> 37;
      h *= 0x165667919E3779F9ull;
      h ^= h >> 32;
      hashes[obj] = h;
    }
    __syncthreads();  // the shared arrays are reused by the next object
  }
}

}  // namespace

cudaError_t LaunchHashObjects(const HashDesc* descs, uint32_t count, const Xxh3Secret& secret,
                              uint64_t* hashes, cudaStream_t stream) {
  cudaError_t stale = cudaGetLastError();
  (void)stale;
  if (count == 0) return cudaSuccess;
  const uint32_t grid = count < 65535 ? count : 65535;
  HashObjectsKernel<<<grid, kThreads, 0, stream>>>(descs, count, secret, hashes);
  return cudaGetLastError();
}

}  // namespace tutti::gpu

// The hash kernel's descriptor and limits (gpu/hash_kernel.h), apart from CUDA: gpu::Device
// (gpu/device.h) and its host implementation take descriptors and build without the toolkit.
//
// Thread-safety: plain data and pure functions.
#ifndef TUTTI_GPU_HASH_DESC_H_
#define TUTTI_GPU_HASH_DESC_H_

#include <cstdint>

namespace tutti::gpu {

inline constexpr uint32_t kMaxGpuHashLen = 256u << 10;
inline constexpr uint32_t kXxh3SecretBytes = 192;

// Lengths the kernel hashes: multiples of 64 in (240, kMaxGpuHashLen]; XXH3 hashes shorter
// inputs another way, which is left to the CPU.
inline bool GpuHashSupports(uint32_t len) {
  return len > 240 && len % 64 == 0 && len <= kMaxGpuHashLen;
}

// One object: `len` bytes at `data` (device-addressable, 16-byte aligned), hashed with `seed`.
struct HashDesc {
  const void* data;
  uint64_t seed;
  uint32_t len;
};

// XXH3's default secret, as libxxhash holds it (XXH3_kSecret); the caller supplies it.
struct Xxh3Secret {
  uint8_t bytes[kXxh3SecretBytes];
};

// The default secret, made once by libxxhash (XXH3_generateSecret_fromSeed with seed 0).
const Xxh3Secret& DefaultXxh3Secret();

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_HASH_DESC_H_

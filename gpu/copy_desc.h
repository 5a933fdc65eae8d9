// The copy kernel's descriptor and alignment (gpu/copy_kernel.h), apart from CUDA: gpu::Device
// (gpu/device.h) and its host implementation take descriptors and build without the toolkit.
//
// Thread-safety: plain data.
#ifndef TUTTI_GPU_COPY_DESC_H_
#define TUTTI_GPU_COPY_DESC_H_

#include <cstdint>

namespace tutti::gpu {

// One object to copy: `object_len` bytes from src to dst (both device-addressable).
struct CopyDesc {
  const void* src;
  void* dst;
};

// Source, destination and object length must be multiples of this.
inline constexpr uint32_t kCopyAlign = 16;

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_COPY_DESC_H_

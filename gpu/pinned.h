// Pinned host staging: host memory page-locked and mapped into the GPU's address space, so DMA
// engines and kernels (the scatter kernel reads it over PCIe) reach it directly.
//
// Staging is registered once at start-up (registration costs about a millisecond per hundred MiB
// and must never happen on the I/O path).
//
// Thread-safety: a PinnedRegion is immutable after creation; its accessors may be used from any
// thread. Destroy it only when no copy that uses it is still in flight.
#ifndef TUTTI_GPU_PINNED_H_
#define TUTTI_GPU_PINNED_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "gpu/staging_map.h"

namespace tutti::gpu {

class PinnedRegion {
 public:
  // Page-locks the caller's memory [addr, addr + len) for all devices (cudaHostRegisterPortable |
  // Mapped) and maps it. The memory must outlive the returned region, which unregisters it when
  // destroyed. INVALID_ARGUMENT for a null or empty range or memory already registered;
  // UNAVAILABLE without a usable GPU; RESOURCE_EXHAUSTED when the system cannot pin that much.
  static absl::StatusOr<std::unique_ptr<PinnedRegion>> Register(void* addr, size_t len);

  // Allocates `len` bytes of pinned, mapped host memory (page-aligned, not initialized) that the
  // region owns and frees. Errors as Register.
  static absl::StatusOr<std::unique_ptr<PinnedRegion>> Allocate(size_t len);

  PinnedRegion(const PinnedRegion&) = delete;
  PinnedRegion& operator=(const PinnedRegion&) = delete;
  ~PinnedRegion();

  uint8_t* host() const { return host_; }
  uint8_t* device() const { return device_; }
  size_t size() const { return len_; }
  StagingRegion staging() const { return StagingRegion{host_, len_, device_}; }

 private:
  PinnedRegion(uint8_t* host, size_t len, uint8_t* device, bool owned)
      : host_(host), len_(len), device_(device), owned_(owned) {}

  uint8_t* const host_;
  const size_t len_;
  uint8_t* const device_;
  const bool owned_;  // allocated by Allocate (cudaFreeHost) vs registered (cudaHostUnregister)
};

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_PINNED_H_

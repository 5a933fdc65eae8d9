// Staging memory as kernels see it: the host address a copy is described by (CopyOp::staging in
// the daemon) translated to the address the device reaches the same bytes at.
//
// Thread-safety: a StagingMap is immutable once created; ToDevice may be called from any thread.
#ifndef TUTTI_GPU_STAGING_MAP_H_
#define TUTTI_GPU_STAGING_MAP_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tutti::gpu {

// `len` bytes at host address `host` are at `device` in the device's address space (equal for
// registered memory on Hopper; different in general).
struct StagingRegion {
  uint8_t* host = nullptr;
  uint64_t len = 0;
  uint8_t* device = nullptr;
};

// Translates staging host addresses to device addresses.
class StagingMap {
 public:
  // INVALID_ARGUMENT if a region is empty, null, not 16-byte aligned, or overlaps another.
  static absl::StatusOr<StagingMap> Create(absl::Span<const StagingRegion> regions);
  StagingMap() = default;

  // The device address of [host, host + len), or nullptr when that range is not wholly inside
  // one region. With `region`, also which region holds it (an index in host address order).
  // O(log regions).
  uint8_t* ToDevice(const uint8_t* host, uint64_t len, uint32_t* region = nullptr) const;

 private:
  std::vector<StagingRegion> regions_;  // sorted by host address
};

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_STAGING_MAP_H_

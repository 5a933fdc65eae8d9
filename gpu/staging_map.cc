#include "gpu/staging_map.h"

#include <algorithm>

#include "absl/status/status.h"
#include "gpu/copy_kernel.h"

namespace tutti::gpu {
namespace {

bool Aligned(uint64_t v) { return v % kCopyAlign == 0; }

}  // namespace

absl::StatusOr<StagingMap> StagingMap::Create(absl::Span<const StagingRegion> regions) {
  StagingMap map;
  map.regions_.assign(regions.begin(), regions.end());
  std::sort(map.regions_.begin(), map.regions_.end(),
            [](const StagingRegion& a, const StagingRegion& b) { return a.host < b.host; });
  for (size_t i = 0; i < map.regions_.size(); ++i) {
    const StagingRegion& r = map.regions_[i];
    if (r.host == nullptr || r.device == nullptr || r.len == 0) {
      return absl::InvalidArgumentError("empty or null staging region");
    }
    if (!Aligned(reinterpret_cast<uintptr_t>(r.host)) ||
        !Aligned(reinterpret_cast<uintptr_t>(r.device))) {
      return absl::InvalidArgumentError("staging region not 16-byte aligned");
    }
    if (i > 0) {
      const StagingRegion& prev = map.regions_[i - 1];
      if (static_cast<uint64_t>(r.host - prev.host) < prev.len) {
        return absl::InvalidArgumentError("staging regions overlap");
      }
    }
  }
  return map;
}

uint8_t* StagingMap::ToDevice(const uint8_t* host, uint64_t len, uint32_t* region) const {
  auto it = std::upper_bound(regions_.begin(), regions_.end(), host,
                             [](const uint8_t* h, const StagingRegion& r) { return h < r.host; });
  if (it == regions_.begin()) return nullptr;
  const StagingRegion& r = *(it - 1);
  const uint64_t off = static_cast<uint64_t>(host - r.host);
  if (off > r.len || len > r.len - off) return nullptr;
  if (region != nullptr) *region = static_cast<uint32_t>(it - 1 - regions_.begin());
  return r.device + off;
}

}  // namespace tutti::gpu

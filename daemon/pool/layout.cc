#include "daemon/pool/layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tutti::pool {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
uint64_t DivUp(uint64_t v, uint64_t d) { return (v + d - 1) / d; }

// The size of one file of a pool of `extents` extents with G = `g`.
uint64_t FileBytesFor(uint64_t extents, uint32_t g, uint32_t object_bytes, uint32_t max_objects) {
  const uint64_t headers = extents * g;  // per file: S / D
  return RoundUp(kSuperblockBytes + headers * kSlotHeaderBytes, kFrameAreaAlign) +
         extents * g * max_objects * uint64_t{object_bytes};
}

// The most extents with G = `g` whose file fits in `per_file_cap`.
uint64_t MaxExtents(uint64_t per_file_cap, uint32_t g, uint32_t object_bytes,
                    uint32_t max_objects) {
  const uint64_t per_extent = uint64_t{g} * max_objects * object_bytes;  // frame bytes per file
  auto bytes = [&](uint64_t x) { return FileBytesFor(x, g, object_bytes, max_objects); };
  // Start from an upper bound and step down; a step never exceeds what is left (the header area
  // alone can outgrow a small per-file capacity, which would wrap the count around).
  uint64_t x = per_file_cap / per_extent;
  while (x > 0 && bytes(x) > per_file_cap) {
    const uint64_t step = DivUp(bytes(x) - per_file_cap, per_extent);
    x -= std::min(x, std::max<uint64_t>(1, step));
  }
  // A step can overshoot when dropping extents also shrinks the header area by a 1 MiB rounding
  // step: climb back to the largest count that fits (bytes() is non-decreasing).
  while (bytes(x + 1) <= per_file_cap) ++x;
  return x;
}

absl::Status CheckArguments(uint32_t num_files, uint32_t object_bytes, uint32_t max_objects,
                            uint32_t extent_slots) {
  if (object_bytes == 0 || object_bytes % kBlockAlign != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool.object_bytes must be a positive multiple of 4096, got ", object_bytes));
  }
  if (max_objects == 0 || max_objects > kMaxObjectsPerSlot) {
    return absl::InvalidArgumentError(absl::StrCat("pool.max_objects must be in [1, ",
                                                   kMaxObjectsPerSlot, "], got ", max_objects));
  }
  if (extent_slots > kMaxExtentSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool.extent_slots must be in [0, ", kMaxExtentSlots, "], got ", extent_slots));
  }
  if (num_files == 0) return absl::InvalidArgumentError("pool.dirs: at least one directory");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PoolLayout> PoolLayout::Compute(uint64_t capacity_bytes, uint32_t num_files,
                                               uint32_t object_bytes, uint32_t max_objects,
                                               uint32_t extent_slots) {
  if (absl::Status s = CheckArguments(num_files, object_bytes, max_objects, extent_slots);
      !s.ok()) {
    return s;
  }
  const uint64_t per_file_cap = capacity_bytes / num_files;
  uint32_t g = extent_slots != 0
                   ? extent_slots
                   : static_cast<uint32_t>(std::max<uint64_t>(1, kAutoExtentBytes / object_bytes));
  uint64_t extents = MaxExtents(per_file_cap, g, object_bytes, max_objects);
  while (g > 1 && extents < kMinExtents) {
    --g;
    extents = MaxExtents(per_file_cap, g, object_bytes, max_objects);
  }
  if (extents == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool.capacity_bytes=", capacity_bytes, " holds no slot of ", max_objects,
                     " x ", object_bytes, " bytes over ", num_files, " files; raise it"));
  }
  PoolLayout l;
  l.num_files_ = num_files;
  l.object_bytes_ = object_bytes;
  l.max_objects_ = max_objects;
  l.extent_slots_ = g;
  l.num_slots_ = extents * g * num_files;
  l.frame_area_offset_ =
      RoundUp(kSuperblockBytes + extents * g * kSlotHeaderBytes, kFrameAreaAlign);
  l.file_bytes_ = FileBytesFor(extents, g, object_bytes, max_objects);
  return l;
}

uint64_t PoolLayout::slot_bytes() const {
  return uint64_t{max_objects_} * object_bytes_ + kSlotHeaderBytes;
}

Location PoolLayout::ObjectLocation(uint64_t slot, uint32_t object) const {
  const uint64_t g_slots = extent_slots_;
  const uint64_t extent = slot / slots_per_extent();
  const uint64_t in_extent = slot % slots_per_extent();
  const uint64_t group = in_extent / g_slots;
  const uint64_t pos = in_extent % g_slots;
  const uint32_t file = static_cast<uint32_t>((group + object) % num_files_);
  const uint64_t frame = extent * max_objects_ * g_slots + object * g_slots + pos;
  return {file, frame_area_offset_ + frame * object_bytes_};
}

Location PoolLayout::HeaderLocation(uint64_t slot) const {
  return {static_cast<uint32_t>(slot % num_files_),
          kSuperblockBytes + (slot / num_files_) * kSlotHeaderBytes};
}

}  // namespace tutti::pool

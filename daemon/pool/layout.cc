#include "daemon/pool/layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tutti::pool {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
uint64_t DivUp(uint64_t v, uint64_t d) { return (v + d - 1) / d; }

}  // namespace

absl::StatusOr<PoolLayout> PoolLayout::Compute(uint64_t capacity_bytes, uint32_t num_files,
                                               uint32_t object_bytes, uint32_t max_objects) {
  if (object_bytes == 0 || object_bytes % kBlockAlign != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool.object_bytes must be a positive multiple of 4096, got ", object_bytes));
  }
  if (max_objects == 0 || max_objects > kMaxObjectsPerSlot) {
    return absl::InvalidArgumentError(absl::StrCat("pool.max_objects must be in [1, ",
                                                   kMaxObjectsPerSlot, "], got ", max_objects));
  }
  if (num_files == 0) return absl::InvalidArgumentError("pool.dirs: at least one directory");
  PoolLayout l;
  l.num_files_ = num_files;
  l.object_bytes_ = object_bytes;
  l.max_objects_ = max_objects;
  l.frames_per_slot_per_file_ = static_cast<uint32_t>(DivUp(max_objects, num_files));
  // Every slot reserves frames_per_slot_per_file_ frames in every file.
  const uint64_t per_slot_per_file = uint64_t{l.frames_per_slot_per_file_} * object_bytes;
  const uint64_t per_file_cap = capacity_bytes / num_files;
  auto file_bytes_for = [&](uint64_t slots) {
    return RoundUp(kSuperblockBytes + DivUp(slots, num_files) * kSlotHeaderBytes, kFrameAreaAlign) +
           slots * per_slot_per_file;
  };
  // Start from an upper bound and step down; a step never exceeds what is left (the header area
  // alone can outgrow a small per-file capacity, which would wrap the count around).
  uint64_t slots = per_file_cap / per_slot_per_file;
  while (slots > 0 && file_bytes_for(slots) > per_file_cap) {
    const uint64_t step = DivUp(file_bytes_for(slots) - per_file_cap, per_slot_per_file);
    slots -= std::min(slots, std::max<uint64_t>(1, step));
  }
  // A step can overshoot when dropping slots also shrinks the header area by a 1 MiB rounding
  // step: climb back to the largest count that fits (file_bytes_for is non-decreasing).
  while (file_bytes_for(slots + 1) <= per_file_cap) ++slots;
  if (slots == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool.capacity_bytes=", capacity_bytes, " holds no slot of ", max_objects,
                     " x ", object_bytes, " bytes over ", num_files, " files; raise it"));
  }
  l.num_slots_ = slots;
  l.headers_per_file_ = DivUp(slots, num_files);
  l.frame_area_offset_ =
      RoundUp(kSuperblockBytes + l.headers_per_file_ * kSlotHeaderBytes, kFrameAreaAlign);
  l.file_bytes_ = file_bytes_for(slots);
  return l;
}

uint64_t PoolLayout::slot_bytes() const {
  return uint64_t{frames_per_slot_per_file_} * num_files_ * object_bytes_ + kSlotHeaderBytes;
}

Location PoolLayout::ObjectLocation(uint64_t slot, uint32_t object) const {
  const uint32_t file = static_cast<uint32_t>((slot + object) % num_files_);
  const uint64_t frame = slot * frames_per_slot_per_file_ + object / num_files_;
  return {file, frame_area_offset_ + frame * object_bytes_};
}

Location PoolLayout::HeaderLocation(uint64_t slot) const {
  return {static_cast<uint32_t>(slot % num_files_),
          kSuperblockBytes + (slot / num_files_) * kSlotHeaderBytes};
}

}  // namespace tutti::pool

// The on-SSD layout of the GPU file pool: where each slot's header and objects live.
// The format is documented in daemon/pool/FORMAT.md; keep the two in step.
//
// A pool is D files (one per directory, one directory per SSD), each of the same size:
//   [superblock: 4 KiB][slot headers: ceil(slots / D) x 4 KiB, padded to 1 MiB][frames]
// Slot s has M = max_objects objects, each in a frame of object_bytes; every slot reserves
// F = ceil(M / D) frames in every file. Tensor-Stripe: object j of
// slot s is in file (s + j) % D, frame s * F + j / D of that file's frame
// area, so the objects of one layer over consecutive slots spread over every file. The header of
// slot s is in file s % D, header index s / D.
//
// Thread-safety: immutable after construction; safe to share.
#ifndef TUTTI_DAEMON_POOL_LAYOUT_H_
#define TUTTI_DAEMON_POOL_LAYOUT_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace tutti::pool {

inline constexpr uint64_t kBlockAlign = 4096;
inline constexpr uint64_t kSuperblockBytes = 4096;
inline constexpr uint64_t kSlotHeaderBytes = 4096;
inline constexpr uint64_t kFrameAreaAlign = 1 << 20;
// A slot header holds 64 fixed bytes and one 8-byte checksum per object.
inline constexpr uint32_t kMaxObjectsPerSlot = 496;

struct Location {
  uint32_t file;
  uint64_t offset;  // bytes from the start of the file
};

class PoolLayout {
 public:
  // Computes the largest pool of `num_files` equal files whose total size is at most
  // `capacity_bytes`. INVALID_ARGUMENT (naming the field) if object_bytes is not a positive
  // multiple of 4096, max_objects is outside [1, kMaxObjectsPerSlot], num_files is 0, or the
  // capacity holds no slot at all.
  static absl::StatusOr<PoolLayout> Compute(uint64_t capacity_bytes, uint32_t num_files,
                                            uint32_t object_bytes, uint32_t max_objects);

  uint32_t num_files() const { return num_files_; }
  uint64_t num_slots() const { return num_slots_; }
  uint32_t object_bytes() const { return object_bytes_; }
  uint32_t max_objects() const { return max_objects_; }
  uint64_t file_bytes() const { return file_bytes_; }
  // F: frames every slot reserves in every file. Objects j, j + D, j + 2D, ... of a slot are
  // consecutive frames of one file, so they can move in one transfer.
  uint32_t frames_per_slot_per_file() const { return frames_per_slot_per_file_; }
  // Disk bytes one slot takes (objects and header), for capacity accounting.
  uint64_t slot_bytes() const;

  // Preconditions: slot < num_slots(), object < max_objects().
  Location ObjectLocation(uint64_t slot, uint32_t object) const;
  Location HeaderLocation(uint64_t slot) const;

 private:
  uint32_t num_files_ = 0;
  uint32_t object_bytes_ = 0;
  uint32_t max_objects_ = 0;
  uint64_t num_slots_ = 0;
  uint32_t frames_per_slot_per_file_ = 0;  // ceil(max_objects / num_files)
  uint64_t headers_per_file_ = 0;          // ceil(num_slots / num_files)
  uint64_t frame_area_offset_ = 0;
  uint64_t file_bytes_ = 0;
};

}  // namespace tutti::pool

#endif  // TUTTI_DAEMON_POOL_LAYOUT_H_

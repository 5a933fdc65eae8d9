// The on-SSD layout of the GPU file pool: where each slot's header and objects live.
// The format (version 2, "Tensor-Stripe with extents") is documented in daemon/pool/FORMAT.md;
// keep the two in step.
//
// A pool is D files (one per directory, one directory per SSD), each of the same size:
//   [superblock: 4 KiB][slot headers: S / D x 4 KiB, padded to 1 MiB][frames]
// Slots come in extents of E = G x D slots (G = extent slots per file); S is a multiple of E.
// Slot s has M = max_objects objects, each in a frame of object_bytes. With e = s / E,
// i = s % E, group g = i / G and pos = i % G, object j of slot s is in file (g + j) % D, frame
// e * (M * G) + j * G + pos of that file's frame area. So object j (one layer's K, say) of the G
// slots of one group are G adjacent frames of one file, and the objects of one slot go
// round-robin over the files. Every file holds M * G frames per extent, all of them used. The
// header of slot s is in file s % D, header index s / D.
// With G = 1 and D = 1, object j of slot s is frame s * M + j: format 1's layout of one file.
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
// The largest configurable G (pool.extent_slots).
inline constexpr uint32_t kMaxExtentSlots = 4096;
// G = 0 asks for as many slots as fill this many bytes of one object index: 1 MiB reads.
inline constexpr uint64_t kAutoExtentBytes = 1 << 20;
// G is lowered (down to 1) until the pool holds at least this many extents: whole extents only,
// so a pool of fewer would leave up to 1 / kMinExtents of its capacity unused.
inline constexpr uint64_t kMinExtents = 8;

struct Location {
  uint32_t file;
  uint64_t offset;  // bytes from the start of the file
};

class PoolLayout {
 public:
  // Computes the largest pool of `num_files` equal files whose total size is at most
  // `capacity_bytes`, made of whole extents. `extent_slots` is the wanted G: 0 means
  // max(1, kAutoExtentBytes / object_bytes). The G used (extent_slots()) is the largest value
  // not above the wanted one that gives at least kMinExtents extents, or 1 if none does.
  // INVALID_ARGUMENT (naming the field) if object_bytes is not a positive multiple of 4096,
  // max_objects is outside [1, kMaxObjectsPerSlot], extent_slots is above kMaxExtentSlots,
  // num_files is 0, or the capacity holds no extent even with G = 1.
  static absl::StatusOr<PoolLayout> Compute(uint64_t capacity_bytes, uint32_t num_files,
                                            uint32_t object_bytes, uint32_t max_objects,
                                            uint32_t extent_slots = 0);

  uint32_t num_files() const { return num_files_; }
  uint64_t num_slots() const { return num_slots_; }
  uint32_t object_bytes() const { return object_bytes_; }
  uint32_t max_objects() const { return max_objects_; }
  uint64_t file_bytes() const { return file_bytes_; }
  // G: slots of one group, whose object j lie in G adjacent frames of one file.
  uint32_t extent_slots() const { return extent_slots_; }
  // E = G x D: slots of one extent; num_slots() = num_extents() x E.
  uint64_t slots_per_extent() const { return uint64_t{extent_slots_} * num_files_; }
  uint64_t num_extents() const { return num_slots_ / slots_per_extent(); }
  // Disk bytes one slot takes (objects and header), for capacity accounting.
  uint64_t slot_bytes() const;

  // Preconditions: slot < num_slots(), object < max_objects().
  Location ObjectLocation(uint64_t slot, uint32_t object) const;
  Location HeaderLocation(uint64_t slot) const;

 private:
  uint32_t num_files_ = 0;
  uint32_t object_bytes_ = 0;
  uint32_t max_objects_ = 0;
  uint32_t extent_slots_ = 0;
  uint64_t num_slots_ = 0;
  uint64_t frame_area_offset_ = 0;
  uint64_t file_bytes_ = 0;
};

}  // namespace tutti::pool

#endif  // TUTTI_DAEMON_POOL_LAYOUT_H_

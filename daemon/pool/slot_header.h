// The 4 KiB header stored with every slot, and the per-object checksum.
// Format: daemon/pool/FORMAT.md.
#ifndef TUTTI_DAEMON_POOL_SLOT_HEADER_H_
#define TUTTI_DAEMON_POOL_SLOT_HEADER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/types.h"

namespace tutti::pool {

// The seed ObjectChecksum hashes an object's bytes with: XXH3 of its identity. ObjectChecksum is
// XXH3_64bits_withSeed(data, len, ObjectChecksumSeed(...)) (the GPU verifier computes the same).
uint64_t ObjectChecksumSeed(NamespaceId ns, const Key& key, uint64_t epoch, uint32_t object);

// Checksum of one object's bytes, seeded by its identity, so a frame that holds another block's
// object (a torn or reused slot), or another object of the same block, never verifies.
// `len` is the object's used length (the layout's object size), not the frame size.
uint64_t ObjectChecksum(NamespaceId ns, const Key& key, uint64_t epoch, uint32_t object,
                        const void* data, size_t len);

struct SlotHeader {
  NamespaceId ns = 0;
  Key key;
  uint64_t epoch = 0;          // write epoch: given from an increasing counter at capture
  uint32_t object_len = 0;     // used bytes of each object frame
  std::vector<uint64_t> checksums;  // one per object; size() is the object count
};

// Writes `h` into `out` (exactly kSlotHeaderBytes). INVALID_ARGUMENT if it has more than
// kMaxObjectsPerSlot checksums.
absl::Status EncodeSlotHeader(const SlotHeader& h, absl::Span<uint8_t> out);
// Parses a header; DATA_LOSS if the magic, version or its own checksum is wrong (a never-written
// or torn header).
absl::StatusOr<SlotHeader> DecodeSlotHeader(absl::Span<const uint8_t> in);

}  // namespace tutti::pool

#endif  // TUTTI_DAEMON_POOL_SLOT_HEADER_H_

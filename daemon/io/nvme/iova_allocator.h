// IOVA ranges for the vfio DMA allocator (vfio.cc): first fit over [begin, end), freed ranges
// coalesced with their neighbours. Internal to daemon/io/nvme.
//
// Thread-safety: none; vfio.cc guards it with its container's mutex.
#ifndef TUTTI_DAEMON_IO_NVME_IOVA_ALLOCATOR_H_
#define TUTTI_DAEMON_IO_NVME_IOVA_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <optional>

namespace tutti::io::nvme {

class IovaAllocator {
 public:
  // Hands out addresses in [begin, end), each aligned to `alignment` (a power of two).
  IovaAllocator(uint64_t begin, uint64_t end, uint64_t alignment);

  // An aligned range of `size` bytes (rounded up to the alignment), or nullopt when no free range
  // is large enough.
  std::optional<uint64_t> Allocate(uint64_t size);
  // Returns a range Allocate() gave, with the same `size`.
  void Free(uint64_t iova, uint64_t size);
  uint64_t free_bytes() const;

 private:
  uint64_t Round(uint64_t size) const { return (size + alignment_ - 1) & ~(alignment_ - 1); }
  uint64_t alignment_;
  std::map<uint64_t, uint64_t> free_;  // start -> length, disjoint, never adjacent
};

}  // namespace tutti::io::nvme

#endif  // TUTTI_DAEMON_IO_NVME_IOVA_ALLOCATOR_H_

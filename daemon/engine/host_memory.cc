#include "daemon/engine/host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tutti::engine {
namespace {

// Checks and maps one region's descriptor; on error nothing is left mapped (the caller still
// owns the descriptor).
absl::Status MapRegion(size_t index, const HostShmRegion& r, uint8_t** base_out) {
  const std::string what = absl::StrCat("regions[", index, "] (", r.label, ")");
  if (r.size_bytes == 0) return absl::InvalidArgumentError(what + ": size_bytes is 0");
  struct stat st;
  if (fstat(r.fd.get(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": fstat: ", strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        what + ": the descriptor is not shared memory (a regular file: shm_open or memfd_create)");
  }
  const int flags = fcntl(r.fd.get(), F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError(what + ": the descriptor is not open read-write");
  }
  if (static_cast<uint64_t>(st.st_size) < r.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": size_bytes ", r.size_bytes,
                                                   " exceeds the object's size ", st.st_size));
  }
  void* p = mmap(nullptr, r.size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd.get(), 0);
  if (p == MAP_FAILED) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": mmap: ", strerror(errno)));
  }
  *base_out = static_cast<uint8_t*>(p);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostMemory>> HostMemory::Create(
    std::vector<HostShmRegion> regions, const std::vector<ObjectPlacement>& placements,
    uint32_t num_blocks, uint32_t num_objects, uint32_t object_len) {
  if (regions.empty()) return absl::InvalidArgumentError("regions: at least one is needed");
  std::vector<uint64_t> sizes;
  for (const HostShmRegion& r : regions) sizes.push_back(r.size_bytes);
  RETURN_IF_ERROR(ValidatePlacements(sizes, placements, num_blocks, num_objects, object_len));
  RETURN_IF_ERROR(InstallFaultGuard());
  std::vector<Mapping> maps;
  for (size_t i = 0; i < regions.size(); ++i) {
    uint8_t* base = nullptr;
    absl::Status s = MapRegion(i, regions[i], &base);
    if (!s.ok()) {
      UnmapAll(maps);
      return s;
    }
    Mapping m{std::move(regions[i].fd), base, regions[i].size_bytes, regions[i].label, nullptr};
    m.guard = std::make_unique<GuardedRange>(m.base, m.len);
    maps.push_back(std::move(m));
  }
  return std::unique_ptr<HostMemory>(
      new HostMemory(std::move(maps), placements, num_blocks, num_objects, object_len));
}

HostMemory::HostMemory(std::vector<Mapping> maps, std::vector<ObjectPlacement> placements,
                       uint32_t num_blocks, uint32_t num_objects, uint32_t object_len)
    : EngineMemory(num_blocks, num_objects, object_len),
      maps_(std::move(maps)),
      placements_(std::move(placements)) {}

HostMemory::~HostMemory() { UnmapAll(maps_); }

void HostMemory::UnmapAll(const std::vector<Mapping>& maps) {
  for (const Mapping& m : maps) munmap(m.base, m.len);  // the descriptors close with `maps`
}

absl::Status HostMemory::CheckNotShrunk() const {
  for (const Mapping& m : maps_) {
    if (m.guard->faulted()) return ShrankDuringCopy(m);
    struct stat st;
    if (fstat(m.fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < m.len) {
      return absl::FailedPreconditionError(absl::StrCat("shm object ", m.name, " shrank below ",
                                                        m.len,
                                                        " bytes after Attach; detach and attach"));
    }
  }
  return absl::OkStatus();
}

absl::Status HostMemory::ShrankDuringCopy(const Mapping& m) {
  return absl::FailedPreconditionError(
      absl::StrCat("shm object ", m.name, " shrank during a copy (SIGBUS caught); this memory is ",
                   "unusable now: detach and attach"));
}

uint8_t* HostMemory::Address(uint32_t block, uint32_t object, Mapping** mapping) {
  assert(block < num_blocks() && object < num_objects());
  const ObjectPlacement& p = placements_[object];
  *mapping = &maps_[p.region];
  return maps_[p.region].base + p.offset + uint64_t{block} * p.block_stride;
}

absl::Status HostMemory::Scatter(absl::Span<const CopyOp> ops) {
  RETURN_IF_ERROR(CheckNotShrunk());
  for (const CopyOp& op : ops) {
    Mapping* m = nullptr;
    uint8_t* dst = Address(op.block, op.object, &m);
    if (!GuardedCopy(*m->guard, dst, op.staging, object_len())) return ShrankDuringCopy(*m);
  }
  return absl::OkStatus();
}

absl::Status HostMemory::Gather(absl::Span<const CopyOp> ops) {
  RETURN_IF_ERROR(CheckNotShrunk());
  for (const CopyOp& op : ops) {
    Mapping* m = nullptr;
    const uint8_t* src = Address(op.block, op.object, &m);
    if (!GuardedCopy(*m->guard, op.staging, src, object_len())) return ShrankDuringCopy(*m);
  }
  // A fault in one region during this call replaced its pages with zeros after some of the
  // objects above may have been read: only a call that saw no fault anywhere returns its bytes.
  for (const Mapping& m : maps_) {
    if (m.guard->faulted()) return ShrankDuringCopy(m);
  }
  return absl::OkStatus();
}

}  // namespace tutti::engine

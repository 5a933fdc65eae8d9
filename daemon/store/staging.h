// Staging memory: one region allocated at start (page-aligned, never freed
// while the store lives). The DRAM tier takes its region as equal frames
// (FramePool); stores take store staging in bytes, a contiguous run per block,
// counted per owner (StoreStaging); retrieves take theirs as leases
// (daemon/datapath/staging_lease.h). No allocation on the I/O path.
//
// Thread-safe.
#ifndef TUTTI_DAEMON_STORE_STAGING_H_
#define TUTTI_DAEMON_STORE_STAGING_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tutti::store {

class FramePool {
 public:
  // Frames are `frame_bytes` each, inside `region` (which the caller owns and
  // must outlive the pool).
  FramePool(absl::Span<uint8_t> region, uint32_t frame_bytes);

  uint64_t total_frames() const { return total_; }
  uint32_t frame_bytes() const { return frame_bytes_; }

  // Appends `n` frames to `out` and returns true, or returns false and takes
  // none.
  bool TryTake(uint64_t n, std::vector<uint8_t*>* out);
  // Returns frames taken from this pool.
  void Give(absl::Span<uint8_t* const> frames);


 private:
  const uint32_t frame_bytes_;
  uint64_t total_ = 0;
  mutable absl::Mutex mu_;
  std::vector<uint8_t*> frames_ ABSL_GUARDED_BY(mu_);
};

// Store staging, counted in bytes: each grant is one contiguous run of 4 KiB
// pages (first fit), so a block takes what its own objects need, not a whole
// pool slot. Every grant belongs to an owner (a session id; 0 = no owner),
// and an owner other than 0 holds at most `owner_cap_bytes` at a time, so one
// client cannot take all staging from the others.
class StoreStaging {
 public:
  static constexpr uint64_t kPage = 4096;
  enum class Refusal { kNone, kFull, kOwnerLimit };
  struct Grant {
    uint8_t* data = nullptr;  // null when refused
    Refusal refusal = Refusal::kNone;
  };

  // Pages are carved out of `region` (which the caller owns and must outlive
  // the staging); a partial last page is not used.
  StoreStaging(absl::Span<uint8_t> region, uint64_t owner_cap_bytes);

  uint64_t capacity_bytes() const { return pages_ * kPage; }
  uint64_t owner_cap_bytes() const { return owner_cap_; }
  uint64_t used_bytes() const;
  uint64_t owner_bytes(uint64_t owner) const;

  // Whether `bytes` (at most the capacity) are free and `owner` may hold them more now (an owner
  // asking for more than its cap: once it holds nothing). Free bytes need not be one run.
  bool HasRoomFor(uint64_t owner, uint64_t bytes) const;
  // Takes `bytes` (rounded up to whole pages, > 0) as one run for `owner`.
  // Refused (nothing taken) with kOwnerLimit when the owner would hold more
  // than its cap, else with kFull when no free run is long enough.
  Grant TryTake(uint64_t owner, uint64_t bytes);
  // Returns a grant: `data` and `bytes` as given to and returned by TryTake,
  // for the same owner; or any run of whole pages of one.
  void Give(uint64_t owner, uint8_t* data, uint64_t bytes);
  // Gives back `frames` of `frame_bytes` (a 4 KiB multiple) each, parts of grants of `owner`:
  // frames adjacent in memory as one run.
  void GiveFrames(uint64_t owner, absl::Span<uint8_t* const> frames, uint32_t frame_bytes);

 private:
  // First page of a free run of `n` pages, or pages_ when there is none.
  uint64_t FindFree(uint64_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Mark(uint64_t first, uint64_t n, bool used) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint8_t* const base_;
  const uint64_t pages_;
  const uint64_t owner_cap_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> used_bits_ ABSL_GUARDED_BY(mu_);  // bit i: page i taken
  uint64_t used_pages_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t first_maybe_free_ ABSL_GUARDED_BY(mu_) = 0;  // every page below it is taken
  absl::flat_hash_map<uint64_t, uint64_t> owner_bytes_ ABSL_GUARDED_BY(mu_);
};

// The frames of block `lane` of `lanes` blocks of `num_objects` frames of `frame_bytes` that share
// one run of staging at `run`, object-major: object j of block i is frame j x lanes + i, so object
// j of blocks i and i + 1 are adjacent (as object j of consecutive slots of one extent group are
// in a pool file, daemon/pool/layout.h).
std::vector<uint8_t*> InterleavedFrames(uint8_t* run, uint32_t lanes, uint32_t lane,
                                        uint32_t num_objects, uint32_t frame_bytes);

// An anonymous, page-aligned mapping that is unmapped on destruction.
class Region {
 public:
  // Maps `bytes` (rounded up to 2 MiB). RESOURCE_EXHAUSTED if the mapping
  // fails.
  static absl::StatusOr<std::unique_ptr<Region>> Create(uint64_t bytes);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  absl::Span<uint8_t> span() const { return {data_, size_}; }

 private:
  Region(uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_STAGING_H_

// Staging memory: one region allocated at start (page-aligned, never freed
// while the store lives), cut into equal frames and handed out in
// all-or-nothing batches. No allocation on the I/O path.
//
// Thread-safe.
#ifndef TUTTI_DAEMON_STORE_STAGING_H_
#define TUTTI_DAEMON_STORE_STAGING_H_

#include <cstdint>
#include <memory>
#include <vector>

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
  // Like TryTake, but waits until `n` frames are free. Precondition: n <=
  // total_frames().
  void Take(uint64_t n, std::vector<uint8_t*>* out);
  // Returns frames taken from this pool.
  void Give(absl::Span<uint8_t* const> frames);


 private:
  const uint32_t frame_bytes_;
  uint64_t total_ = 0;
  mutable absl::Mutex mu_;
  std::vector<uint8_t*> frames_ ABSL_GUARDED_BY(mu_);
};

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

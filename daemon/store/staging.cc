#include "daemon/store/staging.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tutti::store {

FramePool::FramePool(absl::Span<uint8_t> region, uint32_t frame_bytes) : frame_bytes_(frame_bytes) {
  total_ = region.size() / frame_bytes;
  frames_.reserve(total_);
  for (uint64_t i = total_; i > 0; --i) frames_.push_back(region.data() + (i - 1) * frame_bytes);
}

bool FramePool::TryTake(uint64_t n, std::vector<uint8_t*>* out) {
  absl::MutexLock lock(&mu_);
  if (frames_.size() < n) return false;
  out->insert(out->end(), frames_.end() - n, frames_.end());
  frames_.resize(frames_.size() - n);
  return true;
}

void FramePool::Take(uint64_t n, std::vector<uint8_t*>* out) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return frames_.size() >= n; };
  mu_.Await(absl::Condition(&enough));
  out->insert(out->end(), frames_.end() - n, frames_.end());
  frames_.resize(frames_.size() - n);
}

void FramePool::Give(absl::Span<uint8_t* const> frames) {
  absl::MutexLock lock(&mu_);
  frames_.insert(frames_.end(), frames.begin(), frames.end());
}

absl::StatusOr<std::unique_ptr<Region>> Region::Create(uint64_t bytes) {
  constexpr uint64_t kHuge = 2ull << 20;
  const uint64_t size = std::max<uint64_t>(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
  // Map 2 MiB more than needed and keep a 2 MiB-aligned window, so transparent huge pages can back
  // it: O_DIRECT and DMA over 4 KiB pages cost measurably more (bench/results/io_bench.jsonl).
  void* raw =
      mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", size, " bytes: ", std::strerror(errno)));
  }
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHuge - 1) / kHuge * kHuge;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + size + kHuge;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - aligned - size);
  uint8_t* data = reinterpret_cast<uint8_t*>(aligned);
  madvise(data, size, MADV_HUGEPAGE);  // best effort: THP may be off
  std::memset(data, 0, size);          // fault it in now, not on the I/O path
  return std::unique_ptr<Region>(new Region(data, size));
}

Region::~Region() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace tutti::store

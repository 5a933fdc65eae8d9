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

void FramePool::Give(absl::Span<uint8_t* const> frames) {
  absl::MutexLock lock(&mu_);
  frames_.insert(frames_.end(), frames.begin(), frames.end());
}

StoreStaging::StoreStaging(absl::Span<uint8_t> region, uint64_t owner_cap_bytes)
    : base_(region.data()), pages_(region.size() / kPage), owner_cap_(owner_cap_bytes) {
  used_bits_.assign((pages_ + 63) / 64, 0);
  // Bits past the last page read as taken, so no run crosses the end.
  if (pages_ % 64 != 0) used_bits_.back() = ~0ull << (pages_ % 64);
}

uint64_t StoreStaging::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_pages_ * kPage;
}

uint64_t StoreStaging::owner_bytes(uint64_t owner) const {
  absl::MutexLock lock(&mu_);
  auto it = owner_bytes_.find(owner);
  return it == owner_bytes_.end() ? 0 : it->second;
}

bool StoreStaging::HasRoomFor(uint64_t owner, uint64_t bytes) const {
  const uint64_t n = std::min((bytes + kPage - 1) / kPage, pages_);
  absl::MutexLock lock(&mu_);
  if (used_pages_ + n > pages_) return false;
  if (owner == 0) return true;
  auto it = owner_bytes_.find(owner);
  const uint64_t held = it == owner_bytes_.end() ? 0 : it->second;
  return held == 0 || held + n * kPage <= owner_cap_;
}

StoreStaging::Grant StoreStaging::TryTake(uint64_t owner, uint64_t bytes) {
  const uint64_t n = (bytes + kPage - 1) / kPage;
  absl::MutexLock lock(&mu_);
  if (owner != 0) {
    auto it = owner_bytes_.find(owner);
    const uint64_t held = it == owner_bytes_.end() ? 0 : it->second;
    if (held + n * kPage > owner_cap_) return Grant{nullptr, Refusal::kOwnerLimit};
  }
  const uint64_t first = used_pages_ + n > pages_ ? pages_ : FindFree(n);
  if (first == pages_) return Grant{nullptr, Refusal::kFull};
  Mark(first, n, true);
  used_pages_ += n;
  if (first == first_maybe_free_) first_maybe_free_ = first + n;
  if (owner != 0) owner_bytes_[owner] += n * kPage;
  return Grant{base_ + first * kPage, Refusal::kNone};
}

void StoreStaging::Give(uint64_t owner, uint8_t* data, uint64_t bytes) {
  const uint64_t n = (bytes + kPage - 1) / kPage;
  absl::MutexLock lock(&mu_);
  const uint64_t first = static_cast<uint64_t>(data - base_) / kPage;
  Mark(first, n, false);
  used_pages_ -= n;
  first_maybe_free_ = std::min(first_maybe_free_, first);
  if (owner == 0) return;
  auto it = owner_bytes_.find(owner);
  it->second -= n * kPage;
  if (it->second == 0) owner_bytes_.erase(it);
}

void StoreStaging::GiveFrames(uint64_t owner, absl::Span<uint8_t* const> frames,
                              uint32_t frame_bytes) {
  std::vector<uint8_t*> sorted(frames.begin(), frames.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size();) {
    size_t end = i + 1;
    while (end < sorted.size() && sorted[end] == sorted[end - 1] + frame_bytes) ++end;
    Give(owner, sorted[i], uint64_t{frame_bytes} * (end - i));
    i = end;
  }
}

uint64_t StoreStaging::FindFree(uint64_t n) const {
  uint64_t run = 0, start = 0;
  for (uint64_t i = first_maybe_free_; i < pages_;) {
    const uint64_t word = used_bits_[i / 64];
    if (i % 64 == 0 && word == ~0ull) {  // 64 taken pages
      run = 0;
      i += 64;
      continue;
    }
    if (i % 64 == 0 && word == 0) {  // 64 free pages (never the padded last word)
      if (run == 0) start = i;
      run += 64;
      i += 64;
    } else if (word >> (i % 64) & 1) {
      run = 0;
      ++i;
    } else {
      if (run++ == 0) start = i;
      ++i;
    }
    if (run >= n) return start;
  }
  return pages_;
}

void StoreStaging::Mark(uint64_t first, uint64_t n, bool used) {
  for (uint64_t i = first; i < first + n; ++i) {
    const uint64_t bit = 1ull << (i % 64);
    if (used) {
      used_bits_[i / 64] |= bit;
    } else {
      used_bits_[i / 64] &= ~bit;
    }
  }
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

std::vector<uint8_t*> InterleavedFrames(uint8_t* run, uint32_t lanes, uint32_t lane,
                                        uint32_t num_objects, uint32_t frame_bytes) {
  std::vector<uint8_t*> frames(num_objects);
  for (uint32_t j = 0; j < num_objects; ++j) {
    frames[j] = run + (uint64_t{j} * lanes + lane) * frame_bytes;
  }
  return frames;
}

}  // namespace tutti::store

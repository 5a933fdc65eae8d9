#include "daemon/datapath/staging_lease.h"

#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tutti::datapath {
namespace {

uint64_t RoundUpPage(uint64_t bytes) {
  return (bytes + StagingPool::kPage - 1) / StagingPool::kPage * StagingPool::kPage;
}

}  // namespace

StagingLease::StagingLease(StagingLease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      kind_(other.kind_) {}

StagingLease& StagingLease::operator=(StagingLease&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    kind_ = other.kind_;
  }
  return *this;
}

void StagingLease::Release() {
  if (pool_ == nullptr) return;
  std::exchange(pool_, nullptr)->Give(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

StagingPool::StagingPool(absl::Span<uint8_t> region, MemoryKind kind)
    : base_(region.data()), capacity_(region.size() / kPage * kPage), kind_(kind) {
  assert(reinterpret_cast<uintptr_t>(base_) % kPage == 0);
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

StagingPool::~StagingPool() {
  absl::MutexLock lock(&mu_);
  assert(used_ == 0 && "a StagingLease outlived its pool");
}

uint64_t StagingPool::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

std::optional<uint64_t> StagingPool::FindFree(uint64_t bytes) const {
  for (const auto& [start, len] : free_) {
    if (len >= bytes) return start;
  }
  return std::nullopt;
}

StagingLease StagingPool::Carve(uint64_t start, uint64_t bytes) {
  auto it = free_.find(start);
  const uint64_t len = it->second;
  free_.erase(it);
  if (len > bytes) free_.emplace(start + bytes, len - bytes);
  used_ += bytes;
  return StagingLease(this, base_ + start, bytes, kind_);
}

absl::StatusOr<StagingLease> StagingPool::Take(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a staging lease of 0 bytes");
  const uint64_t rounded = RoundUpPage(bytes);
  if (rounded > capacity_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a staging lease of ", bytes, " bytes; the staging pool holds ", capacity_));
  }
  absl::MutexLock lock(&mu_);
  std::optional<uint64_t> start = FindFree(rounded);
  if (!start.has_value()) {
    auto fits = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      start = FindFree(rounded);
      return start.has_value();
    };
    ++waiters_;
    mu_.Await(absl::Condition(&fits));
    --waiters_;
  }
  return Carve(*start, rounded);
}

std::optional<StagingLease> StagingPool::TryTake(uint64_t bytes) {
  const uint64_t rounded = RoundUpPage(bytes);
  if (bytes == 0 || rounded > capacity_) return std::nullopt;
  absl::MutexLock lock(&mu_);
  if (waiters_ > 0) return std::nullopt;
  const std::optional<uint64_t> start = FindFree(rounded);
  if (!start.has_value()) return std::nullopt;
  return Carve(*start, rounded);
}

bool StagingPool::HasWaiters() const {
  absl::MutexLock lock(&mu_);
  return waiters_ > 0;
}

void StagingPool::Give(uint8_t* data, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  uint64_t start = static_cast<uint64_t>(data - base_);
  uint64_t len = bytes;
  used_ -= bytes;
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, len);
}

}  // namespace tutti::datapath

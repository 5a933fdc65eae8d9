// Staging handed out as leases (the "check" and "release" steps of a read): a StagingPool cuts
// contiguous byte ranges out of one region (the store's retrieve staging), and each range is
// held by a move-only StagingLease that gives it back when destroyed, on every path.
//
// A lease says what kind of memory it is (MemoryKind), so a backend that reads into device memory
// (GDS, GPU-driven NVMe) adds a pool over device memory and nothing else changes. Today every
// pool is host memory.
//
// Ranges are whole 4 KiB pages, first fit; a freed range merges with its free neighbours.
//
// Thread-safety: StagingPool is thread-safe; a StagingLease is owned by one thread at a time.
// Lifetime: the region must outlive the pool, and the pool every lease it handed out.
#ifndef TUTTI_DAEMON_DATAPATH_STAGING_LEASE_H_
#define TUTTI_DAEMON_DATAPATH_STAGING_LEASE_H_

#include <cstdint>
#include <map>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tutti::datapath {

enum class MemoryKind : uint8_t { kHost, kDevice };

class StagingPool;

class StagingLease {
 public:
  StagingLease() = default;  // holds nothing
  StagingLease(StagingLease&& other) noexcept;
  StagingLease& operator=(StagingLease&& other) noexcept;
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  ~StagingLease() { Release(); }

  // Gives the range back now (idempotent); the lease then holds nothing.
  void Release();

  bool held() const { return pool_ != nullptr; }
  uint8_t* data() const { return data_; }
  // The bytes asked for, rounded up to 4 KiB.
  uint64_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }

 private:
  friend class StagingPool;
  StagingLease(StagingPool* pool, uint8_t* data, uint64_t size, MemoryKind kind)
      : pool_(pool), data_(data), size_(size), kind_(kind) {}

  StagingPool* pool_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  MemoryKind kind_ = MemoryKind::kHost;
};

class StagingPool {
 public:
  static constexpr uint64_t kPage = 4096;

  // Leases over `region`, whose start must be 4 KiB aligned; a partial last page is not used.
  explicit StagingPool(absl::Span<uint8_t> region, MemoryKind kind = MemoryKind::kHost);
  // Precondition: every lease has been released.
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  uint64_t capacity_bytes() const { return capacity_; }
  // The memory leases are carved from (capacity_bytes() long).
  absl::Span<uint8_t> region() const { return absl::MakeSpan(base_, capacity_); }
  uint64_t used_bytes() const;
  MemoryKind kind() const { return kind_; }

  // A lease of `bytes` (> 0, rounded up to 4 KiB), waiting until a contiguous range is free.
  // RESOURCE_EXHAUSTED (nothing waited for) if it is larger than the whole pool; INVALID_ARGUMENT
  // for 0 bytes.
  absl::StatusOr<StagingLease> Take(uint64_t bytes);
  // A lease of `bytes` if a range is free now and no Take is waiting (waiters come first), else
  // nullopt (also for 0 or more than the whole).
  std::optional<StagingLease> TryTake(uint64_t bytes);
  // True while a Take waits for room: holders of several leases may give one back
  // (LayerReader does, down to two a Read).
  bool HasWaiters() const;

 private:
  friend class StagingLease;
  // First fit: the start of a free range of `bytes`, or nullopt.
  std::optional<uint64_t> FindFree(uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  StagingLease Carve(uint64_t start, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Give(uint8_t* data, uint64_t bytes);

  uint8_t* const base_;
  const uint64_t capacity_;
  const MemoryKind kind_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> free_ ABSL_GUARDED_BY(mu_);  // start -> length, disjoint, merged
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t waiters_ ABSL_GUARDED_BY(mu_) = 0;  // Takes waiting for room
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_STAGING_LEASE_H_

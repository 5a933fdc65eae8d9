#include "daemon/datapath/staging_lease.h"

#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

constexpr uint64_t kPage = StagingPool::kPage;

// A page-aligned region of `pages` pages.
struct Region {
  explicit Region(uint64_t pages)
      : data(static_cast<uint8_t*>(std::aligned_alloc(kPage, pages * kPage))),
        bytes(pages * kPage) {}
  ~Region() { std::free(data); }
  absl::Span<uint8_t> span() { return {data, bytes}; }
  uint8_t* data;
  uint64_t bytes;
};

TEST(StagingLeaseTest, TakesRoundedRangesAndGivesThemBackOnDestruction) {
  Region region(8);
  StagingPool pool(region.span());
  EXPECT_EQ(pool.capacity_bytes(), 8 * kPage);
  {
    absl::StatusOr<StagingLease> a = pool.Take(100);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->held());
    EXPECT_EQ(a->size(), kPage);
    EXPECT_EQ(a->kind(), MemoryKind::kHost);
    EXPECT_EQ(a->data(), region.data);
    std::optional<StagingLease> b = pool.TryTake(3 * kPage);
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->data(), region.data + kPage);
    EXPECT_EQ(pool.used_bytes(), 4 * kPage);
  }
  EXPECT_EQ(pool.used_bytes(), 0u);
}

TEST(StagingLeaseTest, RefusesWhatCanNeverFit) {
  Region region(4);
  StagingPool pool(region.span());
  absl::StatusOr<StagingLease> big = pool.Take(4 * kPage + 1);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find(std::to_string(4 * kPage)), std::string::npos);
  EXPECT_EQ(pool.Take(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(pool.TryTake(5 * kPage).has_value());
  EXPECT_FALSE(pool.TryTake(0).has_value());
}

TEST(StagingLeaseTest, MovedLeaseReleasesOnce) {
  Region region(4);
  StagingPool pool(region.span(), MemoryKind::kDevice);
  StagingLease kept;
  {
    absl::StatusOr<StagingLease> a = pool.Take(2 * kPage);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->kind(), MemoryKind::kDevice);
    kept = std::move(*a);
    EXPECT_FALSE(a->held());
  }
  EXPECT_EQ(pool.used_bytes(), 2 * kPage);
  StagingLease other = std::move(kept);
  EXPECT_EQ(pool.used_bytes(), 2 * kPage);
  other = StagingLease();  // assigning over a held lease releases it
  EXPECT_EQ(pool.used_bytes(), 0u);
  other.Release();  // idempotent
  EXPECT_EQ(pool.used_bytes(), 0u);
}

TEST(StagingLeaseTest, FreedNeighboursMergeSoTheWholeIsTakenAgain) {
  Region region(6);
  StagingPool pool(region.span());
  std::optional<StagingLease> a = pool.TryTake(2 * kPage);
  std::optional<StagingLease> b = pool.TryTake(2 * kPage);
  std::optional<StagingLease> c = pool.TryTake(2 * kPage);
  ASSERT_TRUE(a && b && c);
  EXPECT_FALSE(pool.TryTake(kPage).has_value());
  a->Release();
  c->Release();
  EXPECT_FALSE(pool.TryTake(3 * kPage).has_value());  // 2 + 2 free, not contiguous
  b->Release();
  std::optional<StagingLease> whole = pool.TryTake(6 * kPage);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->data(), region.data);
}

TEST(StagingLeaseTest, TakeWaitsUntilARangeIsGivenBack) {
  Region region(4);
  StagingPool pool(region.span());
  std::optional<StagingLease> held = pool.TryTake(3 * kPage);
  ASSERT_TRUE(held.has_value());
  absl::Notification taken;
  std::thread waiter([&] {
    absl::StatusOr<StagingLease> l = pool.Take(2 * kPage);
    EXPECT_TRUE(l.ok());
    taken.Notify();
  });
  EXPECT_FALSE(taken.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  held->Release();
  taken.WaitForNotification();
  waiter.join();
  EXPECT_EQ(pool.used_bytes(), 0u);
}

// A waiting Take comes first: TryTake refuses even a range that would fit while one waits, so a
// waiter for a large range is not starved by small ones; HasWaiters says so meanwhile.
TEST(StagingLeaseTest, TryTakeDefersToAWaitingTake) {
  Region region(4);
  StagingPool pool(region.span());
  std::optional<StagingLease> held = pool.TryTake(3 * kPage);
  ASSERT_TRUE(held.has_value());
  EXPECT_FALSE(pool.HasWaiters());
  absl::Notification taken;
  std::thread waiter([&] {
    absl::StatusOr<StagingLease> l = pool.Take(2 * kPage);
    EXPECT_TRUE(l.ok());
    taken.Notify();
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!pool.HasWaiters() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(pool.HasWaiters());
  EXPECT_FALSE(pool.TryTake(kPage).has_value()) << "one page is free, but a Take waits";
  held->Release();
  taken.WaitForNotification();
  waiter.join();
  EXPECT_FALSE(pool.HasWaiters());
  EXPECT_TRUE(pool.TryTake(kPage).has_value());
  EXPECT_EQ(pool.used_bytes(), 0u);
}

// Random takes and releases against a model: leases never overlap, stay inside the region, and
// every byte comes back.
TEST(StagingLeaseTest, RandomLeasesNeverOverlap) {
  constexpr uint64_t kPages = 64;
  Region region(kPages);
  StagingPool pool(region.span());
  std::mt19937_64 rng(11);
  std::vector<StagingLease> leases;
  std::vector<int> owner(kPages, -1);
  for (int step = 0; step < 5000; ++step) {
    if (!leases.empty() && rng() % 2 == 0) {
      const size_t k = rng() % leases.size();
      const uint64_t first = (leases[k].data() - region.data) / kPage;
      for (uint64_t p = first; p < first + leases[k].size() / kPage; ++p) owner[p] = -1;
      leases.erase(leases.begin() + k);
      continue;
    }
    std::optional<StagingLease> l = pool.TryTake((rng() % 8 + 1) * kPage - rng() % kPage);
    if (!l.has_value()) continue;
    const uint64_t first = (l->data() - region.data) / kPage;
    ASSERT_LE(first + l->size() / kPage, kPages);
    for (uint64_t p = first; p < first + l->size() / kPage; ++p) {
      ASSERT_EQ(owner[p], -1) << "page " << p << " handed out twice";
      owner[p] = step;
    }
    leases.push_back(std::move(*l));
  }
  uint64_t used = 0;
  for (const StagingLease& l : leases) used += l.size();
  EXPECT_EQ(pool.used_bytes(), used);
  leases.clear();
  EXPECT_EQ(pool.used_bytes(), 0u);
  EXPECT_TRUE(pool.TryTake(kPages * kPage).has_value());
}

}  // namespace
}  // namespace tutti::datapath

#include "daemon/io/nvme/iova_allocator.h"

#include <gtest/gtest.h>

namespace tutti::io::nvme {
namespace {

constexpr uint64_t kPage = 4096;

TEST(IovaAllocatorTest, AlignsTheWindowAndRoundsSizes) {
  IovaAllocator a(100, 100 + 10 * kPage, kPage);  // [4096, 40960): 9 pages once aligned
  EXPECT_EQ(a.free_bytes(), 9 * kPage);
  EXPECT_EQ(a.Allocate(1), kPage);
  EXPECT_EQ(a.Allocate(kPage + 1), 2 * kPage);  // two pages
  EXPECT_EQ(a.Allocate(kPage), 4 * kPage);
  EXPECT_EQ(a.free_bytes(), 5 * kPage);
}

TEST(IovaAllocatorTest, ExhaustionIsReported) {
  IovaAllocator a(0, 4 * kPage, kPage);
  ASSERT_EQ(a.Allocate(3 * kPage), 0u);
  EXPECT_FALSE(a.Allocate(2 * kPage).has_value());
  EXPECT_EQ(a.Allocate(kPage), 3 * kPage);
  EXPECT_FALSE(a.Allocate(1).has_value());
}

TEST(IovaAllocatorTest, FreedRangesCoalesceAndAreReused) {
  IovaAllocator a(0, 4 * kPage, kPage);
  const uint64_t x = *a.Allocate(kPage), y = *a.Allocate(kPage), z = *a.Allocate(kPage);
  a.Free(x, kPage);
  a.Free(z, kPage);  // coalesces with the last page; x alone is too small for 2 pages
  EXPECT_EQ(a.Allocate(2 * kPage), z);
  a.Free(z, 2 * kPage);
  a.Free(y, kPage);  // x, y, z and the last page coalesce into one range
  EXPECT_EQ(a.free_bytes(), 4 * kPage);
  EXPECT_EQ(a.Allocate(4 * kPage), 0u);
}

}  // namespace
}  // namespace tutti::io::nvme

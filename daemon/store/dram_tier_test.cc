#include "daemon/store/dram_tier.h"

#include <vector>

#include "gtest/gtest.h"

namespace tutti::store {
namespace {

constexpr uint64_t kChunk = 200;  // room for two 100-byte objects

Key K(uint8_t v) {
  Key k;
  k.bytes.fill(v);
  return k;
}

struct Block {
  std::vector<std::vector<uint8_t>> objects;
  std::vector<uint8_t*> ptrs;
  Block(uint8_t fill, int n, uint32_t len) {
    for (int i = 0; i < n; ++i) objects.emplace_back(len, static_cast<uint8_t>(fill + i));
    for (auto& o : objects) ptrs.push_back(o.data());
  }
};

TEST(DramTierTest, KeepsCopiesAndEvictsLeastRecentlyUsedWithinItsRegion) {
  std::vector<uint8_t> region(3 * kChunk);
  DramTier tier(absl::MakeSpan(region), kChunk);
  EXPECT_EQ(tier.capacity(), 3 * kChunk);
  for (uint8_t i = 0; i < 3; ++i) {
    Block b(i * 10, 2, 100);
    tier.Insert(1, K(i), 1, 100, b.ptrs);
  }
  EXPECT_EQ(tier.used(), 3 * kChunk);
  auto b0 = tier.Find(1, K(0), 1);
  ASSERT_NE(b0, nullptr);
  EXPECT_EQ(b0->object(1)[99], 1) << "a copy, not a reference to the caller's buffers";
  EXPECT_GE(b0->data, region.data());
  EXPECT_LT(b0->data, region.data() + region.size()) << "blocks live in the tier's region";
  Block b3(30, 2, 100);
  tier.Insert(1, K(3), 1, 100, b3.ptrs);  // evicts K(1): K(0) was used more recently
  EXPECT_LE(tier.used(), tier.capacity());
  EXPECT_EQ(tier.Find(1, K(1), 1), nullptr);
  EXPECT_NE(tier.Find(1, K(0), 1), nullptr);
  EXPECT_EQ(tier.Find(1, K(0), 2), nullptr) << "another epoch is another block";
  EXPECT_EQ(tier.CountNamespace(1), 3u);
}

TEST(DramTierTest, ABlockHeldByAReaderKeepsItsChunkUntilReleased) {
  std::vector<uint8_t> region(kChunk);  // one chunk
  DramTier tier(absl::MakeSpan(region), kChunk);
  Block a(1, 2, 100);
  tier.Insert(1, K(1), 1, 100, a.ptrs);
  auto held = tier.Find(1, K(1), 1);
  ASSERT_NE(held, nullptr);
  tier.Erase(1, K(1));
  EXPECT_EQ(held->object(0)[0], 1) << "still valid after Erase";
  Block b(9, 2, 100);
  tier.Insert(1, K(2), 1, 100, b.ptrs);  // the only chunk is held: not cached
  EXPECT_EQ(tier.Find(1, K(2), 1), nullptr);
  EXPECT_EQ(held->object(1)[0], 2) << "not overwritten while held";
  held.reset();
  tier.Insert(1, K(2), 1, 100, b.ptrs);
  EXPECT_NE(tier.Find(1, K(2), 1), nullptr) << "the chunk came back";
}

TEST(DramTierTest, OffOrOversizedBlocksAreNotCached) {
  DramTier off(absl::Span<uint8_t>(), kChunk);
  Block b(1, 2, 100);
  off.Insert(1, K(1), 1, 100, b.ptrs);
  EXPECT_EQ(off.Find(1, K(1), 1), nullptr);
  EXPECT_EQ(off.capacity(), 0u);
  std::vector<uint8_t> region(4 * kChunk);
  DramTier small(absl::MakeSpan(region), 150);
  small.Insert(1, K(1), 1, 100, b.ptrs);
  EXPECT_EQ(small.Find(1, K(1), 1), nullptr);
  EXPECT_EQ(small.used(), 0u);
}

}  // namespace
}  // namespace tutti::store

#include "daemon/store/dram_tier.h"

#include <vector>

#include "gtest/gtest.h"

namespace tutti::store {
namespace {

Key K(uint8_t v) {
  Key k;
  k.bytes.fill(v);
  return k;
}

struct Block {
  std::vector<std::vector<uint8_t>> objects;
  std::vector<uint8_t *> ptrs;
  Block(uint8_t fill, int n, uint32_t len) {
    for (int i = 0; i < n; ++i) objects.emplace_back(len, static_cast<uint8_t>(fill + i));
    for (auto &o : objects) ptrs.push_back(o.data());
  }
};

TEST(DramTierTest, KeepsCopiesAndEvictsLeastRecentlyUsedWithinCapacity) {
  DramTier tier(3 * 2 * 100);  // three blocks of two 100-byte objects
  for (uint8_t i = 0; i < 3; ++i) {
    Block b(i * 10, 2, 100);
    tier.Insert(1, K(i), 1, 100, b.ptrs);
  }
  EXPECT_EQ(tier.used(), 600u);
  auto b0 = tier.Find(1, K(0), 1);
  ASSERT_NE(b0, nullptr);
  EXPECT_EQ(b0->object(1)[99], 1) << "a copy, not a reference to the caller's buffers";
  Block b3(30, 2, 100);
  tier.Insert(1, K(3), 1, 100,
              b3.ptrs);  // evicts K(1): K(0) was used more recently
  EXPECT_LE(tier.used(), tier.capacity());
  EXPECT_EQ(tier.Find(1, K(1), 1), nullptr);
  EXPECT_NE(tier.Find(1, K(0), 1), nullptr);
  EXPECT_EQ(tier.Find(1, K(0), 2), nullptr) << "another epoch is another block";
  tier.Erase(1, K(0));
  EXPECT_EQ(tier.Find(1, K(0), 1), nullptr);
  EXPECT_EQ(b0->object(0)[0], 0) << "a block handed out stays valid after Erase";
  EXPECT_EQ(tier.CountNamespace(1), 2u);
}

TEST(DramTierTest, OffOrOversizedBlocksAreNotCached) {
  DramTier off(0);
  Block b(1, 2, 100);
  off.Insert(1, K(1), 1, 100, b.ptrs);
  EXPECT_EQ(off.Find(1, K(1), 1), nullptr);
  DramTier small(150);
  small.Insert(1, K(1), 1, 100, b.ptrs);
  EXPECT_EQ(small.Find(1, K(1), 1), nullptr);
  EXPECT_EQ(small.used(), 0u);
}

}  // namespace
}  // namespace tutti::store

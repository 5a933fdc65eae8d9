#include "daemon/store/index.h"

#include <set>

#include "gtest/gtest.h"

namespace tutti::store {
namespace {

Key K(uint8_t v) {
  Key k;
  k.bytes.fill(v);
  return k;
}

TEST(IndexTest, InsertFindRemoveKeepsChecksumsPerSlot) {
  Index index(4, 3);
  uint64_t slot;
  ASSERT_TRUE(index.TakeSlot(&slot));
  const std::vector<uint64_t> sums = {11, 22, 33};
  Entry* e = index.Insert(7, K(1), slot, 5, 4096, sums);
  EXPECT_EQ(index.Find(7, K(1)), e);
  EXPECT_EQ(index.Find(8, K(1)), nullptr) << "keys never cross namespaces";
  EXPECT_EQ(std::vector<uint64_t>(index.Checksums(*e).begin(), index.Checksums(*e).end()), sums);
  EXPECT_EQ(index.AtSlot(slot), e);
  index.Remove(e);
  EXPECT_EQ(index.Find(7, K(1)), nullptr);
  EXPECT_EQ(index.AtSlot(slot), nullptr);
  EXPECT_EQ(index.free_slots(), 3u) << "Remove does not free the slot";
  index.ReleaseSlot(slot);
  EXPECT_EQ(index.free_slots(), 4u);
}

TEST(IndexTest, VictimIsLeastRecentlyUsedUnpinnedAndBadFirst) {
  Index index(3, 1);
  std::vector<Entry*> e;
  for (uint8_t i = 0; i < 3; ++i) {
    uint64_t slot;
    ASSERT_TRUE(index.TakeSlot(&slot));
    e.push_back(index.Insert(1, K(i), slot, i + 1, 4096, {0}));
  }
  uint64_t none;
  EXPECT_FALSE(index.TakeSlot(&none));
  EXPECT_EQ(index.Victim(), e[0]);
  index.Touch(e[0]);
  EXPECT_EQ(index.Victim(), e[1]);
  e[1]->pins = 1;
  EXPECT_EQ(index.Victim(), e[2]);
  e[0]->pins = 1;
  e[2]->pins = 1;
  EXPECT_EQ(index.Victim(), nullptr) << "pinned blocks are never victims";
}

TEST(IndexTest, RecoveryClaimsDoNotDuplicateFreeSlots) {
  Index index(5, 1);
  EXPECT_TRUE(index.ClaimSlot(1));
  EXPECT_FALSE(index.ClaimSlot(1));
  EXPECT_TRUE(index.ClaimSlot(3));
  index.RebuildFreeList();
  EXPECT_EQ(index.free_slots(), 3u);
  index.ReleaseSlot(3);
  std::set<uint64_t> taken;
  uint64_t s;
  while (index.TakeSlot(&s)) EXPECT_TRUE(taken.insert(s).second) << "slot " << s << " twice";
  EXPECT_EQ(taken, (std::set<uint64_t>{0, 2, 3, 4}));
}

}  // namespace
}  // namespace tutti::store

// The eviction policy on its own (eviction_policy.h): the store's choice is least recently used
// first, over ids, whatever cache it serves.
#include "daemon/store/eviction_policy.h"

#include <algorithm>
#include <random>
#include <vector>

#include "daemon/store/lru_policy.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

constexpr auto kAny = [](uint32_t) { return true; };

// Victims one by one (each erased once named), in the order the policy gives them up.
std::vector<uint32_t> Drain(EvictionPolicy& p) {
  std::vector<uint32_t> order;
  for (uint32_t v = p.Victim(kAny); v != EvictionPolicy::kNone; v = p.Victim(kAny)) {
    order.push_back(v);
    p.Erase(v);
  }
  return order;
}

TEST(EvictionPolicyTest, TheStoreEvictsTheLeastRecentlyUsedFirst) {
  std::unique_ptr<EvictionPolicy> p = MakeEvictionPolicy(8);
  EXPECT_EQ(p->Victim(kAny), EvictionPolicy::kNone) << "nothing held";
  for (uint32_t id : {5, 2, 7, 0, 3}) p->Insert(id);
  p->Touch(2);
  p->Touch(0);
  p->Touch(0);  // most recent already
  p->Erase(7);
  EXPECT_FALSE(p->Holds(7));
  EXPECT_TRUE(p->Holds(5));
  EXPECT_EQ(Drain(*p), (std::vector<uint32_t>{5, 3, 2, 0}));
  EXPECT_FALSE(p->Holds(5));
}

TEST(EvictionPolicyTest, VictimSkipsIdsThatAreNotEligibleWithoutReordering) {
  LruPolicy p(4);
  for (uint32_t id = 0; id < 4; ++id) p.Insert(id);
  std::vector<uint32_t> asked;
  const uint32_t v = p.Victim([&](uint32_t id) {
    asked.push_back(id);
    return id >= 2;  // 0 and 1 are pinned, say
  });
  EXPECT_EQ(v, 2u);
  EXPECT_EQ(asked, (std::vector<uint32_t>{0, 1, 2})) << "asked oldest first, stopping at the one";
  EXPECT_EQ(p.Victim([](uint32_t) { return false; }), EvictionPolicy::kNone);
  EXPECT_EQ(Drain(p), (std::vector<uint32_t>{0, 1, 2, 3})) << "asking reorders nothing";
}

TEST(EvictionPolicyTest, InsertsInOrderOfLastUseRebuildThatOrder) {
  // As Index::OrderByLastUse does after a restart: reinsert, oldest last use first.
  LruPolicy p(6);
  for (uint32_t id : {4, 1, 5, 0}) p.Insert(id);
  for (uint32_t id : {4, 1, 5, 0}) p.Erase(id);
  for (uint32_t id : {0, 5, 1, 4}) p.Insert(id);
  EXPECT_EQ(Drain(p), (std::vector<uint32_t>{0, 5, 1, 4}));
}

TEST(EvictionPolicyTest, MatchesAReferenceRecencyListUnderRandomOperations) {
  constexpr uint32_t kIds = 64;
  std::unique_ptr<EvictionPolicy> p = MakeEvictionPolicy(kIds);
  std::vector<uint32_t> recency;  // front: least recently used
  std::vector<bool> pinned(kIds, false);
  std::mt19937 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const uint32_t id = rng() % kIds;
    const bool held = std::find(recency.begin(), recency.end(), id) != recency.end();
    ASSERT_EQ(p->Holds(id), held) << "step " << step;
    const int op = rng() % 3;
    if (!held) {
      p->Insert(id);
      recency.push_back(id);
    } else if (op == 0) {
      p->Erase(id);
      recency.erase(std::find(recency.begin(), recency.end(), id));
    } else if (op == 1) {
      p->Touch(id);
      recency.erase(std::find(recency.begin(), recency.end(), id));
      recency.push_back(id);
    } else {
      pinned[id] = !pinned[id];
    }
    auto want = std::find_if(recency.begin(), recency.end(), [&](uint32_t i) { return !pinned[i]; });
    const uint32_t got = p->Victim([&](uint32_t i) { return !pinned[i]; });
    ASSERT_EQ(got, want == recency.end() ? EvictionPolicy::kNone : *want) << "step " << step;
  }
}

}  // namespace
}  // namespace tutti::store

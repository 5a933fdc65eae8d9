#include "daemon/store/index.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

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

TEST(IndexTest, RecoveryRebuildsTheLruListFromTheLastUseACheckpointKept) {
  Index index(5, 1);
  // As recovery inserts a checkpoint's blocks (slot order) with their last uses, then a journal's.
  const uint64_t last_use[4] = {40, 10, 30, 20};
  std::vector<Entry*> e;
  for (uint8_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(index.ClaimSlot(i));
    e.push_back(index.Insert(1, K(i), i, i + 1, 4096, {0}));
    index.SetLastUse(e[i], last_use[i]);
  }
  ASSERT_TRUE(index.ClaimSlot(4));
  e.push_back(index.Insert(1, K(4), 4, 5, 4096, {0}));  // a journal's put: newer than all
  EXPECT_GT(e[4]->last_use, 40u);
  index.OrderByLastUse();
  std::vector<Entry*> victims;
  while (Entry* v = index.Victim()) {
    victims.push_back(v);
    index.Remove(v);
  }
  EXPECT_EQ(victims, (std::vector<Entry*>{e[1], e[3], e[2], e[0], e[4]}));
}

TEST(IndexTest, TouchAdvancesTheUseClock) {
  Index index(2, 1);
  Entry* a = index.Insert(1, K(0), 0, 1, 4096, {0});
  Entry* b = index.Insert(1, K(1), 1, 2, 4096, {0});
  EXPECT_LT(a->last_use, b->last_use);
  index.Touch(a);
  EXPECT_GT(a->last_use, b->last_use);
  EXPECT_EQ(index.use_clock(), a->last_use);
  index.Touch(a);  // most recent already: the clock still moves
  EXPECT_EQ(index.use_clock(), a->last_use);
  index.OrderByLastUse();
  EXPECT_EQ(index.Victim(), b);
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

using Slots = std::vector<uint64_t>;

TEST(IndexTest, TakeSlotsHandsOutConsecutiveSlotsLowestFirst) {
  Index index(16, 1);
  EXPECT_EQ(index.TakeSlots(4), (Slots{0, 1, 2, 3}));
  EXPECT_EQ(index.TakeSlots(3), (Slots{4, 5, 6}));
  uint64_t slot;
  ASSERT_TRUE(index.TakeSlot(&slot));
  EXPECT_EQ(slot, 7u);
  EXPECT_EQ(index.free_slots(), 8u);
  EXPECT_EQ(index.free_runs(), 1u);
  EXPECT_EQ(index.TakeSlots(0), Slots{});
}

// Takes every slot of `index`, then frees `slots`.
void FreeOnly(Index* index, const Slots& slots) {
  EXPECT_EQ(index->TakeSlots(index->num_slots()).size(), index->num_slots());
  for (uint64_t s : slots) index->ReleaseSlot(s);
}

TEST(IndexTest, TakeSlotsFallsBackToTheLongestRunsWhenFragmented) {
  Index index(20, 1);
  FreeOnly(&index, {2, 3, 7, 8, 9, 10, 11, 14, 15, 16, 19});
  EXPECT_EQ(index.free_runs(), 4u);
  // The lowest run that holds 3 (2-3 does not; 7-11 does), from its start.
  EXPECT_EQ(index.TakeSlots(3), (Slots{7, 8, 9}));
  // Free now: 2-3, 10-11, 14-16, 19. No run of 6: 14-16 (longest), then 2-3 (the lowest of the
  // two longest left), then the lowest run that holds the last one: 10.
  EXPECT_EQ(index.TakeSlots(6), (Slots{2, 3, 10, 14, 15, 16}));
  EXPECT_EQ(index.TakeSlots(5), (Slots{11, 19})) << "fewer than asked: all that is free";
  EXPECT_EQ(index.TakeSlots(1), Slots{});
  uint64_t slot;
  EXPECT_FALSE(index.TakeSlot(&slot));
  EXPECT_EQ(index.free_slots(), 0u);
  EXPECT_EQ(index.free_runs(), 0u);
}

TEST(IndexTest, ReleasedSlotsMergeIntoRunsAndAreReused) {
  Index index(10, 1);
  FreeOnly(&index, {5, 3, 4});
  EXPECT_EQ(index.free_runs(), 1u) << "3, 4, 5 merged";
  index.ReleaseSlot(4);  // already free: nothing changes
  EXPECT_EQ(index.free_slots(), 3u);
  index.ReleaseSlot(0);
  EXPECT_EQ(index.free_runs(), 2u);
  EXPECT_EQ(index.TakeSlots(3), (Slots{3, 4, 5}));
  EXPECT_EQ(index.TakeSlots(2), (Slots{0}));
  // Recovery claims split runs.
  Index recovering(10, 1);
  EXPECT_TRUE(recovering.ClaimSlot(4));
  EXPECT_EQ(recovering.free_runs(), 2u);
  EXPECT_EQ(recovering.free_slots(), 9u);
  recovering.ReleaseSlot(4);  // as replay does when a later record moves the block
  EXPECT_EQ(recovering.free_runs(), 1u);
  EXPECT_TRUE(recovering.ClaimSlot(4));
  recovering.RebuildFreeList();
  EXPECT_EQ(recovering.free_runs(), 2u);
  EXPECT_EQ(recovering.TakeSlots(5), (Slots{5, 6, 7, 8, 9})) << "0-3 is too short";
}

// The policy of TakeSlots, computed from a plain set of free slots.
Slots ReferenceTake(std::set<uint64_t>* free, uint64_t n) {
  Slots out;
  while (out.size() < n && !free->empty()) {
    std::vector<std::pair<uint64_t, uint64_t>> runs;  // (start, length), ascending
    for (uint64_t s : *free) {
      if (!runs.empty() && runs.back().first + runs.back().second == s) {
        ++runs.back().second;
      } else {
        runs.push_back({s, 1});
      }
    }
    const uint64_t want = n - out.size();
    std::pair<uint64_t, uint64_t> pick{0, 0};
    for (const auto& r : runs) {
      if (r.second >= want) {
        pick = {r.first, want};
        break;
      }
      if (r.second > pick.second) pick = r;
    }
    for (uint64_t s = pick.first; s < pick.first + pick.second; ++s) {
      free->erase(s);
      out.push_back(s);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(IndexTest, TakeSlotsMatchesItsPolicyUnderRandomTakesAndReleases) {
  std::mt19937 rng(12345);
  Index index(200, 1);
  std::set<uint64_t> free;
  for (uint64_t s = 0; s < 200; ++s) free.insert(s);
  Slots taken;
  for (int step = 0; step < 3000; ++step) {
    if (rng() % 2 == 0 && !taken.empty()) {
      const size_t i = rng() % taken.size();
      index.ReleaseSlot(taken[i]);
      free.insert(taken[i]);
      taken.erase(taken.begin() + i);
    } else {
      const uint64_t n = 1 + rng() % 12;
      const Slots got = index.TakeSlots(n);
      ASSERT_EQ(got, ReferenceTake(&free, n)) << "step " << step;
      taken.insert(taken.end(), got.begin(), got.end());
    }
    ASSERT_EQ(index.free_slots(), free.size());
  }
}

TEST(IndexTest, CountsEntriesPerNamespace) {
  Index index(8, 1);
  std::vector<Entry*> e;
  for (uint8_t i = 0; i < 5; ++i) {
    uint64_t slot;
    ASSERT_TRUE(index.TakeSlot(&slot));
    e.push_back(index.Insert(i < 3 ? 1 : 2, K(i), slot, i + 1, 4096, {0}));
  }
  EXPECT_EQ(index.CountNamespace(1), 3u);
  EXPECT_EQ(index.CountNamespace(2), 2u);
  EXPECT_EQ(index.CountNamespace(3), 0u);
  index.Remove(e[0]);
  index.Remove(e[3]);
  index.Remove(e[4]);
  EXPECT_EQ(index.CountNamespace(1), 2u);
  EXPECT_EQ(index.CountNamespace(2), 0u);
  EXPECT_EQ(index.size(), 2u);
}

TEST(IndexTest, ASlotReusedAfterRemoveHoldsTheNewBlockOnly) {
  Index index(2, 2);
  Entry* a = index.Insert(1, K(1), 0, 1, 4096, {11, 12});
  a->pins = 0;
  index.Remove(a);
  EXPECT_EQ(index.AtSlot(0), nullptr);
  Entry* b = index.Insert(1, K(2), 0, 2, 2048, {21});
  EXPECT_EQ(index.Find(1, K(1)), nullptr) << "the old key left with its block";
  EXPECT_EQ(index.Find(1, K(2)), b);
  EXPECT_EQ(b->pins, 0u);
  EXPECT_EQ(std::vector<uint64_t>(index.Checksums(*b).begin(), index.Checksums(*b).end()),
            std::vector<uint64_t>{21});
  EXPECT_EQ(index.Victim(), b);
}

// Finds, removals, touches and victims against a reference model (a map and a recency list),
// over many keys so the hash set probes past collisions and the LRU links are exercised.
TEST(IndexTest, MatchesAReferenceLruUnderRandomOperations) {
  constexpr uint64_t kSlots = 300;
  std::mt19937 rng(99);
  Index index(kSlots, 1);
  std::map<std::pair<NamespaceId, uint32_t>, uint64_t> ref;  // (ns, key id) -> slot
  std::vector<std::pair<NamespaceId, uint32_t>> recency;     // front: least recently used
  std::set<uint64_t> pinned;
  auto key_of = [](uint32_t id) {
    Key k;
    for (int b = 0; b < 16; ++b) k.bytes[b] = static_cast<uint8_t>(id >> (8 * (b % 4)));
    return k;
  };
  for (int step = 0; step < 20000; ++step) {
    const NamespaceId ns = 1 + rng() % 2;
    const uint32_t id = rng() % 500;
    const auto rk = std::make_pair(ns, id);
    Entry* e = index.Find(ns, key_of(id));
    ASSERT_EQ(e != nullptr, ref.count(rk) == 1) << "step " << step;
    if (e != nullptr) {
      ASSERT_EQ(e->slot, ref[rk]);
    }
    const int op = rng() % 4;
    if (e == nullptr) {
      uint64_t slot;
      if (!index.TakeSlot(&slot)) continue;
      index.Insert(ns, key_of(id), slot, step, 4096, {slot});
      ref[rk] = slot;
      recency.push_back(rk);
    } else if (op == 0 && pinned.count(e->slot) == 0) {
      const uint64_t slot = e->slot;
      index.Remove(e);
      index.ReleaseSlot(slot);
      ref.erase(rk);
      recency.erase(std::find(recency.begin(), recency.end(), rk));
    } else if (op == 1) {
      index.Touch(e);
      recency.erase(std::find(recency.begin(), recency.end(), rk));
      recency.push_back(rk);
    } else if (op == 2) {
      e->pins = e->pins == 0 ? 1 : 0;
      if (e->pins) {
        pinned.insert(e->slot);
      } else {
        pinned.erase(e->slot);
      }
    }
    Entry* victim = index.Victim();
    auto want = std::find_if(recency.begin(), recency.end(),
                             [&](const auto& k) { return pinned.count(ref[k]) == 0; });
    if (want == recency.end()) {
      ASSERT_EQ(victim, nullptr) << "step " << step;
    } else {
      ASSERT_NE(victim, nullptr) << "step " << step;
      ASSERT_EQ(victim->slot, ref[*want]) << "step " << step;
    }
    ASSERT_EQ(index.size(), ref.size());
  }
}

TEST(IndexTest, ClaimsInAnyOrderLeaveExactlyTheUnclaimedSlotsFree) {
  Index index(64, 1);
  std::vector<uint64_t> order(64);
  for (uint64_t s = 0; s < 64; ++s) order[s] = s;
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  std::set<uint64_t> free(order.begin(), order.end());
  for (size_t i = 0; i < 40; ++i) {
    EXPECT_TRUE(index.ClaimSlot(order[i]));
    free.erase(order[i]);
    if (i % 7 == 3) {  // as replay does when a later record moves a block
      index.ReleaseSlot(order[i]);
      free.insert(order[i]);
    }
  }
  EXPECT_EQ(index.free_slots(), free.size()) << "counted without rebuilding the runs";
  Slots got = index.TakeSlots(64);  // the runs are recomputed first
  EXPECT_EQ(got, Slots(free.begin(), free.end()));
}

}  // namespace
}  // namespace tutti::store

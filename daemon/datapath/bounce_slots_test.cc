#include "daemon/datapath/bounce_slots.h"

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

constexpr uint32_t kSlot = 8192;

struct Region {
  explicit Region(uint64_t bytes)
      : data(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes))), size(bytes) {}
  ~Region() { std::free(data); }
  absl::Span<uint8_t> span() { return absl::MakeSpan(data, size); }
  uint8_t* data;
  uint64_t size;
};

TEST(BounceSlotsTest, RefusesTooSmallARegionAndNamesTheBytesNeeded) {
  Region region(4 * kSlot);
  auto slots = BounceSlots::Create(region.span(), 2, 3, kSlot);
  ASSERT_FALSE(slots.ok());
  EXPECT_EQ(slots.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(slots.status().message().find("49152"), std::string_view::npos) << slots.status();
  EXPECT_FALSE(BounceSlots::Create(region.span(), 1, 1, 1000).ok());  // not whole pages
  EXPECT_FALSE(BounceSlots::Create(region.span(), 0, 1, kSlot).ok());
}

// Each file has its own slots: one file's queue never holds up another's batches.
TEST(BounceSlotsTest, AFileWaitsOnlyForItsOwnSlotsInTheOrderAsked) {
  Region region(BounceSlots::BytesFor(2, 2, kSlot));
  auto slots = BounceSlots::Create(region.span(), 2, 2, kSlot);
  ASSERT_TRUE(slots.ok()) << slots.status();
  BounceSlots& b = **slots;
  std::vector<int> started;
  std::vector<uint8_t*> got(6, nullptr);
  for (int i = 0; i < 4; ++i) {  // file 0: two start now, two wait
    b.Acquire(0, /*stream=*/1, [&, i](uint8_t* slot) {
      started.push_back(i);
      got[i] = slot;
    });
  }
  EXPECT_EQ(started, (std::vector<int>{0, 1}));
  b.Acquire(1, /*stream=*/1, [&](uint8_t* slot) {  // file 1 is free
    started.push_back(4);
    got[4] = slot;
  });
  EXPECT_EQ(started, (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(b.held(), 3u);
  std::set<uint8_t*> distinct(got.begin(), got.begin() + 2);
  distinct.insert(got[4]);
  EXPECT_EQ(distinct.size(), 3u);
  for (uint8_t* s : distinct) {
    EXPECT_GE(s, region.data);
    EXPECT_LE(s + kSlot, region.data + region.size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s) % 4096, 0u);
  }
  b.Release(0, got[1]);  // passes straight to batch 2, the first waiting
  EXPECT_EQ(started, (std::vector<int>{0, 1, 4, 2}));
  EXPECT_EQ(got[2], got[1]);
  b.Release(0, got[0]);
  EXPECT_EQ(started.back(), 3);
  EXPECT_EQ(b.held(), 3u);
  b.Release(0, got[2]);
  b.Release(0, got[3]);
  b.Release(1, got[4]);
  EXPECT_EQ(b.held(), 0u);
  EXPECT_EQ(b.most_held(), 3u);
  // A slot given back is free again: a new batch starts at once.
  bool ran = false;
  b.Acquire(0, /*stream=*/1, [&](uint8_t*) { ran = true; });
  EXPECT_TRUE(ran);
}

// Two Retrieves on one file: the one that asked later gets every other slot freed, not the
// slots after all of the first one's waiting batches.
TEST(BounceSlotsTest, StreamsTakeTurnsForAFilesFreedSlots) {
  Region region(BounceSlots::BytesFor(1, 1, kSlot));
  auto slots = BounceSlots::Create(region.span(), 1, 1, kSlot);
  ASSERT_TRUE(slots.ok()) << slots.status();
  BounceSlots& b = **slots;
  std::vector<std::string> started;
  uint8_t* held = nullptr;
  auto batch = [&](std::string name) {
    return [&, name](uint8_t* slot) {
      started.push_back(name);
      held = slot;
    };
  };
  for (const char* n : {"a0", "a1", "a2", "a3"}) b.Acquire(0, /*stream=*/1, batch(n));
  b.Acquire(0, /*stream=*/2, batch("b0"));
  b.Acquire(0, /*stream=*/2, batch("b1"));
  EXPECT_EQ(started, (std::vector<std::string>{"a0"}));
  for (int i = 0; i < 5; ++i) b.Release(0, held);
  EXPECT_EQ(started, (std::vector<std::string>{"a0", "a1", "b0", "a2", "b1", "a3"}));
  b.Release(0, held);
  EXPECT_EQ(b.held(), 0u);
}

TEST(BounceSlotsTest, SlotBytesForHoldsABatchAndAtLeastOneRead) {
  EXPECT_EQ(BounceSlots::SlotBytesFor(4u << 20, 1u << 20), 4u << 20);  // 4 MiB batches
  EXPECT_EQ(BounceSlots::SlotBytesFor(1u << 20, 4u << 20), 4u << 20);  // one read over a batch
  EXPECT_EQ(BounceSlots::SlotBytesFor(5000, 4096), 8192u);             // whole pages
}

}  // namespace
}  // namespace tutti::datapath

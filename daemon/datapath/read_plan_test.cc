#include "daemon/datapath/read_plan.h"

#include <algorithm>
#include <random>
#include <tuple>

#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

constexpr uint32_t kFrame = 4096;

std::vector<PlanItem> Slots(std::initializer_list<int64_t> slots) {
  std::vector<PlanItem> items;
  for (int64_t s : slots) {
    items.push_back(s < 0 ? PlanItem{} : PlanItem{static_cast<uint64_t>(s)});
  }
  return items;
}

// Every property a plan must have, whatever the layout.
void CheckPlan(const ObjectLocator& locate, uint32_t frame_bytes, const PlanRequest& r,
               const LayerPlan& plan) {
  SCOPED_TRACE(testing::Message() << "layer " << r.layer << " parts " << r.parts << " len "
                                  << r.object_len << " max " << r.max_read_bytes);
  const uint32_t read_len = RoundUp4K(r.object_len);
  ASSERT_EQ(plan.read_len, read_len);
  ASSERT_EQ(plan.object_of.size(), r.items.size() * r.parts);
  // Every object wanted is planned exactly once, where it lies in the pool.
  size_t wanted = 0;
  std::vector<int> seen(plan.objects.size(), 0);
  for (uint32_t i = 0; i < r.items.size(); ++i) {
    for (uint32_t p = 0; p < r.parts; ++p) {
      const uint32_t index = plan.object_of[i * r.parts + p];
      if (!r.items[i].slot.has_value()) {
        EXPECT_EQ(index, kNoObject);
        continue;
      }
      ++wanted;
      ASSERT_LT(index, plan.objects.size());
      ++seen[index];
      const PlannedObject& o = plan.objects[index];
      EXPECT_EQ(o.item, i);
      EXPECT_EQ(o.part, p);
      ASSERT_LT(o.io, plan.ios.size());
      const PlannedIo& io = plan.ios[o.io];
      const pool::Location loc = locate(*r.items[i].slot, r.layer * r.parts + p);
      EXPECT_EQ(io.file, loc.file);
      ASSERT_GE(o.staging_offset, io.staging_offset);
      EXPECT_EQ(io.offset + (o.staging_offset - io.staging_offset), loc.offset);
      EXPECT_LE(o.staging_offset + read_len, io.staging_offset + io.len);
      EXPECT_LE(o.staging_offset + read_len, plan.staging_bytes);
    }
  }
  EXPECT_EQ(plan.objects.size(), wanted);
  for (int n : seen) EXPECT_EQ(n, 1);
  // I/Os: aligned, back to back in staging, in (file, offset) order, within the limit, each
  // covering exactly its objects' frames.
  const bool mergeable = read_len == frame_bytes;
  uint64_t staging = 0;
  uint32_t next_object = 0;
  for (size_t k = 0; k < plan.ios.size(); ++k) {
    const PlannedIo& io = plan.ios[k];
    EXPECT_EQ(io.offset % 4096, 0u);
    EXPECT_EQ(io.len % 4096, 0u);
    EXPECT_EQ(io.staging_offset, staging);
    EXPECT_EQ(io.first_object, next_object);
    ASSERT_GE(io.num_objects, 1u);
    EXPECT_EQ(io.len, uint64_t{io.num_objects} * read_len);
    if (io.num_objects > 1) {
      EXPECT_TRUE(mergeable);
      EXPECT_LE(io.len, r.max_read_bytes);
    }
    for (uint32_t j = io.first_object; j < io.first_object + io.num_objects; ++j) {
      EXPECT_EQ(plan.objects[j].io, k);
      EXPECT_EQ(plan.objects[j].staging_offset,
                io.staging_offset + (j - io.first_object) * read_len);
    }
    if (k > 0) {
      const PlannedIo& prev = plan.ios[k - 1];
      EXPECT_LE(std::tie(prev.file, prev.offset), std::tie(io.file, io.offset));
      // Merging is maximal: an I/O starts where the previous one ends only when it could not grow.
      if (mergeable && prev.file == io.file && io.offset == prev.offset + prev.len) {
        EXPECT_GT(uint64_t{prev.len} + read_len, r.max_read_bytes);
      }
    }
    staging += io.len;
    next_object += io.num_objects;
  }
  EXPECT_EQ(next_object, plan.objects.size());
  EXPECT_EQ(plan.staging_bytes, staging);
  EXPECT_EQ(plan.staging_bytes, wanted * read_len);
}

ObjectLocator LocatorOf(const pool::PoolLayout& layout) {
  return [layout](uint64_t slot, uint32_t object) { return layout.ObjectLocation(slot, object); };
}

TEST(ReadPlanTest, TodaysLayoutEveryShapeAndSlotSet) {
  std::mt19937_64 rng(7);
  for (uint32_t files = 1; files <= 4; ++files) {
    for (uint32_t max_objects = 1; max_objects <= 8; ++max_objects) {
      auto layout = pool::PoolLayout::Compute(256ull << 20, files, kFrame, max_objects);
      ASSERT_TRUE(layout.ok()) << layout.status();
      const uint64_t slots = std::min<uint64_t>(layout->num_slots(), 64);
      for (uint32_t parts = 1; parts <= std::min(2u, max_objects); ++parts) {
        for (int set = 0; set < 4; ++set) {
          std::vector<PlanItem> items;
          for (uint64_t s = 0; s < 24; ++s) {
            if (set == 0) items.push_back(PlanItem{s});              // consecutive
            if (set == 1) items.push_back(PlanItem{rng() % slots});  // random, repeats
            if (set == 2) items.push_back(s % 3 == 0 ? PlanItem{} : PlanItem{s});  // gaps
            if (set == 3) items.push_back(PlanItem{23 - s});                       // descending
          }
          for (uint32_t layer = 0; (layer + 1) * parts <= max_objects; ++layer) {
            for (uint32_t len : {kFrame, kFrame / 2, 100u}) {
              for (uint32_t max : {4096u, 8192u, 12288u, 1u << 20}) {
                const PlanRequest r{items, layer, parts, len, max};
                const LayerPlan plan = PlanLayer(*layout, r);
                CheckPlan(LocatorOf(*layout), kFrame, r, plan);
                if (HasFatalFailure()) return;
              }
            }
          }
        }
      }
    }
  }
}

// One file, one slot per extent group (pool format 1's layout), K and V of a slot in adjacent
// frames: one I/O per block.
TEST(ReadPlanTest, OneFileMergesKAndVOfEachSlot) {
  auto layout = pool::PoolLayout::Compute(64ull << 20, 1, kFrame, 8, /*extent_slots=*/1);
  ASSERT_TRUE(layout.ok());
  const std::vector<PlanItem> items = Slots({3, 0, 5});
  const LayerPlan plan = PlanLayer(*layout, PlanRequest{items, 1, 2, kFrame, 1u << 20});
  ASSERT_EQ(plan.ios.size(), 3u);
  for (const PlannedIo& io : plan.ios) EXPECT_EQ(io.len, 2 * kFrame);
  // In (file, offset) order: slot 0 first, so item 1's K lands at staging 0.
  EXPECT_EQ(plan.objects[plan.object_of[1 * 2 + 0]].staging_offset, 0u);
  EXPECT_EQ(plan.objects[plan.object_of[1 * 2 + 1]].staging_offset, kFrame);
  EXPECT_EQ(plan.objects[plan.object_of[0 * 2 + 0]].staging_offset, 2 * kFrame);
}

// Two files, one frame per slot per file: file 0 holds slot 0's K, slot 1's V, slot 2's K, ...
// back to back, so consecutive slots merge across blocks.
TEST(ReadPlanTest, TwoFilesOneFramePerSlotMergesAcrossBlocks) {
  auto layout = pool::PoolLayout::Compute(64ull << 20, 2, kFrame, 2);
  ASSERT_TRUE(layout.ok());
  const std::vector<PlanItem> items = Slots({0, 1, 2, 3});
  const LayerPlan plan = PlanLayer(*layout, PlanRequest{items, 0, 2, kFrame, 1u << 20});
  ASSERT_EQ(plan.ios.size(), 2u);
  EXPECT_EQ(plan.ios[0].file, 0u);
  EXPECT_EQ(plan.ios[1].file, 1u);
  EXPECT_EQ(plan.ios[0].len, 4 * kFrame);
  EXPECT_EQ(plan.ios[1].len, 4 * kFrame);
}

// Objects that do not fill their frame are read one by one, as before merging.
TEST(ReadPlanTest, PartialFramesAreNotMerged) {
  auto layout = pool::PoolLayout::Compute(64ull << 20, 1, 2 * kFrame, 8);
  ASSERT_TRUE(layout.ok());
  const std::vector<PlanItem> items = Slots({0, 1});
  const LayerPlan plan = PlanLayer(*layout, PlanRequest{items, 0, 2, kFrame, 1u << 20});
  EXPECT_EQ(plan.ios.size(), 4u);
  EXPECT_EQ(plan.staging_bytes, 4 * kFrame);
}

// A layout that puts one layer's objects of consecutive slots side by side (the extent layout):
// n objects become ceil(n x frame / max_read_bytes) I/Os of at most max_read_bytes.
TEST(ReadPlanTest, AdjacentObjectsOfManyBlocksSplitAtMaxReadBytes) {
  constexpr uint32_t kBig = 32768;
  const uint32_t parts = 2;
  auto locate = [](uint64_t slot, uint32_t object) {
    // file = part; frame = layer * 1000 + slot.
    return pool::Location{object % 2, (uint64_t{object / 2} * 1000 + slot) * kBig};
  };
  std::vector<PlanItem> items;
  for (uint64_t s = 0; s < 100; ++s) items.push_back(PlanItem{s});
  const PlanRequest r{items, 3, parts, kBig, 1u << 20};
  const LayerPlan plan = PlanLayerAt(locate, kBig, r);
  CheckPlan(locate, kBig, r, plan);
  // 100 objects per file of 32 KiB: 32 per MiB -> 4 I/Os per file (32, 32, 32, 4).
  ASSERT_EQ(plan.ios.size(), 8u);
  EXPECT_EQ(plan.ios[0].len, 1u << 20);
  EXPECT_EQ(plan.ios[3].len, 4 * kBig);
  EXPECT_EQ(plan.ios[4].file, 1u);
  // A hole (slot 40 not read) splits the run.
  items[40].slot.reset();
  const PlanRequest holed{items, 3, parts, kBig, 1u << 20};
  const LayerPlan plan2 = PlanLayerAt(locate, kBig, holed);
  CheckPlan(locate, kBig, holed, plan2);
  // Per file: slots 0-31, 32-39, 41-72, 73-99; no I/O reads slot 40's frame.
  ASSERT_EQ(plan2.ios.size(), 8u);
  EXPECT_EQ(plan2.ios[1].len, 8 * kBig);
  EXPECT_EQ(plan2.ios[2].offset, locate(41, 6).offset);
  for (const PlannedIo& io : plan2.ios) {
    const uint64_t hole = locate(40, 6 + io.file).offset;
    EXPECT_FALSE(hole >= io.offset && hole < io.offset + io.len);
  }
}

// An object larger than max_read_bytes is one I/O of its own, never split or merged.
TEST(ReadPlanTest, ObjectLargerThanMaxReadBytesIsOneIo) {
  auto locate = [](uint64_t slot, uint32_t) { return pool::Location{0, slot * 65536}; };
  const std::vector<PlanItem> items = Slots({0, 1, 2});
  const LayerPlan plan = PlanLayerAt(locate, 65536, PlanRequest{items, 0, 1, 65536, 16384});
  ASSERT_EQ(plan.ios.size(), 3u);
  for (const PlannedIo& io : plan.ios) EXPECT_EQ(io.len, 65536u);
}

TEST(ReadPlanTest, NothingToReadIsAnEmptyPlan) {
  auto layout = pool::PoolLayout::Compute(64ull << 20, 2, kFrame, 8);
  ASSERT_TRUE(layout.ok());
  const std::vector<PlanItem> items = Slots({-1, -1});
  const LayerPlan plan = PlanLayer(*layout, PlanRequest{items, 0, 2, kFrame, 1u << 20});
  EXPECT_TRUE(plan.ios.empty());
  EXPECT_EQ(plan.staging_bytes, 0u);
  EXPECT_EQ(plan.object_of, std::vector<uint32_t>(4, kNoObject));
}

}  // namespace
}  // namespace tutti::datapath

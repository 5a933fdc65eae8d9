#include "daemon/gpu/placement.h"

#include <cstdint>
#include <vector>

#include "absl/strings/match.h"
#include "daemon/gpu/testing/kv_layout.h"
#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

using testing::KvFormat;
using testing::MakeKvLayout;

uint8_t* Addr(uint64_t v) { return reinterpret_cast<uint8_t*>(v); }

TEST(ValidateLayoutTest, AcceptsEveryFormat) {
  for (KvFormat f : testing::kAllFormats) {
    testing::KvLayout kv = MakeKvLayout(f, 4, 100, 32768);
    EXPECT_TRUE(ValidateLayout(kv.layout, kv.region_sizes).ok()) << testing::FormatName(f);
  }
}

TEST(ValidateLayoutTest, RejectsUnalignedObjectOffsetAndStride) {
  testing::KvLayout kv = MakeKvLayout(KvFormat::kSeparateKv, 1, 8, 4096);
  kv.layout.object_len = 4104;
  kv.region_sizes = {1 << 20, 1 << 20};
  kv.layout.placements = {{0, 0, 4112}, {1, 0, 4112}};
  EXPECT_EQ(ValidateLayout(kv.layout, kv.region_sizes).code(), absl::StatusCode::kInvalidArgument);

  kv.layout.object_len = 4096;
  kv.layout.placements = {{0, 8, 4096}, {1, 0, 4096}};
  absl::Status s = ValidateLayout(kv.layout, kv.region_sizes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "placements[0]")) << s;

  kv.layout.placements = {{0, 0, 4096}, {1, 0, 4100}};
  s = ValidateLayout(kv.layout, kv.region_sizes);
  EXPECT_TRUE(absl::StrContains(s.message(), "placements[1]")) << s;
}

TEST(ValidateLayoutTest, RejectsRegionTooSmallAndBadRegionIndex) {
  testing::KvLayout kv = MakeKvLayout(KvFormat::kFusedKv, 2, 64, 4096);
  kv.region_sizes[1] -= 16;  // the last block of layer 1's V no longer fits
  absl::Status s = ValidateLayout(kv.layout, kv.region_sizes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "placements[3]")) << s;

  kv = MakeKvLayout(KvFormat::kFusedKv, 2, 64, 4096);
  kv.layout.placements[2].region = 7;
  EXPECT_EQ(ValidateLayout(kv.layout, kv.region_sizes).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BuildCopyDescsTest, AddressesFollowThePlacementsForEveryFormat) {
  constexpr uint32_t kObj = 32768, kBlocks = 50, kLayers = 3;
  const uint64_t kStagingDev = 0x7f0000000000;
  std::vector<StagingRegion> stage = {{Addr(0x10000000), 64 * kObj, Addr(kStagingDev)}};
  StagingMap map = *StagingMap::Create(stage);
  for (KvFormat f : testing::kAllFormats) {
    testing::KvLayout kv = MakeKvLayout(f, kLayers, kBlocks, kObj);
    std::vector<uint8_t*> bases;
    for (size_t r = 0; r < kv.region_sizes.size(); ++r) bases.push_back(Addr((r + 1) << 32));
    std::vector<engine::CopyOp> ops;
    const uint32_t objects = kv.layout.placements.size();
    for (uint32_t i = 0; i < objects; ++i) {
      ops.push_back({(i * 7) % kBlocks, i, Addr(0x10000000) + i * kObj});
    }
    std::vector<CopyDesc> descs;
    ASSERT_TRUE(BuildCopyDescs(ops, kv.layout, bases, map, CopyDirection::kToEngine, &descs).ok());
    ASSERT_EQ(descs.size(), ops.size());
    for (uint32_t i = 0; i < objects; ++i) {
      const uint32_t layer = i / kv.parts, part = i % kv.parts, b = ops[i].block;
      uint64_t want = 0;
      switch (f) {
        case KvFormat::kFusedKv:
          want = ((layer + 1ull) << 32) + (part * kBlocks + b) * uint64_t{kObj};
          break;
        case KvFormat::kSeparateKv:
          want = ((2ull * layer + part + 1) << 32) + b * uint64_t{kObj};
          break;
        case KvFormat::kMla:
          want = ((layer + 1ull) << 32) + b * uint64_t{kObj};
          break;
        case KvFormat::kBlockMajorKv:
          want = ((layer + 1ull) << 32) + (2ull * b + part) * kObj;
          break;
      }
      EXPECT_EQ(descs[i].dst, Addr(want)) << testing::FormatName(f) << " op " << i;
      EXPECT_EQ(descs[i].src, Addr(kStagingDev + uint64_t{i} * kObj));
    }
    // Gather swaps source and destination.
    ASSERT_TRUE(
        BuildCopyDescs(ops, kv.layout, bases, map, CopyDirection::kFromEngine, &descs).ok());
    EXPECT_EQ(descs[0].dst, Addr(kStagingDev));
  }
}

// A scatter with a device copy (CopyOp::device_copy) reads it in place, even where its staging is
// outside every region; a gather never does (it writes host staging).
TEST(BuildCopyDescsTest, ScattersReadDeviceCopiesInPlace) {
  testing::KvLayout kv = MakeKvLayout(KvFormat::kFusedKv, 2, 10, 4096);
  std::vector<uint8_t*> bases = {Addr(1ull << 32), Addr(2ull << 32)};
  StagingMap map = *StagingMap::Create({{Addr(0x100000), 4 * 4096, Addr(0x900000)}});
  std::vector<CopyDesc> descs;
  std::vector<engine::CopyOp> ops = {{1, 0, Addr(0x100000), Addr(0x7000000)},
                                     {2, 0, Addr(0x101000)},
                                     {3, 0, Addr(0x5000000), Addr(0x7001000)}};
  ASSERT_TRUE(BuildCopyDescs(ops, kv.layout, bases, map, CopyDirection::kToEngine, &descs).ok());
  ASSERT_EQ(descs.size(), 3u);
  EXPECT_EQ(descs[0].src, Addr(0x7000000));
  EXPECT_EQ(descs[1].src, Addr(0x901000));
  EXPECT_EQ(descs[2].src, Addr(0x7001000));
  ops.pop_back();  // its staging is outside every region: a gather must refuse it
  ASSERT_TRUE(BuildCopyDescs(ops, kv.layout, bases, map, CopyDirection::kFromEngine, &descs).ok());
  EXPECT_EQ(descs[0].dst, Addr(0x900000));
  EXPECT_EQ(BuildCopyDescs({{0, 0, Addr(0x100000), Addr(0x7000008)}}, kv.layout, bases, map,
                           CopyDirection::kToEngine, &descs)
                .code(),
            absl::StatusCode::kInvalidArgument)
      << "an unaligned device copy";
}

// Groups for the copy engines' runs: one engine region and one staging region each, so no run
// spans two allocations even where they lie side by side (here the two staging regions do, and
// layer 0's region ends where layer 1's begins); a device copy merges with nothing.
TEST(BuildCopyDescsTest, GroupsKeepToOneEngineRegionAndOneStagingRegion) {
  constexpr uint32_t kObj = 4096;
  testing::KvLayout kv = MakeKvLayout(KvFormat::kMla, 2, 4, kObj);
  std::vector<uint8_t*> bases = {Addr(1ull << 32), Addr((1ull << 32) + 4 * kObj)};
  StagingMap map = *StagingMap::Create(
      {{Addr(0x100000), 2 * kObj, Addr(0x900000)}, {Addr(0x102000), 2 * kObj, Addr(0x902000)}});
  std::vector<engine::CopyOp> ops = {{0, 0, Addr(0x100000)},  // region 0, staging 0
                                     {1, 0, Addr(0x101000)},  // region 0, staging 0
                                     {2, 0, Addr(0x102000)},  // region 0, staging 1
                                     {0, 1, Addr(0x103000)},  // region 1, staging 1
                                     {1, 1, Addr(0x100000), Addr(0x7000000)},   // device copy
                                     {2, 1, Addr(0x100000), Addr(0x7001000)}};  // device copy
  std::vector<CopyDesc> descs;
  std::vector<uint32_t> groups;
  ASSERT_TRUE(
      BuildCopyDescs(ops, kv.layout, bases, map, CopyDirection::kToEngine, &descs, &groups).ok());
  ASSERT_EQ(groups.size(), ops.size());
  EXPECT_EQ(groups[0], groups[1]);
  EXPECT_NE(groups[1], groups[2]) << "staging regions side by side";
  EXPECT_NE(groups[2], groups[3]) << "engine regions side by side";
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_NE(groups[i], groups[4]);
    EXPECT_NE(groups[i], groups[5]);
  }
  EXPECT_NE(groups[4], groups[5]);
  // A gather's groups the same way; without `groups` nothing else changes.
  std::vector<uint32_t> gather_groups;
  ops.resize(4);
  ASSERT_TRUE(
      BuildCopyDescs(ops, kv.layout, bases, map, CopyDirection::kFromEngine, &descs, &gather_groups)
          .ok());
  EXPECT_EQ(gather_groups, std::vector<uint32_t>(groups.begin(), groups.begin() + 4));
}

TEST(BuildCopyDescsTest, RejectsOutOfRangeOpsAndStaging) {
  testing::KvLayout kv = MakeKvLayout(KvFormat::kFusedKv, 2, 10, 4096);
  std::vector<uint8_t*> bases = {Addr(1ull << 32), Addr(2ull << 32)};
  StagingMap map = *StagingMap::Create({{Addr(0x100000), 4 * 4096, Addr(0x100000)}});
  std::vector<CopyDesc> descs;
  auto build = [&](engine::CopyOp op) {
    return BuildCopyDescs({op}, kv.layout, bases, map, CopyDirection::kToEngine, &descs).code();
  };
  EXPECT_EQ(build({9, 3, Addr(0x100000)}), absl::StatusCode::kOk);
  EXPECT_EQ(build({10, 0, Addr(0x100000)}), absl::StatusCode::kInvalidArgument);  // block
  EXPECT_EQ(build({0, 4, Addr(0x100000)}), absl::StatusCode::kInvalidArgument);   // object
  EXPECT_EQ(build({0, 0, Addr(0x103001)}), absl::StatusCode::kInvalidArgument);   // past end
  EXPECT_EQ(build({0, 0, Addr(0x100008)}), absl::StatusCode::kInvalidArgument);   // unaligned
  EXPECT_EQ(build({0, 0, Addr(0x200000)}), absl::StatusCode::kInvalidArgument);   // unregistered
}

}  // namespace
}  // namespace tutti::gpu

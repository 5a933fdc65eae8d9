#include "gpu/copy_runs.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

constexpr uint32_t kLen = 64;

// All descriptors in one group.
void Merge(const std::vector<CopyDesc>& descs, size_t count, std::vector<CopyRun>* runs) {
  const std::vector<uint32_t> groups(descs.size(), 0);
  MergeCopyRuns(descs.data(), groups.data(), count, kLen, runs);
}

// Copies through the runs and through the descriptors one by one into two destinations that
// start alike: both must end byte for byte the same.
void ExpectSameBytes(const std::vector<CopyDesc>& descs, const std::vector<CopyRun>& runs,
                     const std::vector<uint8_t>& src, std::vector<uint8_t>* dst_runs,
                     std::vector<uint8_t>* dst_descs) {
  const uint8_t* s0 = src.data();
  for (const CopyDesc& d : descs) {
    const size_t off = static_cast<const uint8_t*>(d.dst) - dst_runs->data();
    std::memcpy(dst_descs->data() + off, d.src, kLen);
  }
  for (const CopyRun& r : runs) {
    ASSERT_GE(static_cast<const uint8_t*>(r.src), s0);
    ASSERT_LE(static_cast<const uint8_t*>(r.src) + r.bytes, s0 + src.size());
    ASSERT_EQ(r.bytes % kLen, 0u);
    std::memcpy(r.dst, r.src, r.bytes);
  }
  EXPECT_EQ(*dst_runs, *dst_descs);
}

TEST(MergeCopyRunsTest, AdjacentOnBothSidesBecomeOneRun) {
  std::vector<uint8_t> src(8 * kLen), dst(8 * kLen);
  std::vector<CopyDesc> descs;
  for (int i = 0; i < 4; ++i) descs.push_back({src.data() + i * kLen, dst.data() + i * kLen});
  std::vector<CopyRun> runs;
  Merge(descs, descs.size(), &runs);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].src, src.data());
  EXPECT_EQ(runs[0].dst, dst.data());
  EXPECT_EQ(runs[0].bytes, 4 * kLen);
}

TEST(MergeCopyRunsTest, AdjacentOnOneSideOnlyStayApart) {
  std::vector<uint8_t> src(8 * kLen), dst(8 * kLen);
  // Sources adjacent, destinations swapped; then destinations adjacent, sources apart.
  std::vector<CopyDesc> descs = {{src.data(), dst.data() + kLen},
                                 {src.data() + kLen, dst.data()},
                                 {src.data() + 4 * kLen, dst.data() + 4 * kLen},
                                 {src.data() + 6 * kLen, dst.data() + 5 * kLen}};
  std::vector<CopyRun> runs;
  Merge(descs, descs.size(), &runs);
  EXPECT_EQ(runs.size(), 4u);
  for (const CopyRun& r : runs) EXPECT_EQ(r.bytes, kLen);
}

// Adjacent on both sides but in different groups (say two allocations side by side): apart. No
// groups at all: nothing merges.
TEST(MergeCopyRunsTest, RunsStayInsideTheirGroup) {
  std::vector<uint8_t> src(8 * kLen), dst(8 * kLen);
  std::vector<CopyDesc> descs;
  for (int i = 0; i < 6; ++i) descs.push_back({src.data() + i * kLen, dst.data() + i * kLen});
  const std::vector<uint32_t> groups = {7, 7, 7, 2, 2, 7};
  std::vector<CopyRun> runs;
  MergeCopyRuns(descs.data(), groups.data(), descs.size(), kLen, &runs);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].src, src.data() + 3 * kLen);  // group 2 first
  EXPECT_EQ(runs[0].bytes, 2 * kLen);
  EXPECT_EQ(runs[1].src, src.data());
  EXPECT_EQ(runs[1].bytes, 3 * kLen);
  EXPECT_EQ(runs[2].src, src.data() + 5 * kLen);
  EXPECT_EQ(runs[2].bytes, kLen);
  MergeCopyRuns(descs.data(), nullptr, descs.size(), kLen, &runs);
  ASSERT_EQ(runs.size(), descs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_EQ(runs[i].src, descs[i].src);
    EXPECT_EQ(runs[i].dst, descs[i].dst);
    EXPECT_EQ(runs[i].bytes, kLen);
  }
}

TEST(MergeCopyRunsTest, OutOfOrderObjectsAreSortedBySourceThenMerged) {
  std::vector<uint8_t> src(16 * kLen), dst(16 * kLen);
  std::vector<CopyDesc> descs;
  for (int i : {3, 0, 2, 1, 9, 8}) descs.push_back({src.data() + i * kLen, dst.data() + i * kLen});
  std::vector<CopyRun> runs = {{nullptr, nullptr, 1}};  // replaced, not appended to
  Merge(descs, descs.size(), &runs);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].src, src.data());
  EXPECT_EQ(runs[0].bytes, 4 * kLen);
  EXPECT_EQ(runs[1].src, src.data() + 8 * kLen);
  EXPECT_EQ(runs[1].dst, dst.data() + 8 * kLen);
  EXPECT_EQ(runs[1].bytes, 2 * kLen);
  Merge(descs, 0, &runs);
  EXPECT_TRUE(runs.empty());
}

// A store's gather in small: object j of consecutive engine blocks (an engine layout of
// [objects][blocks]) into interleaved staging frames (frame (j * lanes + lane)), given block by
// block as the store does. Each object's `lanes` consecutive blocks become one run.
TEST(MergeCopyRunsTest, GatherOfConsecutiveBlocksIntoInterleavedFrames) {
  constexpr int kObjects = 8, kBlocks = 16, kLanes = 4;
  std::vector<uint8_t> engine(kObjects * kBlocks * kLen);
  std::iota(engine.begin(), engine.end(), 0);
  std::vector<uint8_t> staging(kObjects * kBlocks * kLen), expect(staging.size());
  std::vector<CopyDesc> descs;
  for (int b = 0; b < kBlocks; ++b) {
    const int run = b / kLanes, lane = b % kLanes;
    for (int j = 0; j < kObjects; ++j) {
      uint8_t* frame = staging.data() + (run * kObjects * kLanes + j * kLanes + lane) * kLen;
      descs.push_back({engine.data() + (j * kBlocks + b) * kLen, frame});
    }
  }
  std::vector<CopyRun> runs;
  Merge(descs, descs.size(), &runs);
  EXPECT_EQ(runs.size(), size_t{kObjects * kBlocks / kLanes});
  for (const CopyRun& r : runs) EXPECT_EQ(r.bytes, kLanes * kLen);
  ExpectSameBytes(descs, runs, engine, &staging, &expect);
}

// Random permutations of objects between two buffers, some runs adjacent by chance: the bytes
// always land as the descriptors say.
TEST(MergeCopyRunsTest, RandomLayoutsCopyTheSameBytes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 64);
    std::vector<uint8_t> src(n * kLen), dst(2 * n * kLen, 0), expect(2 * n * kLen, 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(rng());
    std::vector<int> from(n), to(2 * n);
    std::iota(from.begin(), from.end(), 0);
    std::iota(to.begin(), to.end(), 0);
    // Mostly identity stretches (so runs merge), sometimes shuffled.
    if (rng() % 2) std::shuffle(from.begin(), from.end(), rng);
    if (rng() % 2) std::shuffle(to.begin(), to.end(), rng);
    const int m = 1 + static_cast<int>(rng() % n);
    std::vector<CopyDesc> descs;
    for (int i = 0; i < m; ++i) {
      descs.push_back({src.data() + from[i] * kLen, dst.data() + to[i] * kLen});
    }
    std::shuffle(descs.begin(), descs.end(), rng);
    std::vector<uint32_t> groups(descs.size(), 0);
    if (rng() % 2) {
      for (uint32_t& g : groups) g = rng() % 3;
    }
    std::vector<CopyRun> runs;
    MergeCopyRuns(descs.data(), groups.data(), descs.size(), kLen, &runs);
    size_t bytes = 0;
    for (const CopyRun& r : runs) bytes += r.bytes;
    ASSERT_EQ(bytes, m * size_t{kLen});
    ASSERT_LE(runs.size(), descs.size());
    ExpectSameBytes(descs, runs, src, &dst, &expect);
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace tutti::gpu

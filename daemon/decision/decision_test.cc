// The split against the formula of split.h, with hand-computed cases.
#include <vector>

#include "daemon/decision/split.h"
#include "gtest/gtest.h"

namespace tutti::decision {
namespace {

// 4 layers, 10-token blocks of 1 MB per layer, a 101-token prompt with 10 hits; compute costs
// 0.01 ms per new token per layer. Then TTFT(k) = L + 3 max(C, L) + C with L = k x 1e9 / bw
// ms and C = 0.01 (101 - 10k) ms.
SplitInput Base(const std::vector<bool>& in_dram, double dram_bps, double ssd_bps) {
  SplitInput in;
  in.num_layers = 4;
  in.block_tokens = 10;
  in.prompt_tokens = 101;
  in.layer_bytes = 1'000'000;
  in.hit_in_dram = in_dram;
  in.dram_bytes_per_sec = dram_bps;
  in.ssd_bytes_per_sec = ssd_bps;
  in.layer_ms = [](uint32_t t, uint32_t k) { return 0.01 * (t - k); };
  return in;
}

const std::vector<bool> kAllDram(10, true), kAllSsd(10, false);

TEST(SplitTest, AllDramLoadsEverything) {
  // L = 0.001 ms per block: k = 10 gives L = C = 0.01, TTFT 0.05; k = 0 gives 4 x 1.01.
  const Split s = ChooseSplit(Base(kAllDram, 1e12, 1e8));
  EXPECT_EQ(s.load_blocks, 10u);
  EXPECT_NEAR(s.ttft_ms, 0.05, 1e-9);
  EXPECT_NEAR(s.recompute_ms, 4.04, 1e-9);
  EXPECT_NEAR(s.load_all_ms, 0.05, 1e-9);
}

TEST(SplitTest, SlowSsdRecomputes) {
  // L = 10 ms per block: k = 1 already costs 10 + 3 x 10 + 0.91 = 40.91 > 4.04.
  const Split s = ChooseSplit(Base(kAllSsd, 1e12, 1e8));
  EXPECT_EQ(s.load_blocks, 0u);
  EXPECT_NEAR(s.ttft_ms, 4.04, 1e-9);
  EXPECT_NEAR(s.load_all_ms, 4 * 100.0 + 0.01, 1e-6);
  EXPECT_NEAR(PredictTtftMs(Base(kAllSsd, 1e12, 1e8), 1), 40.91, 1e-9);
}

TEST(SplitTest, MidBandwidthPicksTheInteriorOptimum) {
  // L = 0.1 k. For k <= 5 (L <= C): TTFT = 4.04 - 0.3 k, least at k = 5: 2.54. k = 6: 4 x 0.6 +
  // 0.41 = 2.81. Loading all: 4 x 1.0 + 0.01 = 4.01.
  const Split s = ChooseSplit(Base(kAllSsd, 1e12, 1e10));
  EXPECT_EQ(s.load_blocks, 5u);
  EXPECT_NEAR(s.ttft_ms, 2.54, 1e-9);
  EXPECT_NEAR(s.recompute_ms, 4.04, 1e-9);
  EXPECT_NEAR(s.load_all_ms, 4.01, 1e-9);
  EXPECT_LT(s.ttft_ms, s.recompute_ms);
  EXPECT_LT(s.ttft_ms, s.load_all_ms);
}

TEST(SplitTest, AnInteriorSplitMustWinByTheMinimumGain) {
  // As above: k = 5 predicts 2.54 ms against 4.01 for loading all, a gain of 36.7%.
  SplitInput in = Base(kAllSsd, 1e12, 1e10);
  in.min_interior_gain = 0.36;
  EXPECT_EQ(ChooseSplit(in).load_blocks, 5u);
  in.min_interior_gain = 0.37;  // not enough: the better pure strategy, loading all (k = 10)
  const Split s = ChooseSplit(in);
  EXPECT_EQ(s.load_blocks, 10u);
  EXPECT_NEAR(s.ttft_ms, 4.01, 1e-9);
  EXPECT_NEAR(s.recompute_ms, 4.04, 1e-9);
}

TEST(SplitTest, MinimaxRegretWeighsTheInteriorSplit) {
  // As above (k = 5 predicts 2.54, recomputing 4.04, loading all 4.01), now with intervals: the
  // SSD's pessimistic figure at half the rate (L = 0.2 k) and recomputing's compute +-10%.
  //   recompute: [4 x 1.01 x 0.9, 4 x 1.01 x 1.1] = [3.636, 4.444]
  //   k = 5:     [2.54, 1.0 + 3 x 1.0 + 0.51 = 4.51]
  //   load all:  [4.01, 2.0 + 3 x 2.0 + 0.01 = 8.01]
  // Worst-case regrets (high end over the least other low end): k = 5 4.51 / 3.636 = 1.240,
  // recomputing 4.444 / 2.54 = 1.750, loading all 8.01 / 2.54 = 3.154: the split. (Refusing the
  // split for not winning beyond recomputing's low end, then weighing the pure strategies alone,
  // would recompute.)
  SplitInput in = Base(kAllSsd, 1e12, 1e10);
  in.ssd_low_bytes_per_sec = 0.5e10;
  in.recompute_spread = 0.1;
  Split s = ChooseSplit(in);
  EXPECT_EQ(s.load_blocks, 5u);
  EXPECT_EQ(s.refused_load_blocks, 0u);
  ASSERT_EQ(s.num_candidates, 3u);
  const uint32_t ks[] = {0, 10, 5};
  const double lows[] = {3.636, 4.01, 2.54}, highs[] = {4.444, 8.01, 4.51};
  const double regrets[] = {4.444 / 2.54, 8.01 / 2.54, 4.51 / 3.636};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s.candidates[i].load_blocks, ks[i]);
    EXPECT_NEAR(s.candidates[i].low_ms, lows[i], 1e-9);
    EXPECT_NEAR(s.candidates[i].high_ms, highs[i], 1e-9);
    EXPECT_NEAR(s.candidates[i].regret, regrets[i], 1e-9);
  }
  EXPECT_NEAR(s.ttft_high_ms, 4.51, 1e-9);
  // Without the interior candidate (it must win centrally by 37%): recomputing 4.444 / 4.01 =
  // 1.108 against loading all's 8.01 / 3.636 = 2.203: recomputing, loading all refused.
  in.min_interior_gain = 0.37;
  s = ChooseSplit(in);
  EXPECT_EQ(s.load_blocks, 0u);
  EXPECT_EQ(s.refused_load_blocks, 10u);
  ASSERT_EQ(s.num_candidates, 2u);
  EXPECT_NEAR(s.candidates[0].regret, 4.444 / 4.01, 1e-9);
  EXPECT_NEAR(s.candidates[1].regret, 8.01 / 3.636, 1e-9);
}

TEST(SplitTest, NearTiesGoToTheSimplerCandidate) {
  // The split of the test above with its pessimistic rate set so that its worst case against
  // recomputing's low end, (1 + 4 l) / 3.636 with l its layer load at that rate, comes within 1%
  // of recomputing's, 1.750: recomputing. Beyond 1%: the split.
  SplitInput in = Base(kAllSsd, 1e12, 1e10);
  in.recompute_spread = 0.1;
  const double r_regret = 4.444 / 2.54;
  for (const auto& [margin, want] : {std::pair{0.005, 0u}, std::pair{0.02, 5u}}) {
    // Split high end = 4 x L5 + 0.51 (load-bound), L5 = 5 MB / rate.
    const double high = r_regret / (1 + margin) * 3.636;
    in.ssd_low_bytes_per_sec = 5e6 / ((high - 0.51) / 4 * 1e-3);
    const Split s = ChooseSplit(in);
    ASSERT_EQ(s.num_candidates, 3u) << margin;
    EXPECT_NEAR(s.candidates[2].regret * (1 + margin), s.candidates[0].regret, 1e-9) << margin;
    EXPECT_EQ(s.load_blocks, want) << margin;
  }
}

TEST(SplitTest, MixedTiersCountEachBlocksTier) {
  // Blocks 0-2 in DRAM (0.001 ms), the rest on a 10 ms SSD: k = 3 gives 0.003 + 4 x 0.71.
  std::vector<bool> dram_first(10, false);
  dram_first[0] = dram_first[1] = dram_first[2] = true;
  const Split s = ChooseSplit(Base(dram_first, 1e12, 1e8));
  EXPECT_EQ(s.load_blocks, 3u);
  EXPECT_NEAR(s.ttft_ms, 0.003 + 4 * 0.71, 1e-9);
  // The same tiers the other way round: the slow block first makes every k > 0 lose.
  std::vector<bool> ssd_first(10, true);
  ssd_first[0] = false;
  EXPECT_EQ(ChooseSplit(Base(ssd_first, 1e12, 1e8)).load_blocks, 0u);
}

TEST(SplitTest, TiesGoToMoreLoading) {
  // One layer, 1-token blocks, 1 ms per block and 1 ms per new token: TTFT(k) = 2 + k + (11 - k).
  SplitInput in;
  in.num_layers = 1;
  in.block_tokens = 1;
  in.prompt_tokens = 11;
  in.layer_bytes = 1;
  in.hit_in_dram = std::vector<bool>(10, false);
  in.dram_bytes_per_sec = 1e3;
  in.ssd_bytes_per_sec = 1e3;
  in.overhead_ms = 2;
  in.layer_ms = [](uint32_t t, uint32_t k) { return 1.0 * (t - k); };
  const Split s = ChooseSplit(in);
  EXPECT_EQ(s.load_blocks, 10u);
  EXPECT_EQ(s.ttft_ms, 13.0);
  EXPECT_EQ(s.recompute_ms, 13.0);
}

TEST(SplitTest, AtLeastOnePromptTokenIsComputed) {
  // A 40-token prompt whose 10 hits cover 100 tokens: at most 3 blocks (30 tokens) are loaded.
  SplitInput in = Base(kAllDram, 1e12, 1e8);
  in.prompt_tokens = 40;
  EXPECT_EQ(ChooseSplit(in).load_blocks, 3u);
  in.prompt_tokens = 30;  // 3 blocks would leave nothing to compute
  EXPECT_EQ(ChooseSplit(in).load_blocks, 2u);
}

TEST(SplitTest, NoHitsRecomputes) {
  const Split s = ChooseSplit(Base({}, 1e12, 1e8));
  EXPECT_EQ(s.load_blocks, 0u);
  EXPECT_NEAR(s.ttft_ms, 4.04, 1e-9);
  EXPECT_NEAR(s.load_all_ms, 4.04, 1e-9);
}

}  // namespace
}  // namespace tutti::decision

// The advice never loses (issue 23 section 4): the two recorded failures fed to the meter and the
// compute model as those runs saw them, a sudden device slowdown, and a far-off measured TTFT.
// Figures: bench/results/e2e_ttft_grid.jsonl, e2e_compute_profile.jsonl and
// e2e_ttft_grid_throttled_2026-12-01c.log (H200, Llama-3-8B shape, 16-token blocks).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/datapath/bandwidth.h"
#include "daemon/decision/advisor.h"
#include "daemon/decision/split.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"

namespace tutti::decision {
namespace {

using datapath::BandwidthEstimate;
using datapath::BandwidthMeter;
using datapath::BandwidthOptions;
using datapath::Tier;

constexpr NamespaceId kNs = 1;
constexpr uint64_t kSession = 2;
constexpr uint32_t kUid = 1000;
// 32 layers; a 16-token block of one layer: K and V of 8 heads x 128 x bf16 = 64 KiB.
const NamespaceShape kShape{32, 16, 64 << 10};

// {T, K, layer_ms, overhead_ms}: the throttled run's profile (layer_compute_ms_ssdprof_*, the
// mean layer and the time outside the layers of one prefill each).
struct Profiled {
  uint32_t t, k;
  double layer_ms, overhead_ms;
};
const Profiled kThrottledProfile[] = {
    {2048, 0, 1.88, 1.27},       {4096, 0, 3.831, 1.63},      {4096, 512, 4.002, 1.45},
    {4096, 1024, 3.421, 1.47},   {4096, 2048, 2.34, 1.94},    {4096, 3072, 1.259, 1.49},
    {4096, 3680, 1.192, 1.04},   {4096, 4000, 1.211, 1.10},   {8192, 0, 8.034, 2.30},
    {16384, 0, 18.695, 2.49},    {16384, 2048, 26.361, 3.68}, {16384, 4096, 22.67, 3.34},
    {16384, 8192, 14.977, 3.97}, {16384, 12288, 7.498, 2.07}, {16384, 14736, 3.572, 1.88},
    {16384, 16048, 1.388, 1.46}, {32768, 0, 43.878, 9.73},    {32768, 4096, 79.73, 7.24},
    {32768, 8192, 68.713, 6.80}, {32768, 16384, 46.325, 6.02}, {32768, 24576, 23.574, 1.92},
    {32768, 29488, 9.753, 1.80}, {32768, 32112, 3.342, 1.52},
};

std::vector<ComputeSample> Samples(const Profiled* p, size_t n) {
  std::vector<ComputeSample> s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back({p[i].t - p[i].k, p[i].t, p[i].layer_ms, p[i].overhead_ms});
  }
  return s;
}

// A meter on a manual clock, its estimates as the server hands them to the advisor.
struct Meter {
  Meter() : meter(Options(this)) {}
  static BandwidthOptions Options(Meter* m) {
    BandwidthOptions o;
    o.ssd_prior_bytes_per_sec = 1e9;
    o.dram_prior_bytes_per_sec = 20e9;
    o.clock = [m] { return m->now; };
    return o;
  }
  // `n` Reads of `bytes` each at `bps`, one a second.
  void Reads(Tier tier, int n, uint64_t bytes, double bps) {
    for (int i = 0; i < n; ++i, now += 1) meter.Record(tier, bytes, bytes / bps);
  }
  Bandwidths Now() const {
    const BandwidthEstimate d = meter.Estimate(Tier::kDram), s = meter.Estimate(Tier::kSsd);
    return {d.bytes_per_sec, s.bytes_per_sec, d.low_bytes_per_sec, s.low_bytes_per_sec};
  }
  double now = 1000;
  BandwidthMeter meter;
};

// The measured side of a run: the TTFT each strategy ran in.
struct Measured {
  uint32_t split_k;  // the split the old advice took
  double split_ms, recompute_ms, load_all_ms;
  // The measured TTFT of `k` over the better pure one; 0 when `k` was not measured.
  double Ratio(uint32_t k, uint32_t kmax) const {
    const double best = std::min(recompute_ms, load_all_ms);
    if (k == 0) return recompute_ms / best;
    if (k == kmax) return load_all_ms / best;
    return k == split_k ? split_ms / best : 0;
  }
};

// A prompt of `t` tokens of kShape with `hits` (true: in the DRAM tier); the rest as SplitInput
// leaves it.
SplitInput ShapeInput(uint32_t t, std::vector<bool> hits) {
  SplitInput in;
  in.num_layers = kShape.num_layers;
  in.block_tokens = kShape.block_tokens;
  in.prompt_tokens = t;
  in.layer_bytes = kShape.layer_bytes;
  in.hit_in_dram = std::move(hits);
  return in;
}

// The split's inputs as a run's model had them: `overhead_ms`, per-layer compute `plain_ms` for
// the whole prompt and `prefixed_ms_per_token` per new token with a prefix (the fits near the
// point), the meter's figures and the profile's spreads.
SplitInput RunInput(uint32_t t, const std::vector<bool>& hits, const Bandwidths& bw,
                    double overhead_ms, double plain_ms, double prefixed_ms_per_token,
                    double min_gain) {
  SplitInput in = ShapeInput(t, hits);
  in.dram_bytes_per_sec = bw.dram_bytes_per_sec;
  in.ssd_bytes_per_sec = bw.ssd_bytes_per_sec;
  in.overhead_ms = overhead_ms;
  in.min_interior_gain = min_gain;
  in.layer_ms = [=](uint32_t c, uint32_t k) {
    return k == 0 ? plain_ms : prefixed_ms_per_token * (c - k);
  };
  return in;
}

// The uncertainty the new advice adds: the meter's low figures, the profile's spreads.
SplitInput Guarded(SplitInput in, const Bandwidths& bw, const ComputeModel& model) {
  in.dram_low_bytes_per_sec = bw.dram_low_bytes_per_sec;
  in.ssd_low_bytes_per_sec = bw.ssd_low_bytes_per_sec;
  in.recompute_spread = model.Spread(false);
  in.load_compute_spread = model.Spread(true);
  return in;
}

// A compute model fed one profile's samples.
template <size_t N>
ComputeModel ModelOf(const Profiled (&profile)[N]) {
  ComputeModel model;
  for (const ComputeSample& s : Samples(profile, N)) model.Add(s);
  return model;
}

// The throttled disk (cgroup io.max, 0.69 GB/s), T = 4096. The meter had seen the unthrottled
// load-alls (1.93 GB/s) and a few throttled ones: its mean, 0.96 GB/s, lagged the device. The
// run's model predicted recompute 139.9 ms (measured 124.0: 12 ms of overhead plus 4.0 ms a
// layer), a split of 47 blocks 121.5 ms (3.32 ms a layer for 3,344 new tokens), load-all 310.6.
TEST(RobustAdviceTest, ThrottledDiskAt4KNoLongerLoads) {
  Meter m;
  m.Reads(Tier::kSsd, 6, 2007ull * 32 * (64 << 10), 1.931e9);
  m.Reads(Tier::kSsd, 4, 2007ull * 32 * (64 << 10), 0.692e9);
  const Bandwidths bw = m.Now();
  EXPECT_NEAR(bw.ssd_bytes_per_sec, 0.96e9, 0.02e9);
  EXPECT_LE(bw.ssd_low_bytes_per_sec, 0.692e9) << "the newest read, or the spread, below it";
  const ComputeModel model = ModelOf(kThrottledProfile);
  // {hits, the old split and its measured TTFT, measured recompute and load-all}.
  for (const auto& [hits_n, measured] :
       {std::pair{128u, Measured{47, 196.503, 123.975, 390.78}},
        std::pair{230u, Measured{40, 143.754, 123.975, 696.16}},
        std::pair{250u, Measured{43, 144.084, 123.975, 723.97}}}) {
    SCOPED_TRACE(hits_n);
    const std::vector<bool> hits(hits_n, false);
    const SplitInput old_in = RunInput(4096, hits, bw, 12, 4.0, 3.32 / 3344, 0.1);
    const Split old_split = ChooseSplit(old_in);
    EXPECT_GE(old_split.load_blocks, 40u) << "the inputs reproduce the failure";
    EXPECT_LE(old_split.load_blocks, 50u);
    EXPECT_NEAR(old_split.recompute_ms, 139.9, 1);
    const Split s = ChooseSplit(Guarded(old_in, bw, model));
    const uint32_t kmax = static_cast<uint32_t>(hits.size());
    const double ratio = measured.Ratio(s.load_blocks, kmax);
    std::printf("T=4096 %u SSD hits: old k=%u (%.1f ms predicted), new k=%u [%.1f, %.1f] ms, "
                "measured/best pure %.3f\n",
                hits_n, old_split.load_blocks, old_split.ttft_ms, s.load_blocks, s.ttft_low_ms,
                s.ttft_high_ms, ratio);
    EXPECT_GT(ratio, 0) << "the new advice took a split no run measured: k=" << s.load_blocks;
    EXPECT_LE(ratio, 1.05);
  }
}

// The DRAM tier on the 2.5 GB/s disk, T = 32768 with 50% cached: the old advice (no minimum
// gain) took a split predicted 1,434 ms that ran 1,517; recompute ran 1,403 (predicted 1,450),
// load-all about 1,505.
TEST(RobustAdviceTest, DramHalfCachedAt32KNoLongerSplits) {
  Meter m;
  m.Reads(Tier::kDram, 20, 1024ull * 32 * (64 << 10), 15e9);
  const Bandwidths bw = m.Now();
  const ComputeModel model = ModelOf(kThrottledProfile);
  const std::vector<bool> hits(1024, true);
  // Prefixed compute 44.35 ms a layer at 16,384 new tokens, i.e. a split anywhere compute-bound.
  const SplitInput old_in = RunInput(32768, hits, bw, 12, (1450.0 - 12) / 32, 44.0 / 16384, 0);
  const Split old_split = ChooseSplit(old_in);
  // Here the old rule loads (a split or all of it; either ran >= 1.07x recomputing).
  EXPECT_GT(old_split.load_blocks, 0u) << "the inputs reproduce the failure";
  EXPECT_NEAR(old_split.ttft_ms, 1434, 15);
  const Measured measured{old_split.load_blocks, 1517, 1403, 1504.57};
  EXPECT_GT(measured.Ratio(old_split.load_blocks, 1024), 1.05);
  const Split s = ChooseSplit(Guarded(old_in, bw, model));
  const double ratio = measured.Ratio(s.load_blocks, 1024);
  std::printf("T=32768 1024 DRAM hits: old k=%u (%.1f ms predicted), new k=%u [%.1f, %.1f] ms, "
              "measured/best pure %.3f\n",
              old_split.load_blocks, old_split.ttft_ms, s.load_blocks, s.ttft_low_ms,
              s.ttft_high_ms, ratio);
  EXPECT_EQ(s.refused_load_blocks, old_split.load_blocks);
  // What the refused load had to beat and did not: its high end above recomputing's low end.
  EXPECT_GT(s.refused_high_ms, s.ttft_low_ms);
  EXPECT_GT(s.refused_high_ms, old_split.ttft_ms);
  EXPECT_GT(ratio, 0);
  EXPECT_LE(ratio, 1.05);
}

// The H200's DRAM grid (2026-12-03): the profile (23 samples, as above), then one prefill reported
// far off the rest (the grid's first stored prefix, 4,000 tokens at 4x the fit's time: a cold
// first prefill). The spread of plain compute went to kMaxSpread (tuttid logged 0.900), so
// recomputing's low end fell to a tenth of its prediction and every DRAM load was refused,
// although loading 90% of a 32K prompt ran 3.8x faster than recomputing (384 against 1,449 ms).
TEST(RobustAdviceTest, OneColdPrefillDoesNotHoldDramLoadsOff) {
  Meter m;
  m.Reads(Tier::kDram, 20, 1843ull * 32 * (64 << 10), 33.6e9);
  Advisor advisor(AdvisorOptions{true, 0.1, 0.1, 300, [&m] { return m.now; }, 0});
  const std::vector<ComputeSample> profile =
      Samples(kThrottledProfile, std::size(kThrottledProfile));
  ASSERT_TRUE(advisor.Report(kNs, kSession, kUid, profile, 0, 0).ok());
  const ComputeModel model = ModelOf(kThrottledProfile);
  const ComputeSample cold{4000, 4000, 4 * *model.LayerMs(4000, 0), 2};
  ASSERT_TRUE(advisor.Report(kNs, kSession, kUid, {cold}, 0, 0).ok());
  const std::vector<bool> dram(1843, true);
  const Advice a = advisor.Advise(kNs, kSession, kShape, 32768, dram, m.Now());
  std::printf("T=32768, 1843 DRAM hits after a cold prefill: k=%u %.1f [%.1f, %.1f] ms, "
              "recompute %.1f\n",
              a.load_blocks, a.ttft_ms, a.ttft_low_ms, a.ttft_high_ms, a.recompute_ms);
  EXPECT_EQ(a.load_blocks, 1843u);
  EXPECT_LT(a.ttft_high_ms, 0.5 * a.recompute_ms);
}

// The H200's SSD grid at T = 16384, 50% cached (2026-12-03) as the split's input: 512 hits on the
// virtio disk at 2.03 GB/s, the grid's compute profile; spreads and the pessimistic figure are
// the tests' own.
SplitInput Ssd16KHalfCached() {
  SplitInput in = ShapeInput(16384, std::vector<bool>(512, false));
  in.dram_bytes_per_sec = 20e9;
  in.ssd_bytes_per_sec = 2.03e9;
  in.overhead_ms = 3;
  in.min_interior_gain = 0.1;
  in.layer_ms = [](uint32_t t, uint32_t k) {
    return k == 0 ? 18.5 * t / 16384.0 : 15.28 * (t - k) / 8192.0;
  };
  return in;
}

// The H200's SSD grid at T = 16384, 50% cached (2026-12-03): the virtio disk at 2.03 GB/s, its
// newest Read at 1.81; loading all 512 hits predicted 546 ms (614 at 1.81 GB/s with the prefixed
// spread), recomputing 595 (583-607). The strict rule recomputed and ran 1.10x loading (598
// against 541 ms measured). Loading's worst case against recomputing is 1.05x, recomputing's
// against loading 1.11x: the pure strategy with the smaller worst case loads. With the disk's
// newest Read at half its mean (a device that may have slowed), loading's worst case is the
// larger one and the advice recomputes.
TEST(RobustAdviceTest, BetweenPureStrategiesTheSmallerWorstCaseWins) {
  SplitInput in = Ssd16KHalfCached();
  in.ssd_low_bytes_per_sec = 1.81e9;
  in.recompute_spread = 0.02;
  in.load_compute_spread = 0.152;
  const Split s = ChooseSplit(in);
  std::printf("T=16384, 512 SSD hits: k=%u %.1f [%.1f, %.1f] ms, recompute %.1f\n",
              s.load_blocks, s.ttft_ms, s.ttft_low_ms, s.ttft_high_ms, s.recompute_ms);
  EXPECT_EQ(s.load_blocks, 512u);
  EXPECT_NEAR(s.ttft_ms, 546, 10);
  EXPECT_NEAR(s.recompute_ms, 595, 10);
  EXPECT_GT(s.ttft_high_ms, s.recompute_ms * (1 - in.recompute_spread))
      << "loading does not win beyond the uncertainty: the strict rule would recompute";
  EXPECT_LT(s.ttft_high_ms / (s.recompute_ms * (1 - in.recompute_spread)), 1.06);

  in.ssd_low_bytes_per_sec = in.ssd_bytes_per_sec / 2;
  const Split slow = ChooseSplit(in);
  EXPECT_EQ(slow.load_blocks, 0u);
  EXPECT_EQ(slow.refused_load_blocks, 512u);
}

// The H200's grid profile of stop 33 (2026-12-03, bench/results/e2e_compute_profile.jsonl,
// layer_compute_ms_T*): {T, K, mean layer ms, ms outside the layers}.
const Profiled kGridProfileS33[] = {
    {2048, 0, 1.842, 1.81},      {4096, 0, 3.742, 2.40},      {4096, 512, 3.913, 1.69},
    {4096, 1024, 3.33, 2.14},    {4096, 2048, 2.295, 1.18},   {4096, 3072, 1.252, 1.17},
    {4096, 3680, 1.407, 1.20},   {4096, 4000, 0.903, 1.01},   {8192, 0, 7.88, 2.42},
    {16384, 0, 18.106, 4.52},    {16384, 2048, 25.993, 2.69}, {16384, 4096, 22.294, 4.18},
    {16384, 8192, 14.548, 3.36}, {16384, 12288, 7.438, 1.73}, {16384, 14736, 3.595, 2.10},
    {16384, 16048, 1.386, 1.49}, {32768, 0, 42.974, 6.75},    {32768, 4096, 79.058, 7.11},
    {32768, 8192, 67.595, 6.24}, {32768, 16384, 45.356, 5.07}, {32768, 24576, 23.065, 2.85},
    {32768, 29488, 9.664, 1.77}, {32768, 32112, 3.365, 2.04},
};

// The split's inputs as tuttid had them at a grid point of stop 33: the grid profile's model, the
// meter's figures, the recompute side's correction (1.013 in the refusal line).
SplitInput S33Input(const ComputeModel& model, uint32_t t, const std::vector<bool>& hits,
                    double ssd_bps, double ssd_low_bps) {
  SplitInput in = ShapeInput(t, hits);
  in.dram_bytes_per_sec = 20e9;
  in.ssd_bytes_per_sec = ssd_bps;
  in.ssd_low_bytes_per_sec = ssd_low_bps;
  in.overhead_ms = model.OverheadMs();
  in.min_interior_gain = 0.1;  // datapath.decision_min_gain's default
  in.recompute_spread = model.Spread(false);
  in.load_compute_spread = model.Spread(true);
  in.recompute_scale = 1.013;
  in.layer_ms = [&model](uint32_t c, uint32_t k) { return model.LayerMs(c, k).value_or(0); };
  return in;
}

void PrintCandidates(const Split& s) {
  for (uint32_t i = 0; i < s.num_candidates; ++i) {
    const SplitCandidate& c = s.candidates[i];
    std::printf("  candidate k=%u: %.1f [%.1f, %.1f] ms, worst-case regret %.3f\n", c.load_blocks,
                c.ttft_ms, c.low_ms, c.high_ms, c.regret);
  }
}

// The H200's SSD grid at T = 16384, 50% cached (stop 33): the central best loaded 456 of 512 hits,
// predicted 511.0 ms with its high end at 588.0, recomputing 579.8 (568.2-591.3), the SSD at 1.94
// GB/s (low 1.72) and the compute spreads 0.020 / 0.152 (tuttid's refusal line). The rule of that
// run refused the split and recomputed: 596 ms, while loading all ran 543 (1.098x). The split's
// worst case is 588 against recomputing's best, 568.2 (1.035x); recomputing's is 591.3 against the
// split's 511 (1.156x); loading all's, at the pessimistic bandwidth, larger still. The minimax rule
// takes the split.
TEST(RobustAdviceTest, MinimaxTakesTheSplitAtSsd16KHalfCached) {
  const ComputeModel model = ModelOf(kGridProfileS33);
  const SplitInput in = S33Input(model, 16384, std::vector<bool>(512, false), 1.94e9, 1.72e9);
  const Split s = ChooseSplit(in);
  std::printf("T=16384, 512 SSD hits (stop 33): k=%u %.1f [%.1f, %.1f] ms, recompute %.1f, "
              "load-all %.1f\n",
              s.load_blocks, s.ttft_ms, s.ttft_low_ms, s.ttft_high_ms, s.recompute_ms,
              s.load_all_ms);
  PrintCandidates(s);
  // The inputs reproduce the run's figures.
  EXPECT_NEAR(in.recompute_spread, 0.020, 0.0005);
  EXPECT_NEAR(in.load_compute_spread, 0.152, 0.0005);
  ASSERT_EQ(s.num_candidates, 3u);
  const SplitCandidate& recompute = s.candidates[0];
  const SplitCandidate& load_all = s.candidates[1];
  const SplitCandidate& split = s.candidates[2];
  EXPECT_EQ(load_all.load_blocks, 512u);
  EXPECT_NEAR(split.load_blocks, 456, 4);
  EXPECT_NEAR(split.ttft_ms, 511.0, 2);
  EXPECT_NEAR(split.high_ms, 588.0, 2);
  EXPECT_NEAR(recompute.ttft_ms, 579.8, 1);
  EXPECT_NEAR(recompute.low_ms, 568.2, 1);
  EXPECT_NEAR(recompute.high_ms, 591.3, 1);
  // The split does not win beyond the uncertainty: the rule of that run refused it.
  EXPECT_GT(split.high_ms, recompute.low_ms);
  // Minimax regret: the split's worst case is the least, by far more than a near tie.
  EXPECT_NEAR(split.regret, 588.0 / 568.2, 0.005);
  EXPECT_NEAR(recompute.regret, 591.3 / 511.0, 0.005);
  EXPECT_GT(load_all.regret, recompute.regret);
  EXPECT_NE(s.load_blocks, 0u) << "recomputing ran 1.098x loading all";
  EXPECT_EQ(s.load_blocks, split.load_blocks);
  EXPECT_EQ(s.refused_load_blocks, 0u);
  // The run's rule weighed the two pure strategies alone: loading all's worst case against
  // recomputing (643.6 / 568.1) above recomputing's against loading all (591.2 / 570.7).
  EXPECT_GT(load_all.high_ms / recompute.low_ms, recompute.high_ms / load_all.low_ms);
}

// The same point with the disk's newest Read at half its mean (a device that may have slowed):
// the split's worst case is then clearly the larger, and the advice recomputes, the split logged
// as refused.
TEST(RobustAdviceTest, MinimaxStillRecomputesWhereLoadingsWorstCaseIsWorse) {
  const ComputeModel model = ModelOf(kGridProfileS33);
  const std::vector<bool> hits(512, false);
  for (const double low : {0.97e9, 1.2e9}) {
    SCOPED_TRACE(low);
    const Split s = ChooseSplit(S33Input(model, 16384, hits, 1.94e9, low));
    std::printf("T=16384, 512 SSD hits, SSD low %.2f GB/s: k=%u\n", low / 1e9, s.load_blocks);
    PrintCandidates(s);
    ASSERT_EQ(s.num_candidates, 3u);
    EXPECT_EQ(s.load_blocks, 0u);
    EXPECT_EQ(s.refused_load_blocks, s.candidates[2].load_blocks);
    EXPECT_GT(s.candidates[2].regret, 1.01 * s.candidates[0].regret);
  }
}

// The H200's DRAM grid at T = 4096, 90% cached (stop 33): advised 38.7 ms against load-all's 36.3
// (1.066). The advice loaded all 230 hits: the same strategy as the load-all runs, whose runs
// spread 36.3-46.2 ms (the advised ones 38.7-45.4), so the ratio is between the minima of four runs
// each of one strategy. tuttid predicted loading all 41.10 ms there (42.88 at 98%, 250 hits, where
// load-all ran 37.1-51.3): with the grid's profile that is a DRAM figure of about 13.0 (13.4) GB/s.
// At it the advice loads everything beyond the uncertainty (worst-case regret below 1; recomputing
// about 3x slower), and loading all is predicted above the fastest measured run: the load side is
// over-predicted at small T, not under, so no fixed per-load cost missing from it (the Retrieve's
// round trip, under a millisecond; the Lookup is paid by either strategy) made loading look better
// than it is, and adding one would change no choice here.
TEST(RobustAdviceTest, DramAt4KLoadsEverythingBeyondTheUncertainty) {
  const ComputeModel model = ModelOf(kGridProfileS33);
  struct Point {
    uint32_t hits;
    double dram_bps, predicted_ms, fastest_load_all_ms;
  };
  for (const Point& p : {Point{230, 13.0e9, 41.10, 36.33}, Point{250, 13.4e9, 42.88, 37.09}}) {
    SCOPED_TRACE(p.hits);
    SplitInput in = S33Input(model, 4096, std::vector<bool>(p.hits, true), 1.94e9, 1.72e9);
    in.dram_bytes_per_sec = p.dram_bps;
    const Split s = ChooseSplit(in);
    std::printf("T=4096, %u DRAM hits at %.2f GB/s: k=%u %.1f [%.1f, %.1f] ms, recompute %.1f\n",
                p.hits, p.dram_bps / 1e9, s.load_blocks, s.ttft_ms, s.ttft_low_ms, s.ttft_high_ms,
                s.recompute_ms);
    EXPECT_NEAR(s.load_all_ms, p.predicted_ms, 0.2) << "the inputs reproduce the prediction";
    EXPECT_EQ(s.load_blocks, p.hits);
    EXPECT_EQ(s.refused_load_blocks, 0u);
    ASSERT_EQ(s.num_candidates, 2u);
    EXPECT_LT(s.candidates[1].regret, 0.5);
    EXPECT_GT(s.recompute_ms, 2.5 * s.load_all_ms);
    EXPECT_GT(s.load_all_ms, 1.1 * p.fastest_load_all_ms);
  }
}

// Where the central best is a pure strategy the candidates are the two pure ones and the choice is
// that of 621d027 (loading all if it wins beyond the uncertainty, or wins centrally with the
// smaller worst-case ratio), but for near ties: where loading all's worst case is within
// kRegretNearTie of recomputing's, recomputing. Swept over the disk's pessimistic figure (1 MB/s
// steps) and the spreads, at the point of BetweenPureStrategiesTheSmallerWorstCaseWins.
TEST(RobustAdviceTest, BetweenPureStrategiesTheRuleIsUnchangedButForNearTies) {
  SplitInput in = Ssd16KHalfCached();
  int loads = 0, recomputes = 0, near_ties = 0;
  for (const double recompute_spread : {0.0, 0.02, 0.05}) {
    for (const double load_spread : {0.0, 0.152}) {
      for (int mbps = 2030; mbps >= 1500; --mbps) {
        in.recompute_spread = recompute_spread;
        in.load_compute_spread = load_spread;
        in.ssd_low_bytes_per_sec = mbps * 1e6;
        const Split s = ChooseSplit(in);
        ASSERT_EQ(s.num_candidates, 2u) << "the central best is a pure strategy";
        const SplitCandidate& r = s.candidates[0];
        const SplitCandidate& a = s.candidates[1];
        // 621d027's rule.
        const bool old_loads = a.high_ms <= r.low_ms ||
                               (a.ttft_ms < r.ttft_ms &&
                                a.high_ms / r.low_ms < r.high_ms / a.low_ms);
        const bool near_tie = a.regret > 1 && a.regret < r.regret &&
                              a.regret * (1 + kRegretNearTie) >= r.regret;
        SCOPED_TRACE(testing::Message() << "spreads " << recompute_spread << " / " << load_spread
                                        << ", SSD low " << mbps << " MB/s");
        EXPECT_EQ(s.load_blocks, old_loads && !near_tie ? 512u : 0u);
        loads += s.load_blocks > 0;
        recomputes += s.load_blocks == 0;
        near_ties += near_tie;
      }
    }
  }
  std::printf("pure strategies: %d loads, %d recomputes, %d near ties recomputed\n", loads,
              recomputes, near_ties);
  EXPECT_GT(loads, 0);
  EXPECT_GT(recomputes, 0);
  EXPECT_GT(near_ties, 0);
}

// Compute 0.001 ms per token and layer (8.2 ms a layer for 8,192 tokens), 500 SSD hits of 64 KiB
// a layer each. At 0.8 GB/s the best split (about 66 blocks, loads overlapping compute) is
// predicted 16% faster than recomputing; at 0.4 GB/s 9%, under the 10% an interior split needs;
// loading all of them always loses. The advisor is fed through the meter as the server feeds it.
struct Live {
  // Exploration off unless asked: these cases show the safe choice itself.
  explicit Live(double explore_every_s = 0)
      : advisor(AdvisorOptions{true, 0.1, 0.1, 300, [this] { return m.now; }, explore_every_s}) {
    std::vector<ComputeSample> samples;
    for (uint32_t t : {1024u, 2048u, 4096u, 8192u}) {
      for (uint32_t k : {0u, t / 4, t / 2}) samples.push_back({t - k, t, 0.001 * (t - k), 2});
    }
    EXPECT_TRUE(advisor.Report(kNs, kSession, kUid, samples, 0, 0).ok());
  }
  Advice Advise() {
    return advisor.Advise(kNs, kSession, kShape, 8192, std::vector<bool>(500, false), m.Now());
  }
  Meter m;
  Advisor advisor;
};

constexpr uint64_t kReadBytes = 500ull * 32 * (64 << 10);

TEST(RobustAdviceTest, ASuddenSlowdownMovesTheAdviceToRecomputeWithinOneSample) {
  Live live;
  live.m.Reads(Tier::kSsd, 20, kReadBytes, 0.8e9);  // the device, steady
  Advice a = live.Advise();
  std::printf("fast: k=%u %.1f [%.1f, %.1f] recompute %.1f\n", a.load_blocks, a.ttft_ms,
              a.ttft_low_ms, a.ttft_high_ms, a.recompute_ms);
  ASSERT_GT(a.load_blocks, 0u) << "loading wins beyond the uncertainty";
  live.m.Reads(Tier::kSsd, 1, kReadBytes, 0.2e9);  // one read at a quarter of the rate
  a = live.Advise();
  std::printf("after one slow read: k=%u %.1f [%.1f, %.1f] recompute %.1f\n", a.load_blocks,
              a.ttft_ms, a.ttft_low_ms, a.ttft_high_ms, a.recompute_ms);
  EXPECT_EQ(a.load_blocks, 0u);
}

// The refusal line (at most one a second) names the candidates weighed and their worst-case
// regrets, the figures that decided.
TEST(RobustAdviceTest, TheRefusalLineGivesTheCandidatesAndTheirRegrets) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  const std::shared_ptr<spdlog::logger> logger = log::Get("decision");
  logger->sinks().push_back(sink);
  Live live;
  live.m.Reads(Tier::kSsd, 20, kReadBytes, 0.8e9);
  live.m.Reads(Tier::kSsd, 1, kReadBytes, 0.2e9);  // one slow read: the split is refused
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // past an earlier test's line
  const Advice a = live.Advise();
  logger->sinks().pop_back();
  ASSERT_GT(a.refused_load_blocks, 0u);
  const std::string line = out.str();
  std::printf("%s", line.c_str());
  EXPECT_NE(line.find("refused for its uncertainty"), std::string::npos) << line;
  EXPECT_NE(line.find("minimax regret over the candidates 0: "), std::string::npos) << line;
  EXPECT_NE(line.find("; 500: "), std::string::npos) << "loading all" << line;
  EXPECT_NE(line.find(absl::StrCat("; ", a.refused_load_blocks, ": ")), std::string::npos)
      << "the refused split" << line;
  EXPECT_NE(line.find("worst-case regret "), std::string::npos) << line;
}

// At debug, every decision is logged with what it saw (off at the default level).
TEST(RobustAdviceTest, EachDecisionIsLoggedAtDebugWithItsInputs) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  const std::shared_ptr<spdlog::logger> logger = log::Get("decision");
  logger->sinks().push_back(sink);
  const spdlog::level::level_enum was = logger->level();
  Live live;
  live.m.Reads(Tier::kSsd, 20, kReadBytes, 0.8e9);
  logger->set_level(spdlog::level::info);
  live.Advise();
  EXPECT_EQ(out.str().find("advised"), std::string::npos) << "not at info";
  logger->set_level(spdlog::level::debug);
  const Advice a = live.Advise();
  logger->set_level(was);
  logger->sinks().pop_back();
  const std::string line = out.str();
  std::printf("%s", line.c_str());
  EXPECT_NE(line.find(absl::StrCat("decision ", a.decision_id, " advised ", a.load_blocks,
                                   " of 500 hits for 8192 tokens")),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("SSD 0.80 GB/s"), std::string::npos) << line;
  EXPECT_NE(line.find("loading 500 "), std::string::npos) << "loading all" << line;
  EXPECT_NE(line.find("candidates 0: "), std::string::npos) << line;
}

TEST(RobustAdviceTest, AWriteBacklogMovesTheAdviceToRecomputeBeforeAnySample) {
  Live live;
  live.m.Reads(Tier::kSsd, 20, kReadBytes, 0.8e9);
  ASSERT_GT(live.Advise().load_blocks, 0u);
  live.m.meter.SetWriteBacklog(1ull << 30);  // a store stream: half the device, by the prior
  EXPECT_EQ(live.Advise().load_blocks, 0u);
  live.m.meter.SetWriteBacklog(0);
  EXPECT_GT(live.Advise().load_blocks, 0u);
}

TEST(RobustAdviceTest, AFarOffTtftCorrectsTheNextAdvice) {
  Live live;
  live.m.Reads(Tier::kSsd, 20, kReadBytes, 0.8e9);
  const Advice a = live.Advise();
  ASSERT_GT(a.load_blocks, 0u);
  // Another uid's engine in a shared namespace reports its own decision's TTFT: no correction.
  const Advice b = live.advisor.Advise(kNs, kSession + 1, kShape, 8192,
                                       std::vector<bool>(500, false), live.m.Now());
  ASSERT_TRUE(live.advisor.Report(kNs, kSession + 1, kUid + 1, {}, b.decision_id,
                                  3 * b.ttft_ms).ok());
  EXPECT_GT(live.Advise().load_blocks, 0u);
  EXPECT_EQ(live.advisor.Stats().corrections, 0u);
  // The owner's engine measured the load at 3x its prediction: the next advice recomputes.
  auto r = live.advisor.Report(kNs, kSession, kUid, {}, a.decision_id, 3 * a.ttft_ms);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->prediction_error, 2.0 / 3, 1e-9);
  const Advice c = live.Advise();
  EXPECT_EQ(c.load_blocks, 0u);
  EXPECT_EQ(live.advisor.Stats().corrections, 1u);
  // The correction fades: an hour later (12 half-lives) loading is tried again.
  live.m.now += 3600;
  live.m.Reads(Tier::kSsd, 1, kReadBytes, 0.8e9);
  EXPECT_GT(live.Advise().load_blocks, 0u);
}

// A far-off TTFT corrects the predictions of prompts like its own (a power of two of tokens, a
// quarter of the prompt loaded), not the others': the H200's DRAM grid (stop 36) swung one scale
// for every DRAM-tier load from 0.52x to 1.35x as its points changed (each point's first run
// corrected it for the next point's prompts, which the model erred on the other way).
TEST(RobustAdviceTest, AFarOffTtftCorrectsOnlyPromptsLikeItsOwn) {
  Live live;
  live.m.Reads(Tier::kSsd, 20, kReadBytes, 0.8e9);
  const auto advise = [&live](uint32_t prompt, uint32_t hits) {
    return live.advisor.Advise(kNs, kSession, kShape, prompt, std::vector<bool>(hits, false),
                               live.m.Now());
  };
  // 8192 tokens, 500 of 512 blocks hit: an interior split of under a quarter of the prompt.
  const Advice a = live.Advise();
  ASSERT_GT(a.load_blocks, 0u);
  ASSERT_LT(a.load_blocks, 128u);
  const Advice shorter = advise(4096, 250);  // another size class
  const Advice half = advise(8192, 200);     // loading all: another share class (200 of 512)
  const Advice more = advise(8200, 100);     // loading all: the same classes as `a`
  ASSERT_TRUE(live.advisor.Report(kNs, kSession, kUid, {}, a.decision_id, 3 * a.ttft_ms).ok());
  EXPECT_EQ(live.advisor.Stats().corrections, 1u);
  EXPECT_EQ(live.Advise().load_blocks, 0u) << "the same prompt now recomputes";
  EXPECT_NEAR(advise(8200, 100).load_all_ms, 3 * more.load_all_ms, 1e-6 * more.load_all_ms);
  EXPECT_DOUBLE_EQ(advise(4096, 250).load_all_ms, shorter.load_all_ms);
  EXPECT_DOUBLE_EQ(advise(8192, 200).load_all_ms, half.load_all_ms);
  EXPECT_DOUBLE_EQ(advise(8192, 200).recompute_ms, half.recompute_ms) << "nor recomputing";
}

// Advice held off loading by its uncertainty alone reads nothing, so nothing would narrow it: at
// most once every explore_every_s it loads the central choice instead, and the read that follows
// lets the meter see the device is fast; loading then stands on its own.
TEST(RobustAdviceTest, RefusedLoadsAreExploredAtMostOncePerPeriod) {
  Live live(/*explore_every_s=*/30);
  live.m.Reads(Tier::kSsd, 20, kReadBytes, 0.8e9);
  live.m.Reads(Tier::kSsd, 1, kReadBytes, 0.2e9);  // one slow read: refused from now on
  const Advice first = live.Advise();
  EXPECT_TRUE(first.exploring);
  EXPECT_EQ(first.load_blocks, first.refused_load_blocks);
  EXPECT_GT(first.load_blocks, 0u);
  const Advice second = live.Advise();  // within the period: the safe choice
  EXPECT_FALSE(second.exploring);
  EXPECT_EQ(second.load_blocks, 0u);
  EXPECT_EQ(live.advisor.Stats().explorations, 1u);
  // Each explored load reads at the device's real rate; a refusal within a period recomputes.
  // Within a bounded number of periods the meter is sure again and loading stands on its own.
  live.m.Reads(Tier::kSsd, 1, kReadBytes, 0.8e9);  // the first exploration's read
  int periods = 1;
  for (; periods < 20; ++periods) {
    const Advice after = live.Advise();
    if (!after.exploring && after.load_blocks > 0) break;  // sure enough again
    EXPECT_EQ(after.load_blocks, 0u) << "period " << periods << ": explored already";
    live.m.now += 30;
    const Advice a = live.Advise();
    ASSERT_TRUE(a.exploring) << "period " << periods << ": a refusal explores once per period";
    live.m.Reads(Tier::kSsd, 1, kReadBytes, 0.8e9);
  }
  std::printf("loading stands on its own after %d explored reads\n", periods);
  EXPECT_LT(periods, 20);
  EXPECT_EQ(live.advisor.Stats().explorations, static_cast<uint64_t>(periods));
}

// The H200's DRAM grid of stop 34 (bench/results/e2e_ttft_grid_2026-12-03_s34.log): the advice
// loaded all hits at each point, but the prediction was off by 0.31 and 0.44 at T = 4K (90%, 98%
// cached: predicted 52.7 and 50.2 ms, measured 40.1 and 34.8) and by 0.137 and 0.132 at 16K and
// 32K with 98% (72.2 and 160.8 against 83.7 and 185.2). The profile is that run's
// (layer_compute_ms_T*_k*; its overheads are not in the log: stop 33's, 2.9 ms on average) with
// its three stored prefixes reported after it, the first a cold prefill (4,000 tokens at 20.2 ms a
// layer, 5x the fit): it is trimmed from the plain fit and no load's prediction uses the plain fit,
// so the compute side is not the cause. The load side is: with the model's compute, the logged
// predictions are bytes over one DRAM figure of 9.8, 11.2, 30.8 and 27.1 GB/s (the meter's mean
// then, times the load side's correction), while the measured TTFTs ran at 13.3, 16.7, 26.4 and
// 23.4 GB/s in effect: the smaller the load, the lower its rate, which no one rate fits. A Read's
// fixed part (~9.3 ms) and a marginal rate (~27 GB/s) fit all eight measured DRAM loads of the
// grid within 9%; the meter fits them from Reads of different sizes (bandwidth.h), and the split
// adds the fixed part once to a DRAM-only load (split.h).
const Profiled kGridProfileS34[] = {
    {2048, 0, 1.868, 1.81},      {4096, 0, 3.825, 2.40},      {4096, 512, 3.999, 1.69},
    {4096, 1024, 3.38, 2.14},    {4096, 2048, 2.311, 1.18},   {4096, 3072, 1.258, 1.17},
    {4096, 3680, 0.773, 1.20},   {4096, 4000, 0.752, 1.01},   {8192, 0, 8.017, 2.42},
    {16384, 0, 18.203, 4.52},    {16384, 2048, 26.236, 2.69}, {16384, 4096, 22.547, 4.18},
    {16384, 8192, 14.864, 3.36}, {16384, 12288, 7.531, 1.73}, {16384, 14736, 3.593, 2.10},
    {16384, 16048, 1.394, 1.49}, {32768, 0, 43.8, 6.75},      {32768, 4096, 79.87, 7.11},
    {32768, 8192, 68.62, 6.24},  {32768, 16384, 46.139, 5.07}, {32768, 24576, 23.466, 2.85},
    {32768, 29488, 9.822, 1.77}, {32768, 32112, 3.361, 2.04},
};

ComputeModel S34Model() {
  ComputeModel model = ModelOf(kGridProfileS34);
  // The stored prefixes' prefills ("stored ... (prefill: X ms a layer, reported)").
  model.Add({4000, 4000, 20.176, 2});
  model.Add({16048, 16048, 18.226, 2});
  model.Add({32112, 32112, 42.941, 2});
  return model;
}

SplitInput S34Input(const ComputeModel& model, uint32_t t, uint32_t hits, const Bandwidths& bw) {
  SplitInput in = ShapeInput(t, std::vector<bool>(hits, true));
  in.dram_bytes_per_sec = bw.dram_bytes_per_sec;
  in.dram_low_bytes_per_sec = bw.dram_low_bytes_per_sec;
  in.dram_fixed_ms = bw.dram_fixed_ms;
  in.ssd_bytes_per_sec = 2e9;
  in.overhead_ms = model.OverheadMs();
  in.min_interior_gain = 0.1;
  in.recompute_spread = model.Spread(false);
  in.load_compute_spread = model.Spread(true);
  in.layer_ms = [&model](uint32_t c, uint32_t k) { return model.LayerMs(c, k).value_or(0); };
  return in;
}

struct S34Point {
  uint32_t t, hits;
  double logged_dram_bps, predicted_ms, measured_ms;
};
// The four points, with the DRAM figure the logged prediction implies (above).
const S34Point kS34Points[] = {
    {4096, 230, 9.8e9, 52.727, 40.1},
    {4096, 250, 11.2e9, 50.201, 34.842},
    {16384, 1003, 30.8e9, 72.247, 83.696},
    {32768, 2007, 27.1e9, 160.77, 185.193},
};

TEST(RobustAdviceTest, DramGridS34ReproducedWithOneRate) {
  const ComputeModel model = S34Model();
  EXPECT_EQ(model.Trimmed(false), 1u) << "the cold prefill leaves the plain fit";
  EXPECT_EQ(model.Trimmed(true), 0u);
  for (const S34Point& p : kS34Points) {
    SCOPED_TRACE(p.hits);
    const Bandwidths bw{p.logged_dram_bps, 2e9};
    const double predicted = PredictTtftMs(S34Input(model, p.t, p.hits, bw), p.hits);
    std::printf("T=%u, %u DRAM hits at one rate %.1f GB/s: predicted %.1f ms (logged %.1f), "
                "measured %.1f: error %.3f\n",
                p.t, p.hits, p.logged_dram_bps / 1e9, predicted, p.predicted_ms, p.measured_ms,
                std::fabs(predicted - p.measured_ms) / p.measured_ms);
    EXPECT_NEAR(predicted, p.predicted_ms, 0.01 * p.predicted_ms);
    EXPECT_GT(std::fabs(predicted - p.measured_ms) / p.measured_ms, 0.13);
  }
}

// The grid's DRAM Reads fed to the meter in the grid's order (32K, 16K, 4K; 50, 90, 98% cached;
// load-all and advised alternating, runs + 1 of each, twice the runs where recomputing is under
// 250 ms), each taking the fit's 9.3 ms + its bytes at 27 GB/s, 6% slower and faster by turns
// (runs of one point spread more on the H200; the meter takes their weighted mean). At each of
// the four points, after its warm-up Reads, the advice loads all and its prediction is within 15%
// of the measured TTFT; one rate from the same Reads is not.
TEST(RobustAdviceTest, DramGridS34WithinFifteenPercentWithAFixedPart) {
  const ComputeModel model = S34Model();
  Meter m;
  constexpr double kFixedS = 9.3e-3, kRate = 27e9;
  struct Point {
    uint32_t t, hits;
    int runs;
  };
  const Point grid[] = {{32768, 1024, 3}, {32768, 1843, 3}, {32768, 2007, 3},
                        {16384, 512, 3},  {16384, 921, 6},  {16384, 1003, 6},
                        {4096, 128, 6},   {4096, 230, 6},   {4096, 250, 6}};
  int jitter = 0;
  auto read = [&](uint32_t hits) {
    const uint64_t bytes = uint64_t{hits} * kShape.num_layers * kShape.layer_bytes;
    const double seconds = (kFixedS + bytes / kRate) * (jitter++ % 2 == 0 ? 1.06 : 0.94);
    m.meter.Record(Tier::kDram, bytes, seconds);
    m.now += 1;
  };
  for (const Point& g : grid) {
    read(g.hits);  // the warm-up's load-all and advised Reads
    read(g.hits);
    for (const S34Point& p : kS34Points) {
      if (p.t != g.t || p.hits != g.hits) continue;
      SCOPED_TRACE(p.hits);
      const BandwidthEstimate d = m.meter.Estimate(Tier::kDram);
      ASSERT_GT(d.fixed_seconds, 0);
      const Bandwidths bw{d.marginal_bytes_per_sec, 2e9,
                          d.low_bytes_per_sec * d.marginal_bytes_per_sec / d.bytes_per_sec, 0,
                          1e3 * d.fixed_seconds};
      const Split s = ChooseSplit(S34Input(model, p.t, p.hits, bw));
      const Bandwidths one_rate{d.bytes_per_sec, 2e9};
      const double before = PredictTtftMs(S34Input(model, p.t, p.hits, one_rate), p.hits);
      const double error = std::fabs(s.ttft_ms - p.measured_ms) / p.measured_ms;
      std::printf("T=%u, %u DRAM hits: fixed %.1f ms + %.1f GB/s: k=%u predicted %.1f ms "
                  "[%.1f, %.1f], measured %.1f: error %.3f (logged %.1f; one rate %.1f GB/s "
                  "from the same Reads: %.1f, error %.3f)\n",
                  p.t, p.hits, 1e3 * d.fixed_seconds, d.marginal_bytes_per_sec / 1e9,
                  s.load_blocks, s.ttft_ms, s.ttft_low_ms, s.ttft_high_ms, p.measured_ms, error,
                  p.predicted_ms, d.bytes_per_sec / 1e9, before,
                  std::fabs(before - p.measured_ms) / p.measured_ms);
      EXPECT_NEAR(1e3 * d.fixed_seconds, 9.3, 1.5);
      EXPECT_NEAR(d.marginal_bytes_per_sec, kRate, 0.1 * kRate);
      EXPECT_EQ(s.load_blocks, p.hits) << "the advice loaded all, as in the run";
      EXPECT_LE(error, 0.15);
    }
    for (int i = 0; i < 2 * g.runs; ++i) read(g.hits);
  }
}

}  // namespace
}  // namespace tutti::decision

#include "daemon/datapath/bandwidth.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

// A meter on a manual clock (seconds).
struct Meter {
  explicit Meter(BandwidthOptions o) : meter((o.clock = [this] { return now; }, o)) {}
  double now = 100;
  BandwidthMeter meter;
};

BandwidthOptions Small() {
  BandwidthOptions o;
  o.dram_prior_bytes_per_sec = 50e9;
  o.ssd_prior_bytes_per_sec = 1e9;
  o.min_sample_bytes = 1000;
  o.prior_spread = 0.5;  // an uncertain prior, so the cases below see the spread fade
  return o;
}

TEST(BandwidthMeterTest, PriorUntilTheFirstSampleThenWeightedMean) {
  BandwidthOptions o = Small();
  o.alpha = 0.5;
  Meter m(o);
  EXPECT_DOUBLE_EQ(m.meter.BytesPerSecond(Tier::kSsd), 1e9);
  EXPECT_DOUBLE_EQ(m.meter.BytesPerSecond(Tier::kDram), 50e9);
  m.meter.Record(Tier::kSsd, 4000, 2e-6);  // 2 GB/s: the first sample replaces the prior
  EXPECT_DOUBLE_EQ(m.meter.BytesPerSecond(Tier::kSsd), 2e9);
  m.meter.Record(Tier::kSsd, 4000, 1e-6);  // 4 GB/s, weight 0.5 (no time has passed)
  EXPECT_DOUBLE_EQ(m.meter.BytesPerSecond(Tier::kSsd), 3e9);
  EXPECT_NEAR(m.meter.Get(Tier::kSsd).spread, std::sqrt(0.5 * 0.25 + 0.5 * 1.0), 1e-12);
  EXPECT_EQ(m.meter.Get(Tier::kSsd).samples, 2u);
  EXPECT_EQ(m.meter.Get(Tier::kSsd).bytes, 8000u);
  EXPECT_DOUBLE_EQ(m.meter.BytesPerSecond(Tier::kDram), 50e9);  // tiers are separate
}

TEST(BandwidthMeterTest, SmallOrTimelessSamplesAreIgnored) {
  Meter m(Small());
  m.meter.Record(Tier::kSsd, 999, 1e-9);
  m.meter.Record(Tier::kSsd, 5000, 0);
  m.meter.Record(Tier::kSsd, 5000, -1);
  EXPECT_EQ(m.meter.Get(Tier::kSsd).samples, 0u);
  EXPECT_DOUBLE_EQ(m.meter.BytesPerSecond(Tier::kSsd), 1e9);
}

TEST(BandwidthMeterTest, AnUncertainPriorLowersTheLowFigure) {
  Meter m(Small());
  const BandwidthEstimate e = m.meter.Estimate(Tier::kSsd);
  EXPECT_DOUBLE_EQ(e.bytes_per_sec, 1e9);
  EXPECT_DOUBLE_EQ(e.spread, 0.5);
  EXPECT_DOUBLE_EQ(e.low_bytes_per_sec, 0.5e9);
  // By default the configured prior is taken as stated.
  Meter plain(BandwidthOptions{});
  EXPECT_DOUBLE_EQ(plain.meter.Estimate(Tier::kSsd).spread, 0);
  EXPECT_DOUBLE_EQ(plain.meter.Estimate(Tier::kSsd).low_bytes_per_sec,
                   BandwidthOptions{}.ssd_prior_bytes_per_sec);
}

TEST(BandwidthMeterTest, OldEvidenceFadesWithTime) {
  Meter m(Small());  // alpha 0.3, half-life 30 s
  m.meter.Record(Tier::kSsd, 2000, 1e-6);  // 2 GB/s
  m.now += 300;                            // ten half-lives later
  m.meter.Record(Tier::kSsd, 700, 1e-6);   // too small: ignored
  m.meter.Record(Tier::kSsd, 1000, 1e-6);  // 1 GB/s
  const double keep = 0.7 / 1024;
  EXPECT_NEAR(m.meter.BytesPerSecond(Tier::kSsd), keep * 2e9 + (1 - keep) * 1e9, 1);
}

TEST(BandwidthMeterTest, OneSlowReadPullsTheLowFigureDownAtOnce) {
  Meter m(Small());
  for (int i = 0; i < 20; ++i) m.meter.Record(Tier::kSsd, 2000, 1e-6);  // 2 GB/s, steady
  BandwidthEstimate e = m.meter.Estimate(Tier::kSsd);
  EXPECT_NEAR(e.bytes_per_sec, 2e9, 1);
  EXPECT_LT(e.spread, 0.02);  // the prior's 0.5, faded by 0.7 per sample
  EXPECT_NEAR(e.low_bytes_per_sec, 2e9, 4e7);
  m.meter.Record(Tier::kSsd, 690, 1e-6 * 690 / 1000);  // too small: nothing changes
  m.meter.Record(Tier::kSsd, 1380, 2e-6);              // 0.69 GB/s: the disk got throttled
  e = m.meter.Estimate(Tier::kSsd);
  EXPECT_NEAR(e.bytes_per_sec, 0.3 * 0.69e9 + 0.7 * 2e9, 1);
  EXPECT_DOUBLE_EQ(e.low_bytes_per_sec, 0.69e9);
}

TEST(BandwidthMeterTest, ASlowDramReadCountsOnlyThroughTheMean) {
  Meter m(Small());
  for (int i = 0; i < 20; ++i) m.meter.Record(Tier::kDram, 20000, 1e-6);  // 20 GB/s, steady
  m.meter.Record(Tier::kDram, 2000, 1e-6 * 2000 / 1600);  // 1.6 GB/s: beside a long prefill
  BandwidthEstimate e = m.meter.Estimate(Tier::kDram);
  EXPECT_NEAR(e.bytes_per_sec, 0.3 * 1.6e9 + 0.7 * 20e9, 1e3);
  EXPECT_GT(e.spread, 0.4);  // the deviation widened it
  // A read at 20 GB/s a moment ago showed the tier's speed: the mean is the pessimistic figure.
  EXPECT_DOUBLE_EQ(e.low_bytes_per_sec, e.bytes_per_sec);
  // More slow reads pull the mean down; the figure follows the mean, not the slow reads.
  for (int i = 0; i < 3; ++i) m.meter.Record(Tier::kDram, 2000, 1e-6 * 2000 / 1600);
  e = m.meter.Estimate(Tier::kDram);
  EXPECT_DOUBLE_EQ(e.low_bytes_per_sec, e.bytes_per_sec);
  EXPECT_GT(e.low_bytes_per_sec, 5e9) << "not the slow reads' 1.6 GB/s";
}

TEST(BandwidthMeterTest, TheDramTiersBestFadesAndTheSpreadCountsAgain) {
  Meter m(Small());  // half-life 30 s, stale after 10 s
  m.meter.Record(Tier::kDram, 20000, 1e-6);               // 20 GB/s
  m.meter.Record(Tier::kDram, 2000, 1e-6 * 2000 / 1600);  // 1.6 GB/s
  const BandwidthEstimate fresh = m.meter.Estimate(Tier::kDram);
  EXPECT_DOUBLE_EQ(fresh.low_bytes_per_sec, fresh.bytes_per_sec);
  EXPECT_LT(fresh.bytes_per_sec * (1 - fresh.spread), fresh.bytes_per_sec);
  // Four half-lives later the 20 GB/s read counts as 1.25 GB/s, below the mean (14.5 GB/s): the
  // spread's rule (widened for the quiet spell) gives the figure again.
  m.now += 120;
  const BandwidthEstimate quiet = m.meter.Estimate(Tier::kDram);
  EXPECT_DOUBLE_EQ(quiet.low_bytes_per_sec, std::max(quiet.bytes_per_sec * (1 - quiet.spread),
                                                     20e9 / 16));
  EXPECT_LT(quiet.low_bytes_per_sec, 0.5 * quiet.bytes_per_sec);
  // The SSD keeps its own rule: its newest sample caps the figure whatever came before.
  m.meter.Record(Tier::kSsd, 4000, 1e-6);  // 4 GB/s
  m.meter.Record(Tier::kSsd, 1000, 1e-6);  // 1 GB/s
  EXPECT_DOUBLE_EQ(m.meter.Estimate(Tier::kSsd).low_bytes_per_sec, 1e9);
}

TEST(BandwidthMeterTest, QuietSpellsWidenTheSpread) {
  Meter m(Small());
  for (int i = 0; i < 20; ++i) m.meter.Record(Tier::kSsd, 2000, 1e-6);
  const double fresh = m.meter.Estimate(Tier::kSsd).spread;
  m.now += 10;  // within stale_after_s: unchanged
  EXPECT_DOUBLE_EQ(m.meter.Estimate(Tier::kSsd).spread, fresh);
  m.now += 30;  // 30 s past it: +0.3
  const BandwidthEstimate e = m.meter.Estimate(Tier::kSsd);
  EXPECT_NEAR(e.spread, fresh + 0.3, 1e-9);
  EXPECT_NEAR(e.low_bytes_per_sec, 2e9 * (1 - e.spread), 1);
  m.now += 1e6;  // capped
  EXPECT_DOUBLE_EQ(m.meter.Estimate(Tier::kSsd).spread, 0.9);
}

TEST(BandwidthMeterTest, AWriteBacklogTakesItsShareOfTheSsd) {
  Meter m(Small());  // write_share_prior 0.5
  for (int i = 0; i < 20; ++i) m.meter.Record(Tier::kSsd, 2000, 1e-6);
  EXPECT_FALSE(m.meter.Estimate(Tier::kSsd).contended);
  m.meter.SetWriteBacklog(64 << 20);
  BandwidthEstimate e = m.meter.Estimate(Tier::kSsd);
  EXPECT_TRUE(e.contended);
  EXPECT_NEAR(e.bytes_per_sec, 1e9, 1) << "the prior share before any read under writes";
  EXPECT_FALSE(m.meter.Estimate(Tier::kDram).contended) << "the DRAM tier does not share it";
  m.meter.Record(Tier::kSsd, 1600, 1e-6);  // 1.6 GB/s beside the writes
  e = m.meter.Estimate(Tier::kSsd);
  EXPECT_DOUBLE_EQ(e.bytes_per_sec, 1.6e9);
  EXPECT_EQ(m.meter.GetContended().samples, 1u);
  EXPECT_EQ(m.meter.Get(Tier::kSsd).samples, 20u) << "kept apart from reads alone";
  m.meter.SetWriteBacklog(0);
  EXPECT_NEAR(m.meter.Estimate(Tier::kSsd).bytes_per_sec, 2e9, 1);
}

// Reads of one size: fixed part 0, the marginal rate is the mean. Reads of different sizes that
// take a fixed 9 ms plus their bytes at 27 GB/s (the H200's DRAM grid, stop 34): the fit recovers
// both, while the mean of their rates says less for a small Read than for a large one.
TEST(BandwidthMeterTest, FixedPartAndMarginalRateFromReadsOfDifferentSizes) {
  Meter one(Small());
  for (int i = 0; i < 5; ++i, one.now += 1) one.meter.Record(Tier::kDram, 1'000'000'000, 0.04);
  BandwidthEstimate e = one.meter.Estimate(Tier::kDram);
  EXPECT_EQ(e.fixed_seconds, 0);
  EXPECT_DOUBLE_EQ(e.marginal_bytes_per_sec, e.bytes_per_sec);

  Meter m(Small());
  for (int i = 0; i < 12; ++i, m.now += 1) {
    const double gb = (i % 3 == 0) ? 0.5 : (i % 3 == 1 ? 2.0 : 4.0);
    m.meter.Record(Tier::kDram, static_cast<uint64_t>(gb * 1e9), 9e-3 + gb / 27);
  }
  e = m.meter.Estimate(Tier::kDram);
  EXPECT_NEAR(e.fixed_seconds, 9e-3, 1e-6);
  EXPECT_NEAR(e.marginal_bytes_per_sec, 27e9, 1e6);
  EXPECT_LT(e.bytes_per_sec, e.marginal_bytes_per_sec);

  // Rates that fall with size (no fixed part fits): fixed 0, the mean.
  Meter odd(Small());
  for (int i = 0; i < 6; ++i, odd.now += 1) {
    const double gb = i % 2 == 0 ? 0.5 : 4.0;
    odd.meter.Record(Tier::kDram, static_cast<uint64_t>(gb * 1e9), gb / (i % 2 == 0 ? 30 : 10));
  }
  e = odd.meter.Estimate(Tier::kDram);
  EXPECT_EQ(e.fixed_seconds, 0);
  EXPECT_DOUBLE_EQ(e.marginal_bytes_per_sec, e.bytes_per_sec);
}

}  // namespace
}  // namespace tutti::datapath

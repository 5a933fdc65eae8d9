#include "daemon/datapath/bandwidth.h"

#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

TEST(BandwidthMeterTest, PriorUntilTheFirstSampleThenWeightedMean) {
  BandwidthOptions o;
  o.dram_prior_bytes_per_sec = 50e9;
  o.ssd_prior_bytes_per_sec = 1e9;
  o.min_sample_bytes = 1000;
  o.alpha = 0.5;
  BandwidthMeter m(o);
  EXPECT_DOUBLE_EQ(m.BytesPerSecond(Tier::kSsd), 1e9);
  EXPECT_DOUBLE_EQ(m.BytesPerSecond(Tier::kDram), 50e9);
  m.Record(Tier::kSsd, 4000, 2e-6);  // 2 GB/s: the first sample replaces the prior
  EXPECT_DOUBLE_EQ(m.BytesPerSecond(Tier::kSsd), 2e9);
  m.Record(Tier::kSsd, 4000, 1e-6);  // 4 GB/s, weight 0.5
  EXPECT_DOUBLE_EQ(m.BytesPerSecond(Tier::kSsd), 3e9);
  EXPECT_EQ(m.Get(Tier::kSsd).samples, 2u);
  EXPECT_EQ(m.Get(Tier::kSsd).bytes, 8000u);
  EXPECT_DOUBLE_EQ(m.BytesPerSecond(Tier::kDram), 50e9);  // tiers are separate
}

TEST(BandwidthMeterTest, SmallOrTimelessSamplesAreIgnored) {
  BandwidthOptions o;
  o.ssd_prior_bytes_per_sec = 1e9;
  o.min_sample_bytes = 1000;
  BandwidthMeter m(o);
  m.Record(Tier::kSsd, 999, 1e-9);
  m.Record(Tier::kSsd, 5000, 0);
  m.Record(Tier::kSsd, 5000, -1);
  EXPECT_EQ(m.Get(Tier::kSsd).samples, 0u);
  EXPECT_DOUBLE_EQ(m.BytesPerSecond(Tier::kSsd), 1e9);
}

}  // namespace
}  // namespace tutti::datapath

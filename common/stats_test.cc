// The registry: families in registration order with their samples, one snapshot per group and
// collection, per-tenant samples only when asked for, units read from names.
#include "common/stats.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::stats {
namespace {

struct Counts {
  double hits = 0, misses = 0;
};

TEST(StatsTest, FamiliesComeInRegistrationOrderWithTheirSamples) {
  Registry r;
  Counts now{3, 4};
  r.AddGroup<Counts>([&now] { return now; })
      .Counter("tutti_hits_total", "Hits.", [](const Counts& c) { return c.hits; }, "hits")
      .Add({"tutti_events_total", "Events by kind.", Type::kCounter, {"kind"}, "events"},
           [](const Counts& c, Samples* out) {
             out->Add({"hit"}, c.hits);
             out->Add({"miss"}, c.misses, "misses");
           });
  r.AddGroup<int>([] { return 7; }).Gauge("tutti_sessions", "Sessions.", [](int n) {
    return n;
  });
  now.hits = 5;
  const std::vector<Family> fs = r.Collect();
  ASSERT_EQ(fs.size(), 3u);
  EXPECT_EQ(fs[0].spec.name, "tutti_hits_total");
  EXPECT_EQ(fs[0].spec.type, Type::kCounter);
  EXPECT_EQ(fs[0].spec.field, "hits");
  ASSERT_EQ(fs[0].samples.size(), 1u);
  EXPECT_EQ(fs[0].samples[0].value, 5);
  EXPECT_TRUE(fs[0].samples[0].labels.empty());
  EXPECT_EQ(fs[1].spec.labels, std::vector<std::string>{"kind"});
  ASSERT_EQ(fs[1].samples.size(), 2u);
  EXPECT_EQ(fs[1].samples[1].labels, std::vector<std::string>{"miss"});
  EXPECT_EQ(fs[1].samples[1].value, 4);
  EXPECT_EQ(fs[1].samples[1].field, "misses");
  EXPECT_EQ(fs[2].spec.type, Type::kGauge);
  EXPECT_EQ(fs[2].samples[0].value, 7);
}

TEST(StatsTest, OneSnapshotPerGroupAndCollection) {
  Registry r;
  int snapshots = 0;
  r.AddGroup<int>([&snapshots] { return ++snapshots; })
      .Gauge("tutti_a", "A.", [](int n) { return n; })
      .Gauge("tutti_b", "B.", [](int n) { return n; });
  const std::vector<Family> fs = r.Collect();
  EXPECT_EQ(snapshots, 1);
  EXPECT_EQ(fs[0].samples[0].value, 1);
  EXPECT_EQ(fs[1].samples[0].value, 1);
  r.Collect();
  EXPECT_EQ(snapshots, 2);
}

TEST(StatsTest, PerTenantFamiliesKeepTheirPlaceButNotTheirSamplesUnlessAskedFor) {
  Registry r;
  Spec spec{"tutti_namespace_blocks", "Blocks per namespace.", Type::kGauge, {"namespace"}};
  spec.per_tenant = true;
  r.AddGroup<int>([] { return 1; })
      .Add(spec, [](int, Samples* out) { out->Add({"00ab"}, 9); })
      .Gauge("tutti_blocks", "Blocks.", [](int) { return 9; });
  std::vector<Family> fs = r.Collect(/*per_tenant=*/false);
  ASSERT_EQ(fs.size(), 2u);
  EXPECT_EQ(fs[0].spec.name, "tutti_namespace_blocks");
  EXPECT_TRUE(fs[0].samples.empty());
  EXPECT_EQ(fs[1].samples.size(), 1u);
  fs = r.Collect();
  ASSERT_EQ(fs[0].samples.size(), 1u);
  EXPECT_EQ(fs[0].samples[0].labels, std::vector<std::string>{"00ab"});
}

TEST(StatsTest, HistogramsKeepTheirBuckets) {
  Registry r;
  r.AddGroup<int>([] { return 0; })
      .Add({"tutti_latency_seconds", "Latency.", Type::kHistogram, {"op"}},
           [](int, Samples* out) { out->AddHistogram({"read"}, {{0.1, 1}, {2, 3}, 4, 2.5}); });
  const std::vector<Family> fs = r.Collect();
  const Histogram& h = fs[0].samples[0].histogram;
  EXPECT_EQ(h.cumulative, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(h.count, 4u);
  EXPECT_EQ(h.sum, 2.5);
}

TEST(StatsTest, TheUnitIsTheNamesSuffix) {
  EXPECT_EQ(UnitOf("tutti_io_write_wait_seconds_total"), "seconds");
  EXPECT_EQ(UnitOf("tutti_pool_used_bytes"), "bytes");
  EXPECT_EQ(UnitOf("tutti_read_bandwidth_bytes_per_second"), "bytes_per_second");
  EXPECT_EQ(UnitOf("tutti_nvme_available_spare_ratio"), "ratio");
  EXPECT_EQ(UnitOf("tutti_lookups_total"), "");
  EXPECT_EQ(UnitOf("tutti_sessions"), "");
}

}  // namespace
}  // namespace tutti::stats

// The daemon's families, registered by its components (common/stats.h) over fake figures: names,
// types, HELP, labels and values; and the text page they make (prometheus-cpp's serializer), as a
// scrape shows it.
#include "daemon/metrics/families.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/decision/advisor.h"
#include "daemon/server/credentials.h"
#include "daemon/server/device_health.h"
#include "daemon/server/gpu_layer_stats.h"
#include "daemon/server/sessions.h"
#include "daemon/store/store_stats.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace tutti::metrics {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using ::testing::HasSubstr;

// The figures of every component whose families /metrics shows, fixed.
struct MetricsSnapshot {
  store::StoreStats store;
  datapath::TierBandwidth read_bandwidth[datapath::kNumTiers];  // by datapath::Tier
  uint32_t sessions = 0;
  uint32_t handoffs_outstanding = 0;
  std::optional<decision::AdvisorStats> decisions;  // absent: no advisor
  std::optional<server::GpuLayerCounts> gpu_layers;  // absent: host mode
  std::vector<std::string> pool_dirs;                // device i: pool file i's directory
  std::vector<server::DeviceHealth> nvme_health;     // as `tuttictl devices --report` sent it
  io::BackendChoice io_backend;                      // the I/O backend start-up chose
};

// The families of `s`, registered as tuttid's main registers them.
std::vector<MetricFamily> BuildFamilies(const MetricsSnapshot& s) {
  stats::Registry r;
  store::RegisterStoreStats([&s] { return s.store; },
                            [&s] {
                              store::TierBandwidths b;
                              for (int t = 0; t < datapath::kNumTiers; ++t) {
                                b[t] = s.read_bandwidth[t];
                              }
                              return b;
                            },
                            &r);
  RegisterStartupInfo(s.pool_dirs, s.io_backend, &r);
  server::RegisterSessionStats([&s] { return s.sessions; }, &r);
  server::RegisterHandoffStats([&s] { return s.handoffs_outstanding; }, &r);
  decision::RegisterAdvisorStats([&s] { return s.decisions.value_or(decision::AdvisorStats{}); },
                                 &r);
  server::RegisterGpuLayerStats(
      [&s] { return s.gpu_layers.value_or(server::GpuLayerCounts{}); }, &r);
  server::RegisterDeviceHealthStats([&s] { return s.nvme_health; }, &r);
  return ToPrometheus(r.Collect());
}

MetricsSnapshot FakeSnapshot() {
  MetricsSnapshot s;
  store::StoreStats& st = s.store;
  st.slots_total = 100;
  st.slots_used = 40;
  st.slot_bytes = 1 << 20;
  st.dram_capacity = 64 << 20;
  st.dram_used = 8 << 20;
  st.lookups = 12;
  st.lookup_hits = 30;
  st.lookup_blocks = 48;
  st.lookup_misses = 5;
  st.blocks_retrieved = 25;
  st.dram_hits = 10;
  st.blocks_stored = 40;
  st.bytes_read = 25 << 20;
  st.bytes_written = 40 << 20;
  st.evictions = 3;
  st.verify_errors = 2;
  st.io_errors = 1;
  st.store_failed = 4;
  st.checkpoint_failures = 6;
  st.store_rejected = 9;
  st.store_rejected_owner_limit = 2;
  st.store_rejected_backlog = 3;
  st.blocks_admitted = 11;
  st.blocks_declined = 12;
  st.front_kept = 13;
  st.front_promoted = 14;
  st.front_dropped = 15;
  st.front_promotions_deferred = 16;
  st.front_blocks = 17;
  st.write_backlog_bytes = 5 << 20;
  st.write_backlog_blocks = 5;
  st.write_backlog_age_ms = 1500;
  st.io.reads_emitted = 70;
  st.io.writes_emitted = 80;
  st.io.read_bytes = 700;
  st.io.write_bytes = 800;
  st.io.writes_queued = 7;
  st.io.write_wait_ms = 2500;
  st.io.devices.resize(2);
  st.io.devices[1].reads_in_flight = 4;
  st.io.devices[1].reads_queued = 9;
  st.io.devices[1].write_window = 8 << 20;
  st.io.devices[1].write_window_cuts = 3;
  st.io.devices[0].read_bytes = 300;
  st.io.devices[1].read_bytes = 400;
  st.io.devices[1].write_bytes = 800;
  st.io.devices[1].read_latency.Record(80, 3);    // (50, 100] us
  st.io.devices[1].read_latency.Record(2000, 1);  // (1, 2.5] ms
  st.read_objects = 140;
  st.read_merged_ios = 20;
  store::NamespaceInfo ns;
  ns.id = 0xabc;
  ns.descriptor.set_model_id("llama");
  ns.blocks = 40;
  ns.blocks_dram = 8;
  ns.lookup_hits = 30;
  ns.lookup_misses = 5;
  ns.blocks_retrieved = 25;
  ns.dram_hits = 10;
  st.namespaces.push_back(ns);
  s.read_bandwidth[static_cast<int>(datapath::Tier::kSsd)].bytes_per_sec = 2e9;
  s.read_bandwidth[static_cast<int>(datapath::Tier::kDram)].bytes_per_sec = 3e10;
  s.sessions = 2;
  s.decisions = decision::AdvisorStats{11, 7, 0.25, 0.5};
  s.gpu_layers = server::GpuLayerCounts{64, 16, 32, 32};
  s.pool_dirs = {"/ssd0", "/ssd1"};
  server::DeviceHealth nvme;
  nvme.device = "nvme0n1";
  nvme.model = "QEMU NVMe Ctrl";
  nvme.serial = "deadbeef";
  nvme.critical_warning = 4;
  nvme.temperature_c = 50;
  nvme.available_spare_pct = 90;
  nvme.percentage_used = 3;
  nvme.media_errors = 2;
  s.nvme_health.push_back(nvme);
  return s;
}

const MetricFamily& Find(const std::vector<MetricFamily>& fs, const std::string& name) {
  for (const MetricFamily& f : fs) {
    if (f.name == name) return f;
  }
  ADD_FAILURE() << "no family " << name;
  static const MetricFamily kNone;
  return kNone;
}

// The value of the sample of `f` whose labels include every pair of `labels`.
double Value(const MetricFamily& f, std::vector<ClientMetric::Label> labels = {}) {
  for (const ClientMetric& m : f.metric) {
    bool all = true;
    for (const auto& l : labels) {
      all = all && std::find(m.label.begin(), m.label.end(), l) != m.label.end();
    }
    if (all) return f.type == MetricType::Counter ? m.counter.value : m.gauge.value;
  }
  ADD_FAILURE() << f.name << ": no sample with the labels asked";
  return -1;
}

TEST(FamiliesTest, EveryFamilyIsNamedTuttiWithHelpAndSamplesAndAppearsOnce) {
  const std::vector<MetricFamily> fs = BuildFamilies(FakeSnapshot());
  std::set<std::string> names;
  for (const MetricFamily& f : fs) {
    EXPECT_EQ(f.name.rfind("tutti_", 0), 0u) << f.name;
    EXPECT_FALSE(f.help.empty()) << f.name;
    EXPECT_FALSE(f.metric.empty()) << f.name;
    EXPECT_TRUE(names.insert(f.name).second) << f.name << " twice";
    // Prometheus' conventions, which promtool checks: counters end in _total, others do not.
    const bool total = f.name.size() > 6 && f.name.substr(f.name.size() - 6) == "_total";
    EXPECT_EQ(total, f.type == MetricType::Counter) << f.name;
  }
  EXPECT_GE(fs.size(), 40u);
}

TEST(FamiliesTest, IoBackendInfoNamesTheBackendTheRequestAndTheReason) {
  MetricsSnapshot s = FakeSnapshot();
  s.io_backend = {"uring", "gds", "gds: cuFileDriverOpen: CU_FILE_PLATFORM_NOT_SUPPORTED (5007)"};
  const std::vector<MetricFamily> fs = BuildFamilies(s);
  EXPECT_EQ(Value(Find(fs, "tutti_io_backend_info"),
                  {{"backend", "uring"},
                   {"requested", "gds"},
                   {"reason", "gds: cuFileDriverOpen: CU_FILE_PLATFORM_NOT_SUPPORTED (5007)"}}),
            1);
}

TEST(FamiliesTest, HitsTrafficAndErrorsCarryTheSnapshotsValues) {
  const std::vector<MetricFamily> fs = BuildFamilies(FakeSnapshot());
  EXPECT_EQ(Value(Find(fs, "tutti_lookup_hits_total")), 30);
  EXPECT_EQ(Value(Find(fs, "tutti_lookup_blocks_total")), 48);
  EXPECT_EQ(Value(Find(fs, "tutti_lookup_misses_total")), 5);
  EXPECT_EQ(Value(Find(fs, "tutti_retrieved_blocks_total"), {{"tier", "dram"}}), 10);
  EXPECT_EQ(Value(Find(fs, "tutti_retrieved_blocks_total"), {{"tier", "ssd"}}), 15);
  const MetricFamily& ns = Find(fs, "tutti_namespace_blocks");
  EXPECT_EQ(Value(ns, {{"namespace", "0000000000000abc"}, {"model", "llama"}, {"tier", "ssd"}}),
            40);
  EXPECT_EQ(Value(ns, {{"namespace", "0000000000000abc"}, {"tier", "dram"}}), 8);
  const ClientMetric::Label llama{"namespace", "0000000000000abc"};
  EXPECT_EQ(Value(Find(fs, "tutti_namespace_lookup_hits_total"), {llama, {"model", "llama"}}), 30);
  EXPECT_EQ(Value(Find(fs, "tutti_namespace_lookup_misses_total"), {llama}), 5);
  EXPECT_EQ(Value(Find(fs, "tutti_namespace_retrieved_blocks_total"), {llama, {"tier", "ssd"}}),
            15);
  EXPECT_EQ(Value(Find(fs, "tutti_namespace_retrieved_blocks_total"), {llama, {"tier", "dram"}}),
            10);
  EXPECT_EQ(Value(Find(fs, "tutti_bytes_total"), {{"direction", "write"}}), 40 << 20);
  EXPECT_EQ(Value(Find(fs, "tutti_io_requests_total"), {{"op", "read"}}), 70);
  EXPECT_EQ(Value(Find(fs, "tutti_io_bytes_total"), {{"op", "write"}}), 800);
  EXPECT_EQ(Value(Find(fs, "tutti_read_merged_ios_total")), 20);
  const MetricFamily& errors = Find(fs, "tutti_errors_total");
  EXPECT_EQ(Value(errors, {{"kind", "verify"}}), 2);
  EXPECT_EQ(Value(errors, {{"kind", "io"}}), 1);
  EXPECT_EQ(Value(errors, {{"kind", "store_failed"}}), 4);
  EXPECT_EQ(Value(errors, {{"kind", "checkpoint"}}), 6);
  const MetricFamily& rejected = Find(fs, "tutti_store_rejected_total");
  EXPECT_EQ(Value(rejected, {{"reason", "staging_full"}}), 4);
  EXPECT_EQ(Value(rejected, {{"reason", "owner_limit"}}), 2);
  EXPECT_EQ(Value(rejected, {{"reason", "backlog"}}), 3);
  const MetricFamily& admission = Find(fs, "tutti_admission_blocks_total");
  EXPECT_EQ(Value(admission, {{"decision", "admitted"}}), 11);
  EXPECT_EQ(Value(admission, {{"decision", "declined"}}), 12);
  const MetricFamily& front = Find(fs, "tutti_dram_front_blocks_total");
  EXPECT_EQ(Value(front, {{"event", "kept"}}), 13);
  EXPECT_EQ(Value(front, {{"event", "promoted"}}), 14);
  EXPECT_EQ(Value(front, {{"event", "dropped"}}), 15);
  EXPECT_EQ(Value(front, {{"event", "deferred"}}), 16);
  EXPECT_EQ(Value(Find(fs, "tutti_dram_front_blocks")), 17);
}

TEST(FamiliesTest, CapacityBacklogQueuesDecisionsAndGpu) {
  const std::vector<MetricFamily> fs = BuildFamilies(FakeSnapshot());
  EXPECT_EQ(Value(Find(fs, "tutti_pool_capacity_bytes")), 100 << 20);
  EXPECT_EQ(Value(Find(fs, "tutti_pool_used_bytes")), 40 << 20);
  EXPECT_EQ(Value(Find(fs, "tutti_dram_used_bytes")), 8 << 20);
  EXPECT_EQ(Value(Find(fs, "tutti_evictions_total")), 3);
  EXPECT_EQ(Value(Find(fs, "tutti_write_backlog_age_seconds")), 1.5);
  EXPECT_EQ(Value(Find(fs, "tutti_write_backlog_blocks")), 5);
  EXPECT_EQ(Value(Find(fs, "tutti_io_writes_queued")), 7);
  EXPECT_EQ(Value(Find(fs, "tutti_io_write_wait_seconds_total")), 2.5);
  EXPECT_EQ(Value(Find(fs, "tutti_io_reads_in_flight"), {{"device", "1"}}), 4);
  EXPECT_EQ(Value(Find(fs, "tutti_io_reads_queued"), {{"device", "1"}}), 9);
  EXPECT_EQ(Value(Find(fs, "tutti_io_device_bytes_total"), {{"device", "0"}, {"op", "read"}}), 300);
  EXPECT_EQ(Value(Find(fs, "tutti_io_device_bytes_total"), {{"device", "1"}, {"op", "read"}}), 400);
  EXPECT_EQ(Value(Find(fs, "tutti_io_device_bytes_total"), {{"device", "0"}, {"op", "write"}}), 0);
  EXPECT_EQ(Value(Find(fs, "tutti_io_device_bytes_total"), {{"device", "1"}, {"op", "write"}}),
            800);
  EXPECT_EQ(Value(Find(fs, "tutti_pool_device_info"), {{"device", "1"}, {"dir", "/ssd1"}}), 1);
  EXPECT_EQ(Value(Find(fs, "tutti_sessions")), 2);
  EXPECT_EQ(Value(Find(fs, "tutti_read_bandwidth_bytes_per_second"), {{"tier", "ssd"}}), 2e9);
  EXPECT_EQ(Value(Find(fs, "tutti_decisions_total")), 11);
  EXPECT_EQ(Value(Find(fs, "tutti_decision_prediction_error_mean")), 0.25);
  EXPECT_EQ(Value(Find(fs, "tutti_gpu_layers_total"), {{"path", "copy_engine"}}), 16);
  EXPECT_EQ(Value(Find(fs, "tutti_gpu_layers_total"), {{"path", "kernel"}}), 48);
}

TEST(FamiliesTest, LatencyHistogramIsCumulativeInSecondsPerDeviceAndOp) {
  const std::vector<MetricFamily> fs = BuildFamilies(FakeSnapshot());
  const MetricFamily& f = Find(fs, "tutti_io_latency_seconds");
  ASSERT_EQ(f.type, MetricType::Histogram);
  ASSERT_EQ(f.metric.size(), 4u);  // 2 devices x (read, write)
  const ClientMetric& m = f.metric[2];  // device 1, read
  EXPECT_THAT(m.label, ::testing::ElementsAre(ClientMetric::Label{"device", "1"},
                                              ClientMetric::Label{"op", "read"}));
  EXPECT_EQ(m.histogram.sample_count, 4u);
  EXPECT_DOUBLE_EQ(m.histogram.sample_sum, 0.00224);
  EXPECT_EQ(m.histogram.bucket[0].cumulative_count, 0u);  // <= 50 us
  EXPECT_DOUBLE_EQ(m.histogram.bucket[1].upper_bound, 100e-6);
  EXPECT_EQ(m.histogram.bucket[1].cumulative_count, 3u);
  EXPECT_EQ(m.histogram.bucket[4].cumulative_count, 3u);  // <= 1 ms
  EXPECT_EQ(m.histogram.bucket[5].cumulative_count, 4u);  // <= 2.5 ms
  EXPECT_EQ(m.histogram.bucket.back().cumulative_count, 4u);
}

TEST(FamiliesTest, NvmeHealthAsReportedPerDevice) {
  const std::vector<MetricFamily> fs = BuildFamilies(FakeSnapshot());
  const std::vector<ClientMetric::Label> dev = {
      {"device", "nvme0n1"}, {"serial", "deadbeef"}, {"model", "QEMU NVMe Ctrl"}};
  EXPECT_EQ(Value(Find(fs, "tutti_nvme_critical_warning"), dev), 4);
  EXPECT_EQ(Value(Find(fs, "tutti_nvme_temperature_celsius"), dev), 50);
  EXPECT_DOUBLE_EQ(Value(Find(fs, "tutti_nvme_available_spare_ratio"), dev), 0.9);
  EXPECT_DOUBLE_EQ(Value(Find(fs, "tutti_nvme_endurance_used_ratio"), dev), 0.03);
  EXPECT_EQ(Value(Find(fs, "tutti_nvme_media_errors"), dev), 2);
}

TEST(FamiliesTest, AnEmptySnapshotStillGivesEveryFamilyAndHostModeZeros) {
  const std::vector<MetricFamily> full = BuildFamilies(FakeSnapshot());
  const std::vector<MetricFamily> empty = BuildFamilies(MetricsSnapshot{});
  ASSERT_EQ(empty.size(), full.size());
  const std::set<std::string> per_entity = {
      "tutti_namespace_blocks", "tutti_namespace_lookup_hits_total",
      "tutti_namespace_lookup_misses_total", "tutti_namespace_retrieved_blocks_total",
      "tutti_io_device_bytes_total", "tutti_io_reads_in_flight", "tutti_io_reads_queued",
      "tutti_io_write_bytes_in_flight",
      "tutti_io_write_window_bytes", "tutti_io_write_window_cuts_total",
      "tutti_io_latency_seconds", "tutti_pool_device_info", "tutti_nvme_critical_warning",
      "tutti_nvme_temperature_celsius", "tutti_nvme_available_spare_ratio",
      "tutti_nvme_endurance_used_ratio", "tutti_nvme_media_errors"};
  for (size_t i = 0; i < empty.size(); ++i) {
    EXPECT_EQ(empty[i].name, full[i].name);
    EXPECT_EQ(empty[i].metric.empty(), per_entity.count(empty[i].name) == 1) << empty[i].name;
  }
  EXPECT_EQ(Value(Find(empty, "tutti_gpu_layers_total"), {{"path", "kernel"}}), 0);
  EXPECT_EQ(Value(Find(empty, "tutti_decisions_total")), 0);
}

TEST(FamiliesTest, TheTextPageHasHelpTypeAndLabelledSamples) {
  const std::string page = prometheus::TextSerializer().Serialize(BuildFamilies(FakeSnapshot()));
  EXPECT_THAT(page, HasSubstr("# HELP tutti_evictions_total Blocks evicted"));
  EXPECT_THAT(page, HasSubstr("# TYPE tutti_evictions_total counter\ntutti_evictions_total 3\n"));
  EXPECT_THAT(page, HasSubstr("tutti_retrieved_blocks_total{tier=\"dram\"} 10\n"));
  EXPECT_THAT(page,
              HasSubstr("tutti_io_latency_seconds_bucket{device=\"1\",op=\"read\",le=\"+Inf\"} 4"));
  EXPECT_THAT(page, HasSubstr("tutti_io_write_window_bytes{device=\"1\"} 8388608\n"));
  EXPECT_THAT(page, HasSubstr("tutti_io_write_window_cuts_total{device=\"1\"} 3\n"));
}

}  // namespace
}  // namespace tutti::metrics

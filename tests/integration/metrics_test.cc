// The real tuttid with metrics on (metrics.listen "127.0.0.1:0": a free port, read from its log;
// namespace_labels on):
// /metrics answers over HTTP, promtool accepts the page, the counters move as a host-mode engine
// stores and retrieves blocks, and they agree with Admin.Stats (tuttictl stats).
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
#include "daemon/metrics/http_get.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tutti::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kBlocks = 24;

// The value of the sample whose line starts with `series` (name and labels as printed); -1 when
// the page has no such line.
double SampleValue(const std::string& page, const std::string& series) {
  const std::string head = "\n" + series + " ";
  const size_t at = page.find(head);
  if (at == std::string::npos) return -1;
  const size_t begin = at + head.size();
  double v = -1;
  if (!absl::SimpleAtod(page.substr(begin, page.find('\n', begin) - begin), &v)) return -1;
  return v;
}

// promtool's path from $PATH, or "" when it is not installed (Debian's prometheus package).
std::string FindPromtool() {
  const char* path = getenv("PATH");
  std::string dirs = path != nullptr ? path : "";
  dirs += ":/usr/bin:/usr/local/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/promtool";
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TuttidConfig config;
    config.metrics_listen = "127.0.0.1:0";
    config.extra_metrics = "namespace_labels: true";  // the series by namespace, checked below
    auto env = TuttidEnv::Create(config);
    ASSERT_TRUE(env.ok()) << env.status();
    env_ = std::move(*env);
    auto daemon = TuttidProcess::Start(*env_);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    const std::string log = daemon_->LogTail(1 << 20);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, std::regex("metrics on http://127\\.0\\.0\\.1:([0-9]+)/metrics")))
        << "no metrics line in the log:\n" << log;
    port_ = std::stoi(m[1]);
  }

  std::string Scrape() {
    auto page = metrics::HttpGet(port_, "/metrics");
    EXPECT_TRUE(page.ok()) << page.status() << "\n" << daemon_->LogTail();
    return page.ok() ? *page : "";
  }

  std::unique_ptr<TuttidEnv> env_;
  std::unique_ptr<TuttidProcess> daemon_;
  int port_ = 0;
};

TEST_F(MetricsTest, PromtoolAcceptsThePage) {
  const std::string page = Scrape();
  ASSERT_THAT(page, HasSubstr("# HELP tutti_lookups_total "));
  const std::string promtool = FindPromtool();
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool not found (Debian package prometheus, deploy/debian-packages.txt): "
                    "the page was scraped but not linted";
  }
  const std::string file = env_->root() + "/metrics.txt";
  std::ofstream(file) << page;
  const CommandResult r = RunCommand({"/bin/sh", "-c", promtool + " check metrics < " + file});
  EXPECT_EQ(r.exit_code, 0) << "promtool check metrics:\n" << r.out << r.err << "\npage:\n"
                            << page;
}

TEST_F(MetricsTest, CountersMoveWithTrafficAndAgreeWithAdminStats) {
  const std::string before = Scrape();
  EXPECT_EQ(SampleValue(before, "tutti_stored_blocks_total"), 0);
  EXPECT_EQ(SampleValue(before, "tutti_sessions"), 0);

  auto session = AttachEngine(*daemon_, SmallShape(), kBlocks);
  ASSERT_TRUE(session.ok()) << session.status();
  const std::vector<Key> keys = hostengine::MakeKeyChain(5, kBlocks);
  hostengine::StoreOptions so;
  so.batch = kBlocks;
  const auto stored = hostengine::StoreKeys(*session->client, *session->engine, keys, so);
  ASSERT_TRUE(stored.status.ok()) << stored.status;
  ASSERT_EQ(stored.durable, kBlocks);
  hostengine::RetrieveOptions ro;
  ro.batch = kBlocks;
  const auto got = hostengine::RetrieveKeys(*session->client, *session->engine, keys, ro);
  ASSERT_TRUE(got.status.ok()) << got.status;
  ASSERT_EQ(got.hits, kBlocks);

  const std::string after = Scrape();
  EXPECT_EQ(SampleValue(after, "tutti_sessions"), 1);
  EXPECT_EQ(SampleValue(after, "tutti_stored_blocks_total"), kBlocks);
  EXPECT_EQ(SampleValue(after, "tutti_retrieved_blocks_total{tier=\"ssd\"}"), kBlocks);  // no DRAM
  EXPECT_GE(SampleValue(after, "tutti_lookup_hits_total"), kBlocks);
  EXPECT_GT(SampleValue(after, "tutti_io_requests_total{op=\"read\"}"), 0);
  EXPECT_GT(SampleValue(after, "tutti_io_bytes_total{op=\"write\"}"), 0);
  EXPECT_GT(SampleValue(after, "tutti_io_latency_seconds_count{device=\"0\",op=\"read\"}"), 0);
  EXPECT_GT(SampleValue(after, "tutti_io_latency_seconds_count{device=\"0\",op=\"write\"}"), 0);
  EXPECT_EQ(SampleValue(after, "tutti_errors_total{kind=\"verify\"}"), 0);
  EXPECT_GT(SampleValue(after, "tutti_pool_slots_used"), 0);
  EXPECT_THAT(after, HasSubstr("tutti_pool_device_info{device=\"0\",dir=\"" + env_->pool_dir()));
  std::smatch ns;  // the engine's one namespace, hits counted under its id and model
  ASSERT_TRUE(std::regex_search(
      after, ns, std::regex("\ntutti_namespace_lookup_hits_total\\{namespace=\"[0-9a-f]{16}\","
                            "model=\"[^\"]*\"\\} ([0-9]+)\n")));
  EXPECT_EQ(std::stoul(ns[1]), kBlocks);

  auto stats = AdminStats(*daemon_);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(SampleValue(after, "tutti_stored_blocks_total"), stats->blocks_stored());
  EXPECT_EQ(SampleValue(after, "tutti_lookup_hits_total"), stats->lookup_hits());
  EXPECT_EQ(SampleValue(after, "tutti_bytes_total{direction=\"read\"}"), stats->bytes_read());
  EXPECT_EQ(SampleValue(after, "tutti_bytes_total{direction=\"write\"}"), stats->bytes_written());
  EXPECT_EQ(SampleValue(after, "tutti_pool_slots_used"), stats->slots_used());
}

TEST_F(MetricsTest, AnotherPathIsNotFoundAndStopEndsTheEndpoint) {
  auto other = metrics::HttpGet(port_, "/other");
  EXPECT_FALSE(other.ok());
  auto code = daemon_->Stop();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_EQ(metrics::HttpGet(port_, "/metrics").status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tutti::testing

// The exporter over a real block store (in-memory backend): off means no endpoint; a scrape over
// HTTP shows the store's figures as they move; a taken port is refused naming the field;
// per-namespace series only when asked for; basic auth when configured; clients that stall
// mid-request do not stop a scrape.
#include "daemon/metrics/exporter.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/io/memory_backend.h"
#include "daemon/metrics/http_get.h"
#include "daemon/store/store_stats.h"
#include "daemon/store/store_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::metrics {
namespace {

using ::testing::HasSubstr;
constexpr uint32_t kLayers = 2;

class ExporterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = absl::StrCat(::testing::TempDir(), "/exporter_", getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    auto layout = pool::PoolLayout::Compute(8ull << 20, 1, 4096, 2 * kLayers);
    ASSERT_TRUE(layout.ok()) << layout.status();
    store::StoreOptions o;
    o.layout = *layout;
    o.state_dir = dir;
    o.store_staging_bytes = o.retrieve_staging_bytes = 64 * 2 * kLayers * 4096;
    auto backend = io::MemoryBackend::Create({layout->file_bytes()});
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto s = store::BlockStore::Open(o, std::move(backend).value(), &clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(s).value();
    auto ns = store_->RegisterNamespace(store::testing::TestNamespace(kLayers, 1, "m"));
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
    store::RegisterStoreStats(store_.get(), &registry_);
    RegisterStartupInfo({"/pool0"}, {}, &registry_);
  }

  absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(ExporterOptions options) {
    return MetricsExporter::Start(options, &registry_);
  }
  absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const std::string& listen) {
    return Start(ExporterOptions{listen});
  }

  // A file of `text` with `mode`, in the test's temporary directory.
  std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
    std::filesystem::remove(path);
    std::ofstream(path) << text;
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }

  void StoreDurable(absl::Span<const Key> keys) {
    auto out = store_->Capture(
        ns_, keys, 0, kLayers,
        [](absl::Span<const engine::CopyOp> ops) {
          for (const engine::CopyOp& op : ops) std::memset(op.staging, 7, 2048);
          return absl::OkStatus();
        },
        /*wait_durable=*/true);
    ASSERT_TRUE(out.ok()) << out.status();
    for (store::CaptureOutcome c : *out) ASSERT_EQ(c, store::CaptureOutcome::kDurable);
  }

  ManualClock clock_;
  std::unique_ptr<store::BlockStore> store_;
  stats::Registry registry_;  // the store's families and the pool's directory
  NamespaceId ns_ = 0;
};

TEST_F(ExporterTest, OffOrEmptyServesNothing) {
  for (const char* off : {"", "off"}) {
    auto e = Start(off);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(*e, nullptr);
  }
  EXPECT_FALSE(MetricsEnabled("off"));
  EXPECT_TRUE(MetricsEnabled("127.0.0.1:0"));
}

TEST_F(ExporterTest, NullStoreIsInvalid) {
  EXPECT_EQ(MetricsExporter::Start({"127.0.0.1:0"}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ExporterTest, ScrapesShowTheStoresFiguresAsTheyMove) {
  auto e = Start("127.0.0.1:0");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_NE(*e, nullptr);
  ASSERT_GT((*e)->port(), 0);
  EXPECT_EQ((*e)->url(), absl::StrCat("http://127.0.0.1:", (*e)->port(), "/metrics"));
  auto before = HttpGet((*e)->port(), "/metrics");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_THAT(*before, HasSubstr("\ntutti_stored_blocks_total 0\n"));
  EXPECT_THAT(*before, HasSubstr("tutti_pool_device_info{device=\"0\",dir=\"/pool0\"} 1"));

  const std::vector<Key> keys = {store::testing::TestKey(1), store::testing::TestKey(2),
                                 store::testing::TestKey(3)};
  StoreDurable(keys);
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 3u);
  auto after = HttpGet((*e)->port(), "/metrics");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_THAT(*after, HasSubstr("\ntutti_stored_blocks_total 3\n"));
  EXPECT_THAT(*after, HasSubstr("\ntutti_lookup_hits_total 3\n"));
  EXPECT_THAT(*after, HasSubstr("tutti_io_requests_total{op=\"write\"} "));
  EXPECT_THAT(*after, Not(HasSubstr("tutti_io_requests_total{op=\"write\"} 0\n")));
  EXPECT_THAT(*after, HasSubstr("tutti_io_latency_seconds_count{device=\"0\",op=\"write\"} "));
  store_->Unpin(ns_, keys);
}

TEST_F(ExporterTest, ATakenPortIsUnavailableNamingTheField) {
  auto first = Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = absl::StrCat("127.0.0.1:", (*first)->port());
  auto second = Start(taken);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("metrics.listen = \"" + taken));
}

TEST_F(ExporterTest, NamespaceSeriesOnlyWhenTheOperatorTurnsThemOn) {
  const std::vector<Key> keys = {store::testing::TestKey(1), store::testing::TestKey(2)};
  StoreDurable(keys);
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 2u);
  store_->Unpin(ns_, keys);
  auto plain = Start("127.0.0.1:0");
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto page = HttpGet((*plain)->port(), "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(*page, HasSubstr("\ntutti_lookup_hits_total 2\n"));  // the totals stay
  EXPECT_THAT(*page, Not(HasSubstr("model=")));
  EXPECT_THAT(*page, Not(HasSubstr("namespace=")));

  auto labelled = Start(ExporterOptions{"127.0.0.1:0", /*namespace_labels=*/true});
  ASSERT_TRUE(labelled.ok()) << labelled.status();
  page = HttpGet((*labelled)->port(), "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(*page, HasSubstr("tutti_namespace_lookup_hits_total{namespace=\""));
  EXPECT_THAT(*page, HasSubstr("model=\"m\"} 2\n"));
}

TEST_F(ExporterTest, BasicAuthRefusesAScrapeWithoutThePassword) {
  const std::string file = WriteFile("metrics_auth", "prometheus:s3cret\n", 0600);
  auto e = Start(ExporterOptions{"127.0.0.1:0", false, file});
  ASSERT_TRUE(e.ok()) << e.status();
  const int port = (*e)->port();
  EXPECT_THAT(std::string(HttpGet(port, "/metrics").status().message()), HasSubstr("401"));
  EXPECT_THAT(std::string(HttpGet(port, "/metrics", 5000, "prometheus:guess").status().message()),
              HasSubstr("401"));
  EXPECT_THAT(std::string(HttpGet(port, "/metrics", 5000, "other:s3cret").status().message()),
              HasSubstr("401"));
  auto page = HttpGet(port, "/metrics", 5000, "prometheus:s3cret");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(*page, HasSubstr("tutti_lookups_total"));
}

TEST_F(ExporterTest, ABasicAuthFileOthersCanReadOrNotOneLineIsRefusedNamingTheField) {
  for (const auto& [text, mode] :
       std::vector<std::pair<std::string, mode_t>>{{"prometheus:s3cret\n", 0644},
                                                   {"prometheus:s3cret\n", 0640},
                                                   {"no-colon\n", 0600},
                                                   {"a:b\nc:d\n", 0600},
                                                   {":s3cret\n", 0600}}) {
    const std::string file = WriteFile("metrics_auth_bad", text, mode);
    auto e = Start(ExporterOptions{"127.0.0.1:0", false, file});
    ASSERT_FALSE(e.ok()) << text << " mode " << mode;
    EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(e.status().message()), HasSubstr("metrics.basic_auth_file"));
  }
  auto missing = Start(ExporterOptions{"127.0.0.1:0", false, "/nonexistent/auth"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
}

// More stalled clients than serving threads: each holds a thread until the request timeout, and
// the scrape, queued behind them, is served once their threads come free. (With prometheus-cpp's
// defaults, 2 threads and civetweb's 30 s timeout, the scrape waited minutes.)
TEST_F(ExporterTest, ClientsStalledMidRequestDoNotStopAScrape) {
  auto e = Start("127.0.0.1:0");
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<UniqueFd> stalled;
  for (int i = 0; i < MetricsExporter::kServingThreads + 8; ++i) {
    absl::StatusOr<UniqueFd> fd = OpenHalfSentRequest((*e)->port());
    ASSERT_TRUE(fd.ok()) << fd.status();
    stalled.push_back(std::move(*fd));
  }
  auto page = HttpGet((*e)->port(), "/metrics", /*timeout_ms=*/30000);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(*page, HasSubstr("tutti_lookups_total"));
}

}  // namespace
}  // namespace tutti::metrics

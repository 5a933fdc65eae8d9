// The exporter over a real block store (in-memory backend): off means no endpoint; a scrape over
// HTTP shows the store's figures as they move; a taken port is refused naming the field.
#include "daemon/metrics/exporter.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/io/memory_backend.h"
#include "daemon/metrics/http_get.h"
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
  }

  absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const std::string& listen) {
    MetricsSources src;
    src.store = store_.get();
    src.pool_dirs = {"/pool0"};
    return MetricsExporter::Start(listen, std::move(src));
  }

  void StoreDurable(absl::Span<const Key> keys) {
    auto out = store_->Capture(
        ns_, keys, 0, kLayers,
        [](absl::Span<const store::GatherOp> ops) {
          for (const store::GatherOp& op : ops) std::memset(op.dst, 7, 2048);
          return absl::OkStatus();
        },
        /*wait_durable=*/true);
    ASSERT_TRUE(out.ok()) << out.status();
    for (store::CaptureOutcome c : *out) ASSERT_EQ(c, store::CaptureOutcome::kDurable);
  }

  ManualClock clock_;
  std::unique_ptr<store::BlockStore> store_;
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
  EXPECT_EQ(MetricsExporter::Start("127.0.0.1:0", {}).status().code(),
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

}  // namespace
}  // namespace tutti::metrics

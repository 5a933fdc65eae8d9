// The real tuttid asked for io.backend "gds" or "nvme" on a machine where it cannot run (here:
// host mode, no GPU staging; no vfio-pci device; the cuFile failures themselves are covered by
// daemon/io:gds_backend_test): it falls back to uring and says why in Admin.Status, `tuttictl
// status`, the metric tutti_io_backend_info and the log; with io.fallback "fail" it refuses to
// start, naming the reason.
#include <regex>
#include <string>

#include "daemon/metrics/http_get.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tutti::testing {
namespace {

using ::testing::HasSubstr;

constexpr const char* kHostModeReason = "gds: host mode";

TEST(IoFallbackTest, GdsFallsBackToUringAndStatusMetricsAndLogSayWhy) {
  TuttidConfig config;
  config.backend = "gds";
  config.metrics_listen = "127.0.0.1:0";
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();

  grpc::ClientContext ctx;
  v1::StatusResponse st;
  ASSERT_TRUE((*daemon)->admin().Status(&ctx, v1::StatusRequest(), &st).ok());
  EXPECT_EQ(st.io_backend(), "uring");
  EXPECT_EQ(st.io_backend_requested(), "gds");
  EXPECT_THAT(st.io_backend_reason(), HasSubstr(kHostModeReason));
  EXPECT_THAT(st.notes(), HasSubstr("io backend \"uring\" instead of \"gds\""));

  const std::string ctl = RunfilePath("client/tuttictl");
  CommandResult r = RunCommand({ctl, "--socket=" + (*env)->socket(), "status"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("io backend   uring"));
  EXPECT_THAT(r.out, HasSubstr(std::string("asked for \"gds\": ") + kHostModeReason));
  r = RunCommand({ctl, "--socket=" + (*env)->socket(), "status", "--json"});
  EXPECT_THAT(r.out, HasSubstr("\"io_backend_requested\":\"gds\""));

  const std::string log = (*daemon)->LogTail(1 << 20);
  EXPECT_THAT(log, HasSubstr("io backend \"gds\" cannot run here; using \"uring\": gds: host"));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("metrics on http://127\\.0\\.0\\.1:([0-9]+)/")));
  auto page = metrics::HttpGet(std::stoi(m[1]), "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(*page, HasSubstr("tutti_io_backend_info{backend=\"uring\",requested=\"gds\","
                               "reason=\"gds: host mode"));
}

TEST(IoFallbackTest, UringReportsNoFallback) {
  auto env = TuttidEnv::Create(TuttidConfig{});
  ASSERT_TRUE(env.ok()) << env.status();
  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  grpc::ClientContext ctx;
  v1::StatusResponse st;
  ASSERT_TRUE((*daemon)->admin().Status(&ctx, v1::StatusRequest(), &st).ok());
  EXPECT_EQ(st.io_backend(), "uring");
  EXPECT_EQ(st.io_backend_requested(), "uring");
  EXPECT_EQ(st.io_backend_reason(), "");
}

TEST(IoFallbackTest, FallbackFailRefusesToStartNamingTheReason) {
  TuttidConfig config;
  config.backend = "gds";
  config.io_fallback = "fail";
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  auto daemon = TuttidProcess::Start(**env, 20);
  ASSERT_FALSE(daemon.ok());
  EXPECT_THAT(daemon.status().message(),
              HasSubstr("io.backend \"gds\" cannot run on this host and io.fallback is \"fail\": "
                        "gds: host mode"));
}

// io.backend "nvme" on this machine (no vfio, no such PCI device): ProbeVfio's reason, prefixed
// with the address, is what status, the metric and the log report; the pool goes on pool.dirs.
constexpr const char* kNoSuchController = "0000:ff:1f.7";

TEST(IoFallbackTest, NvmeWithoutVfioFallsBackToUringWithTheProbeReason) {
  TuttidConfig config;
  config.backend = "nvme";
  config.extra_io = std::string("nvme_devices: \"") + kNoSuchController + "\"";
  config.metrics_listen = "127.0.0.1:0";
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();

  grpc::ClientContext ctx;
  v1::StatusResponse st;
  ASSERT_TRUE((*daemon)->admin().Status(&ctx, v1::StatusRequest(), &st).ok());
  EXPECT_EQ(st.io_backend(), "uring");
  EXPECT_EQ(st.io_backend_requested(), "nvme");
  const std::string reason =
      std::string("nvme cannot run: io.nvme_devices: ") + kNoSuchController + ": ";
  EXPECT_THAT(st.io_backend_reason(), HasSubstr(reason));
  const std::string log = (*daemon)->LogTail(1 << 20);
  EXPECT_THAT(log, HasSubstr("io backend \"nvme\" cannot run here; using \"uring\": " + reason));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("metrics on http://127\\.0\\.0\\.1:([0-9]+)/")));
  auto page = metrics::HttpGet(std::stoi(m[1]), "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(*page, HasSubstr("requested=\"nvme\",reason=\"" + reason));
  EXPECT_EQ((*env)->PoolDiskUse().files, 1u);  // the pool on pool.dirs, as for uring
}

TEST(IoFallbackTest, NvmeWithFallbackFailRefusesToStartNamingTheReason) {
  TuttidConfig config;
  config.backend = "nvme";
  config.io_fallback = "fail";
  config.extra_io = std::string("nvme_devices: \"") + kNoSuchController + "\"";
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  auto daemon = TuttidProcess::Start(**env, 20);
  ASSERT_FALSE(daemon.ok());
  EXPECT_THAT(daemon.status().message(),
              HasSubstr(std::string("io.backend \"nvme\" cannot run on this host and "
                                    "io.fallback is \"fail\": io.nvme_devices: ") +
                        kNoSuchController));
}

}  // namespace
}  // namespace tutti::testing

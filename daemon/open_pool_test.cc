// OpenPool for each kind of place the pool can live, on this machine (no NVMe, no vfio): the
// backends on whole namespaces fall back to uring over pool.dirs, with the reasons tuttid reports.
// The pool on a real namespace: tests/vm.
#include "daemon/open_pool.h"

#include "config/config.h"
#include "daemon/io/test_util.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

class OpenPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    dir_ = io::testing::MakeODirectDir("open_pool", &why);
    if (dir_.empty()) GTEST_SKIP() << why;
  }
  void TearDown() override {
    if (!dir_.empty()) io::testing::RemoveTree(dir_);
  }

  // A 64 MiB pool on <dir>/pool (the default directory: created) with `io` settings.
  v1::Config Config(const std::string& io, const std::string& pool_dir = "") {
    const std::string dir = pool_dir.empty() ? dir_ + "/pool" : pool_dir;
    auto c = config::LoadConfig("state_dir: \"" + dir_ +
                                "\" pool { capacity_bytes: 67108864 object_bytes: 4096 "
                                "max_objects: 4 dirs: \"" + dir + "\" } io { " + io + " }");
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  }

  // Expects the pool on pool.dirs, over io_uring.
  void ExpectOnPoolDirs(const OpenedPool& p) {
    ASSERT_NE(p.backend, nullptr);
    EXPECT_EQ(p.backend->name(), "uring");
    EXPECT_EQ(p.places, std::vector<std::string>{dir_ + "/pool"});
    EXPECT_EQ(p.layout.num_files(), 1u);
    EXPECT_EQ(p.backend->file_size(0), p.layout.file_bytes());
    EXPECT_NE(p.pool_id, 0u);
  }

  std::string dir_;
};

TEST_F(OpenPoolTest, UringRunsOnPoolDirs) {
  auto p = OpenPool(Config("backend: \"uring\""), {});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectOnPoolDirs(*p);
  EXPECT_EQ(p->choice.backend, "uring");
  EXPECT_EQ(p->choice.requested, "uring");
  EXPECT_EQ(p->choice.reason, "");
}

TEST_F(OpenPoolTest, MemoryTakesTheLayoutAndNoFile) {
  auto p = OpenPool(Config("backend: \"memory\""), {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->backend->name(), "memory");
  EXPECT_EQ(p->backend->file_size(0), p->layout.file_bytes());
  EXPECT_EQ(p->pool_id, 0u);
  EXPECT_FALSE(p->choice.fell_back());
}

TEST_F(OpenPoolTest, MissingDeviceFallsBackToUringWithTheReason) {
  auto p = OpenPool(
      Config("backend: \"uring_cmd\" passthrough_devices: \"/dev/ng-tutti-none\""), {});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectOnPoolDirs(*p);
  EXPECT_EQ(p->choice.backend, "uring");
  EXPECT_EQ(p->choice.requested, "uring_cmd");
  EXPECT_EQ(p->choice.reason,
            "uring_cmd cannot run: io.passthrough_devices: open /dev/ng-tutti-none: No such file "
            "or directory");
}

TEST_F(OpenPoolTest, ACharDeviceThatIsNotNvmeFallsBack) {
  auto p = OpenPool(
      Config("backend: \"uring_cmd\" passthrough_devices: \"/dev/null\" fallback: \"uring\""),
      {});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectOnPoolDirs(*p);
  EXPECT_EQ(p->choice.backend, "uring");
  EXPECT_NE(p->choice.reason.find("/dev/null"), std::string::npos);
  EXPECT_NE(p->choice.reason.find("not an NVMe namespace"), std::string::npos) << p->choice.reason;
}

TEST_F(OpenPoolTest, FallbackFailRefusesToStart) {
  auto p = OpenPool(Config("backend: \"uring_cmd\" passthrough_devices: \"/dev/ng-tutti-none\" "
                           "fallback: \"fail\""),
                    {});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("io.fallback is \"fail\""), std::string::npos)
      << p.status();
  EXPECT_EQ(p.status().message(),
            "io.backend \"uring_cmd\" cannot run on this host and io.fallback is \"fail\": "
            "io.passthrough_devices: open /dev/ng-tutti-none: No such file or directory");
}

TEST_F(OpenPoolTest, NvmeWithoutVfioFallsBackWithTheProbeReason) {
  auto p = OpenPool(Config("backend: \"nvme\" nvme_devices: \"0000:ff:1f.7\""), {});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectOnPoolDirs(*p);
  EXPECT_EQ(p->choice.backend, "uring");
  EXPECT_EQ(p->choice.requested, "nvme");
  EXPECT_EQ(p->choice.reason.rfind("nvme cannot run: io.nvme_devices: 0000:ff:1f.7: ", 0), 0u)
      << p->choice.reason;
}

TEST_F(OpenPoolTest, GdsInHostModeFallsBackOverTheSameFiles) {
  auto p = OpenPool(Config("backend: \"gds\""), {});  // no GPU staging
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectOnPoolDirs(*p);
  EXPECT_EQ(p->choice.requested, "gds");
  EXPECT_EQ(p->choice.reason.rfind("gds: host mode", 0), 0u) << p->choice.reason;
}

// The fallback's own failure names both: why the requested backend could not run, and why the
// fallback could not either (a configured pool directory that does not exist is never created).
TEST_F(OpenPoolTest, AFallbackThatCannotOpenThePoolSaysBoth) {
  auto p = OpenPool(Config("backend: \"uring_cmd\" passthrough_devices: \"/dev/ng-tutti-none\"",
                           dir_ + "/not-mounted"),
                    {});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message().rfind("fallback to uring (uring_cmd cannot run: "
                                       "io.passthrough_devices: open /dev/ng-tutti-none",
                                       0),
            0u)
      << p.status();
  EXPECT_NE(p.status().message().find("not-mounted"), std::string::npos) << p.status();
}

}  // namespace
}  // namespace tutti

// io.backend "uring_cmd" where passthrough cannot run (this machine has no NVMe): the fallback
// decisions, with the reasons tuttid reports. The pool on a real namespace: tests/vm.
#include "daemon/passthrough_pool.h"

#include "config/config.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

v1::Config Config(const std::string& io) {
  auto c = config::LoadConfig("io { " + io + " }");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(PassthroughPoolTest, OtherBackendsAreLeftAlone) {
  auto p = OpenPassthroughPool(Config("backend: \"uring\""));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->backend, nullptr);
  EXPECT_EQ(p->choice.backend, "uring");
  EXPECT_EQ(p->choice.requested, "uring");
  EXPECT_EQ(p->choice.reason, "");
}

TEST(PassthroughPoolTest, MissingDeviceFallsBackToUringWithTheReason) {
  auto p = OpenPassthroughPool(
      Config("backend: \"uring_cmd\" passthrough_devices: \"/dev/ng-tutti-none\""));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->backend, nullptr);
  EXPECT_FALSE(p->layout.has_value());
  EXPECT_EQ(p->choice.backend, "uring");
  EXPECT_EQ(p->choice.requested, "uring_cmd");
  EXPECT_EQ(p->choice.reason,
            "uring_cmd cannot run: io.passthrough_devices: open /dev/ng-tutti-none: No such file "
            "or directory");
}

TEST(PassthroughPoolTest, ACharDeviceThatIsNotNvmeFallsBack) {
  auto p = OpenPassthroughPool(
      Config("backend: \"uring_cmd\" passthrough_devices: \"/dev/null\" fallback: \"uring\""));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->choice.backend, "uring");
  EXPECT_NE(p->choice.reason.find("/dev/null"), std::string::npos);
  EXPECT_NE(p->choice.reason.find("not an NVMe namespace"), std::string::npos) << p->choice.reason;
}

TEST(PassthroughPoolTest, FallbackFailRefusesToStart) {
  auto p = OpenPassthroughPool(Config(
      "backend: \"uring_cmd\" passthrough_devices: \"/dev/ng-tutti-none\" fallback: \"fail\""));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(p.status().message().find("io.fallback is \"fail\""), std::string::npos)
      << p.status();
}

TEST(PassthroughPoolTest, NvmeWithoutVfioFallsBackWithTheProbeReason) {
  auto p = OpenPassthroughPool(Config("backend: \"nvme\" nvme_devices: \"0000:ff:1f.7\""));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->backend, nullptr);
  EXPECT_EQ(p->choice.backend, "uring");
  EXPECT_EQ(p->choice.requested, "nvme");
  EXPECT_EQ(p->choice.reason.rfind("nvme cannot run: io.nvme_devices: 0000:ff:1f.7: ", 0), 0u)
      << p->choice.reason;
}

}  // namespace
}  // namespace tutti

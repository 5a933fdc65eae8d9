#include "daemon/io/backend_choice.h"

#include "gtest/gtest.h"

namespace tutti::io {
namespace {

TEST(BackendChoiceTest, ChosenHasNoReason) {
  const BackendChoice c = Chosen("uring_cmd");
  EXPECT_EQ(c.backend, "uring_cmd");
  EXPECT_EQ(c.requested, "uring_cmd");
  EXPECT_EQ(c.reason, "");
}

TEST(BackendChoiceTest, FallsBackToUringWithTheReasonByDefault) {
  const absl::Status why = absl::NotFoundError("open /dev/ng0n1: No such file or directory");
  for (const char* fallback : {"", "uring"}) {
    auto c = ChooseFallback("uring_cmd", fallback, why);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->backend, "uring");
    EXPECT_EQ(c->requested, "uring_cmd");
    EXPECT_EQ(c->reason, "uring_cmd cannot run: open /dev/ng0n1: No such file or directory");
  }
  auto c = ChooseFallback("uring_cmd", "", absl::PermissionDeniedError("needs CAP_SYS_ADMIN"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend, "uring");
}

TEST(BackendChoiceTest, FailKeepsTheCodeAndNamesTheSetting) {
  auto c = ChooseFallback("uring_cmd", "fail", absl::UnavailableError("no IORING_OP_URING_CMD"));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(c.status().message(),
            "io.backend \"uring_cmd\" cannot run (io.fallback is \"fail\"): no "
            "IORING_OP_URING_CMD");
}

TEST(BackendChoiceTest, ConfigurationErrorsNeverFallBack) {
  const absl::Status bad = absl::InvalidArgumentError("io.queue_depth must be in [1, 4096]");
  EXPECT_EQ(ChooseFallback("uring_cmd", "uring", bad).status(), bad);
  EXPECT_EQ(ChooseFallback("uring_cmd", "fail", bad).status(), bad);
}

}  // namespace
}  // namespace tutti::io

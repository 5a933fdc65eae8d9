#include "gpu/probe.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <string>

#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

// Runs everywhere: without a driver or GPU the answer is UNAVAILABLE, never a crash.
TEST(ProbeTest, AnswersCleanlyWithOrWithoutGpu) {
  absl::StatusOr<DeviceInfo> info = Probe();
  if (!info.ok()) {
    EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable) << info.status();
    EXPECT_FALSE(info.status().message().empty());
    return;
  }
  EXPECT_GT(info->sm_count, 0);
  EXPECT_GE(info->cc_major, kMinComputeMajor);
  EXPECT_GT(info->total_memory, 0u);
  EXPECT_EQ(info->uuid_text, FormatUuid(info->uuid));
  absl::StatusOr<Uuid> parsed = ParseUuid(info->uuid_text);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, info->uuid);
}

TEST(ProbeTest, RejectsNegativeOrdinalOrReportsNoGpu) {
  absl::StatusOr<DeviceInfo> info = Probe(-1);
  ASSERT_FALSE(info.ok());
  EXPECT_TRUE(info.status().code() == absl::StatusCode::kInvalidArgument ||
              info.status().code() == absl::StatusCode::kUnavailable)
      << info.status();
}

TEST(UuidTest, FormatsLikeNvidiaSmiAndParsesBack) {
  Uuid u;
  for (int i = 0; i < 16; ++i) u[i] = static_cast<uint8_t>(0x10 * i + 15 - i);
  const std::string text = FormatUuid(u);
  EXPECT_EQ(text, "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
  EXPECT_EQ(*ParseUuid(text), u);
  EXPECT_EQ(*ParseUuid("0F1E2D3C4B5A69788796A5B4C3D2E1F0"), u);
  EXPECT_EQ(*ParseUuid("gpu-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"), u);
}

TEST(UuidTest, RejectsMalformed) {
  EXPECT_FALSE(ParseUuid("").ok());
  EXPECT_FALSE(ParseUuid("GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f").ok());    // 31 digits
  EXPECT_FALSE(ParseUuid("GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f00").ok());  // 33 digits
  EXPECT_FALSE(ParseUuid("GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fg").ok());
}

TEST(MpsHintTest, LooksForTheControlPipeWhereClientsWould) {
  std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                    "/mps_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  ASSERT_EQ(setenv("CUDA_MPS_PIPE_DIRECTORY", dir.c_str(), 1), 0);
  MpsHint hint = FindMps();
  EXPECT_EQ(hint.pipe_directory, dir);
  EXPECT_FALSE(hint.control_pipe_found);
  ASSERT_EQ(mkfifo((dir + "/control").c_str(), 0600), 0);
  EXPECT_TRUE(FindMps().control_pipe_found);
  ASSERT_EQ(unsetenv("CUDA_MPS_PIPE_DIRECTORY"), 0);
  EXPECT_EQ(FindMps().pipe_directory, "/tmp/nvidia-mps");
}

}  // namespace
}  // namespace tutti::gpu

// gpu_setup_none.cc: a build without CUDA runs in host mode and refuses gpu.mode "cuda".
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "daemon/gpu_setup.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::gpu_setup {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Config WithMode(const std::string& mode) {
  v1::Config c = config::DefaultConfig();
  c.mutable_gpu()->set_mode(mode);
  return c;
}

TEST(GpuSetupNoneTest, SaysItWasBuiltWithoutCuda) { EXPECT_FALSE(BuiltWithCuda()); }

TEST(GpuSetupNoneTest, AutoAndHostChooseHostModeAndSayWhy) {
  for (const std::string mode : {"auto", "host"}) {
    std::vector<std::string> notes;
    absl::StatusOr<std::optional<ChosenGpu>> gpu = ChooseDevice(WithMode(mode), &notes);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_FALSE(gpu->has_value());
    EXPECT_THAT(notes, ElementsAre(HasSubstr("built without CUDA (gpu.mode = " + mode)));
  }
}

TEST(GpuSetupNoneTest, CudaModeIsRefused) {
  std::vector<std::string> notes;
  absl::StatusOr<std::optional<ChosenGpu>> gpu = ChooseDevice(WithMode("cuda"), &notes);
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gpu.status().message(), HasSubstr("gpu.mode = cuda"));
  EXPECT_THAT(gpu.status().message(), HasSubstr("built without CUDA"));
}

}  // namespace
}  // namespace tutti::gpu_setup

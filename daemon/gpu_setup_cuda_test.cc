// gpu_setup_cuda.cc without a GPU (CI): gpu.mode "auto" falls back to host mode, "cuda" refuses;
// the GPU staging is bounded by gpu.max_staging_bytes. On a GPU machine the device is chosen.
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

TEST(GpuSetupCudaTest, SaysItWasBuiltWithCuda) { EXPECT_TRUE(BuiltWithCuda()); }

TEST(GpuSetupCudaTest, ChoosesTheGpuOrFallsBackWithoutOne) {
  std::vector<std::string> notes;
  absl::StatusOr<std::optional<ChosenGpu>> gpu = ChooseDevice(WithMode("auto"), &notes);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::optional<ChosenGpu>> strict = ChooseDevice(WithMode("cuda"), &notes);
  if (gpu->has_value()) {
    EXPECT_GT((*gpu)->sm_count, 0);
    ASSERT_TRUE(strict.ok()) << strict.status();
    EXPECT_TRUE(strict->has_value());
    return;
  }
  EXPECT_THAT(notes, ElementsAre(HasSubstr("host mode: no usable GPU")));
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(strict.status().message(), HasSubstr("gpu.mode = cuda, but GPU 0 is not usable"));
}

TEST(GpuSetupCudaTest, HostModeProbesNothing) {
  std::vector<std::string> notes;
  absl::StatusOr<std::optional<ChosenGpu>> gpu = ChooseDevice(WithMode("host"), &notes);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_FALSE(gpu->has_value());
  EXPECT_THAT(notes, ElementsAre(HasSubstr("gpu.mode = host")));
}

TEST(GpuSetupCudaTest, StagingIsOneLayerOfAMaximalCallBoundedByConfig) {
  v1::Config c = config::DefaultConfig();
  c.mutable_pool()->set_object_bytes(64 << 10);
  c.mutable_limits()->set_max_blocks_per_call(1024);  // a layer: 1024 x 2 x 64 KiB = 128 MiB
  c.mutable_gpu()->set_max_staging_bytes(512ull << 20);
  EXPECT_EQ(GpuStagingBytes(c), 128ull << 20);
  c.mutable_gpu()->set_max_staging_bytes(32ull << 20);
  EXPECT_EQ(GpuStagingBytes(c), 32ull << 20);
  c.mutable_pool()->set_object_bytes(16 << 20);  // 4 slots of one object each above the bound
  EXPECT_EQ(GpuStagingBytes(c), 64ull << 20);
}

}  // namespace
}  // namespace tutti::gpu_setup

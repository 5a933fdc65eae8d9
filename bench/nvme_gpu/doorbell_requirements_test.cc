#include "bench/nvme_gpu/doorbell_requirements.h"

#include "gtest/gtest.h"

namespace tutti::io::nvme::gpu {
namespace {

constexpr char kOpen570[] =
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.07  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Fri Mar 14 13:12:07 UTC 2025\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n";
constexpr char kProprietary575[] =
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  575.57.08  Sat May 24 07:21:36 UTC 2025\n";
constexpr char kOpen565[] =
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01  Release Build\n";
constexpr char kOpen570Older[] =
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.06  Release Build\n";

TEST(DoorbellRequirementsTest, ParsesOpenAndProprietaryModules) {
  auto open = ParseNvidiaDriverVersion(kOpen570);
  ASSERT_TRUE(open.has_value());
  EXPECT_TRUE(open->open_module);
  EXPECT_EQ(open->major, 570u);
  EXPECT_EQ(open->minor, 133u);
  EXPECT_EQ(open->patch, 7u);
  auto prop = ParseNvidiaDriverVersion(kProprietary575);
  ASSERT_TRUE(prop.has_value());
  EXPECT_FALSE(prop->open_module);
  EXPECT_EQ(prop->major, 575u);
  EXPECT_FALSE(ParseNvidiaDriverVersion("").has_value());
  EXPECT_FALSE(ParseNvidiaDriverVersion("NVRM version: no number here\n").has_value());
}

TEST(DoorbellRequirementsTest, RootOpenModuleFrom570_133_07) {
  EXPECT_TRUE(CheckIoMemoryRequirements(0, kOpen570).ok());
  EXPECT_TRUE(CheckIoMemoryRequirements(
                  0, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  x\n")
                  .ok());
}

TEST(DoorbellRequirementsTest, EachMissingRequirementIsNamed) {
  absl::Status s = CheckIoMemoryRequirements(1000, kOpen570);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("root"), absl::string_view::npos) << s;
  s = CheckIoMemoryRequirements(0, kProprietary575);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("open module"), absl::string_view::npos) << s;
  s = CheckIoMemoryRequirements(0, kOpen565);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("older than 570.133.07"), absl::string_view::npos) << s;
  s = CheckIoMemoryRequirements(0, kOpen570Older);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  s = CheckIoMemoryRequirements(0, "");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("/proc/driver/nvidia/version"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace tutti::io::nvme::gpu

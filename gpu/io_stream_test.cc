#include "gpu/io_stream.h"

#include "absl/strings/match.h"
#include "gpu/testing/test_util.h"
#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

// These run without a GPU: bad configuration is refused before the device is touched.
TEST(IoStreamOptionsTest, SmCountMustBeAMultipleOfEight) {
  EXPECT_TRUE(IoStream::ValidateOptions({0, 16, 0}, 132).ok());
  EXPECT_TRUE(IoStream::ValidateOptions({0, 0, 0}, 132).ok());
  EXPECT_EQ(IoStream::ValidateOptions({0, 12, 0}, 132).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IoStream::ValidateOptions({0, 136, 0}, 132).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IoStream::ValidateOptions({-1, 16, 0}, 132).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<IoStream>> io = IoStream::Create({0, 20, 0});
  EXPECT_EQ(io.status().code(), absl::StatusCode::kInvalidArgument) << io.status();
}

TEST(IoStreamTest, WithoutGpuCreateIsUnavailable) {
  if (Probe().ok()) GTEST_SKIP() << "a GPU is present";
  absl::StatusOr<std::unique_ptr<IoStream>> io = IoStream::Create({});
  EXPECT_EQ(io.status().code(), absl::StatusCode::kUnavailable) << io.status();
}

TEST(IoStreamTest, GreenContextBoundsTheSms) {
  TUTTI_SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<IoStream>> io = IoStream::Create({0, 16, 0});
  ASSERT_TRUE(io.ok()) << io.status();
  std::printf("I/O stream: %s\n", (*io)->description().c_str());
  if ((*io)->is_green()) {
    EXPECT_GE((*io)->sm_count(), 16u);
    EXPECT_LT((*io)->sm_count(), static_cast<uint32_t>(Probe()->sm_count));
    EXPECT_TRUE(absl::StrContains((*io)->description(), "green context")) << (*io)->description();
  } else {
    // A fallback must say why.
    EXPECT_TRUE(absl::StrContains((*io)->description(), "ordinary stream: "));
  }
  EXPECT_EQ((*io)->ctas(), 2 * 16u);
  EXPECT_TRUE((*io)->Synchronize().ok());
}

TEST(IoStreamTest, ZeroSmsGivesAnOrdinaryStream) {
  TUTTI_SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<IoStream>> io = IoStream::Create({0, 0, 8});
  ASSERT_TRUE(io.ok()) << io.status();
  EXPECT_FALSE((*io)->is_green());
  EXPECT_EQ((*io)->sm_count(), static_cast<uint32_t>(Probe()->sm_count));
  EXPECT_EQ((*io)->ctas(), 8u);
}

TEST(IoStreamTest, TwoGreenStreamsCoexist) {
  TUTTI_SKIP_WITHOUT_GPU();
  absl::StatusOr<std::unique_ptr<IoStream>> a = IoStream::Create({0, 8, 0});
  absl::StatusOr<std::unique_ptr<IoStream>> b = IoStream::Create({0, 24, 0});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*a)->is_green(), (*b)->is_green());
}

}  // namespace
}  // namespace tutti::gpu

#include "daemon/io/io_factory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "daemon/io/aligned_buffer.h"
#include "daemon/io/test_util.h"
#include "gtest/gtest.h"

namespace tutti::io {
namespace {

TEST(IoFactoryTest, NamesTheBackends) {
  EXPECT_EQ(IoBackendNames(),
            (std::vector<std::string_view>{"uring", "memory", "gds", "uring_cmd", "nvme"}));
}

TEST(IoFactoryTest, UnknownNameListsTheAllowedOnes) {
  auto b = CreateIoBackend("spdk", {}, {1 << 20});
  ASSERT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("uring, memory, gds, uring_cmd"), std::string::npos) << b.status();
  EXPECT_NE(b.status().message().find("spdk"), std::string::npos) << b.status();
}

TEST(IoFactoryTest, MemoryBackendRoundTrip) {
  auto b = CreateIoBackend("memory", {}, {1 << 20, 1 << 20});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "memory");
  EXPECT_EQ((*b)->num_files(), 2u);
  AlignedBuffer buf(4096);
  std::memset(buf.data(), 7, 4096);
  IoRequest w{Op::kWrite, 1, 8192, buf.data(), 4096};
  (*b)->Execute(absl::MakeSpan(&w, 1));
  EXPECT_EQ(w.result, 4096);
}

class UringFactoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    dir_ = testing::MakeODirectDir("factory", &why);
    if (dir_.empty()) GTEST_SKIP() << why;
    fd_ = open((dir_ + "/f").c_str(), O_CREAT | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(ftruncate(fd_, 1 << 20), 0);
  }
  void TearDown() override {
    if (!dir_.empty()) testing::RemoveTree(dir_);
  }
  std::string dir_;
  int fd_ = -1;
};

TEST_F(UringFactoryTest, CreatesUringAndChecksSizes) {
  auto b = CreateIoBackend("uring", {fd_}, {1 << 20}, IoOptions{16});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "uring");
  EXPECT_EQ((*b)->file_size(0), 1u << 20);
}

TEST_F(UringFactoryTest, SizeMismatchIsFailedPrecondition) {
  auto b = CreateIoBackend("uring", {fd_}, {2 << 20});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_EQ(fcntl(fd_, F_GETFD), -1) << "the backend owned and closed the fd";
}

}  // namespace
}  // namespace tutti::io

namespace tutti::io {
namespace {

// "nvme" where no vfio exists (a sysfs tree without the device).
IoOptions NvmeWithoutVfio() {
  IoOptions o;
  o.nvme.pci_addresses = {"0000:01:00.0"};
  o.nvme.sysfs_root = ::testing::TempDir() + "/no-sysfs";
  o.nvme.dev_root = ::testing::TempDir() + "/no-dev";
  return o;
}

TEST(IoFactoryTest, NvmeWithoutVfioIsUnavailableWithTheProbeReason) {
  auto b = CreateIoBackend("nvme", {}, {}, NvmeWithoutVfio());
  ASSERT_TRUE(absl::IsUnavailable(b.status())) << b.status();
  EXPECT_NE(b.status().message().find("io.nvme_devices: 0000:01:00.0: "), std::string::npos)
      << b.status();
}

TEST(IoFactoryTest, NvmeWithoutDevicesIsInvalidNotAFallback) {
  IoOptions o;
  auto b = OpenIoBackend("nvme", {}, {}, o);
  ASSERT_TRUE(absl::IsInvalidArgument(b.status())) << b.status();
  EXPECT_NE(b.status().message().find("io.nvme_devices"), std::string::npos) << b.status();
}

TEST_F(UringFactoryTest, NvmeWithoutVfioFallsBackToUringSayingWhy) {
  auto b = OpenIoBackend("nvme", {fd_}, {1 << 20}, NvmeWithoutVfio());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->backend->name(), "uring");
  EXPECT_EQ(b->choice.requested, "nvme");
  EXPECT_EQ(b->choice.backend, "uring");
  EXPECT_EQ(b->choice.reason.rfind("io.nvme_devices: 0000:01:00.0: ", 0), 0u) << b->choice.reason;
}

}  // namespace
}  // namespace tutti::io

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
  EXPECT_TRUE((*b)->ReadsInto(MemoryKind::kHost));
  EXPECT_FALSE((*b)->ReadsInto(MemoryKind::kDevice));
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
  EXPECT_EQ(b->choice.reason.rfind("nvme cannot run: io.nvme_devices: 0000:01:00.0: ", 0), 0u)
      << b->choice.reason;
}

}  // namespace
}  // namespace tutti::io

namespace tutti::io {
namespace {

// A PoolFilesSource that records how it was asked and hands over `fds` (sizes 1 MiB each).
struct FakeFiles {
  std::vector<int> fds;
  int asked_open = 0;
  int asked_sizes = 0;
  absl::Status error;  // returned instead, when set

  PoolFilesSource Source() {
    return [this](bool open) -> absl::StatusOr<PoolFileSet> {
      ++(open ? asked_open : asked_sizes);
      if (!error.ok()) return error;
      PoolFileSet set;
      set.sizes.assign(open ? fds.size() : 2, 1 << 20);
      if (open) set.fds = std::exchange(fds, {});
      return set;
    };
  }
};

TEST(OpenIoBackendTest, MemoryAsksOnlyForTheSizes) {
  FakeFiles files;
  auto b = OpenIoBackend("memory", files.Source());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->backend->name(), "memory");
  EXPECT_EQ(b->backend->num_files(), 2u);
  EXPECT_FALSE(b->choice.fell_back());
  EXPECT_EQ(files.asked_sizes, 1);
  EXPECT_EQ(files.asked_open, 0);
}

TEST(OpenIoBackendTest, ErrorsThatAreNotCannotRunNeverTouchTheFiles) {
  FakeFiles files;
  auto unknown = OpenIoBackend("spdk", files.Source());
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status())) << unknown.status();
  IoOptions o;  // "nvme" without io.nvme_devices: a configuration error, not the host
  auto nvme = OpenIoBackend("nvme", files.Source(), o);
  EXPECT_TRUE(absl::IsInvalidArgument(nvme.status())) << nvme.status();
  o.fallback = "sideways";
  auto setting = OpenIoBackend("memory", files.Source(), o);
  EXPECT_TRUE(absl::IsInvalidArgument(setting.status())) << setting.status();
  EXPECT_EQ(files.asked_open + files.asked_sizes, 0);
}

TEST(OpenIoBackendTest, FallbackFailNeverTouchesTheFiles) {
  FakeFiles files;
  IoOptions o;
  o.fallback = "fail";
  o.passthrough_devices = {"/dev/ng-tutti-none"};
  auto b = OpenIoBackend("uring_cmd", files.Source(), o);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b.status().message(),
            "io.backend \"uring_cmd\" cannot run on this host and io.fallback is \"fail\": "
            "io.passthrough_devices: open /dev/ng-tutti-none: No such file or directory");
  EXPECT_EQ(files.asked_open + files.asked_sizes, 0);
}

TEST(OpenIoBackendTest, AFallbackWhosePoolFilesFailSaysBoth) {
  FakeFiles files;
  files.error = absl::NotFoundError("pool.dirs[0] /ssd0 does not exist");
  IoOptions o;
  o.passthrough_devices = {"/dev/ng-tutti-none"};
  auto b = OpenIoBackend("uring_cmd", files.Source(), o);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b.status().message(),
            "fallback to uring (uring_cmd cannot run: io.passthrough_devices: open "
            "/dev/ng-tutti-none: No such file or directory) failed: pool.dirs[0] /ssd0 does not "
            "exist");
  EXPECT_EQ(files.asked_open, 1);
}

// Passthrough's every failure to use its devices means it cannot run here: /dev/null is a char
// device, but not an NVMe namespace.
TEST(OpenIoBackendTest, PassthroughOnACharDeviceThatIsNotNvmeIsUnavailable) {
  const int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto b = CreateIoBackend("uring_cmd", {fd}, {});
  EXPECT_TRUE(absl::IsUnavailable(b.status())) << b.status();
  EXPECT_NE(b.status().message().find("/dev/null"), std::string::npos) << b.status();
  IoOptions o;
  o.passthrough_devices = {"/dev/null"};
  auto c = CreateIoBackend("uring_cmd", {}, {}, o);  // the devices opened by the factory
  EXPECT_TRUE(absl::IsUnavailable(c.status())) << c.status();
}

TEST_F(UringFactoryTest, PassthroughFallsBackToUringOverTheFilesAskedForThen) {
  FakeFiles files;
  files.fds = {fd_};
  IoOptions o;
  o.passthrough_devices = {"/dev/ng-tutti-none"};
  auto b = OpenIoBackend("uring_cmd", files.Source(), o);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->backend->name(), "uring");
  EXPECT_EQ(b->backend->num_files(), 1u);
  EXPECT_EQ(b->choice.requested, "uring_cmd");
  EXPECT_EQ(b->choice.reason,
            "uring_cmd cannot run: io.passthrough_devices: open /dev/ng-tutti-none: No such file "
            "or directory");
  EXPECT_EQ(files.asked_open, 1);
  EXPECT_EQ(files.asked_sizes, 0);
}

TEST_F(UringFactoryTest, UringNeverFallsBack) {
  // A pool file that does not match its layout is an error with either io.fallback value.
  for (const char* fallback : {"uring", "fail"}) {
    const int fd = open((dir_ + "/f").c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    IoOptions o;
    o.fallback = fallback;
    auto b = OpenIoBackend("uring", {fd}, {2 << 20}, o);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
    EXPECT_EQ(fcntl(fd, F_GETFD), -1) << "closed on error";
  }
}

}  // namespace
}  // namespace tutti::io

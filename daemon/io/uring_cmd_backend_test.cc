// The "uring_cmd" backend's checks that need no NVMe device: what it says about paths and fds
// that are not NVMe namespaces (the reasons tuttid falls back with). Against a real namespace:
// uring_cmd_device_test.cc, run in the QEMU guest.
#include "daemon/io/uring_cmd_backend.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace tutti::io {
namespace {

TEST(OpenPassthroughDevicesTest, MissingPathIsNotFound) {
  auto fds = OpenPassthroughDevices({"/dev/ng-tutti-no-such-device"});
  EXPECT_EQ(fds.status().code(), absl::StatusCode::kNotFound) << fds.status();
  EXPECT_NE(fds.status().message().find("/dev/ng-tutti-no-such-device"), std::string::npos);
  EXPECT_NE(fds.status().message().find("No such file"), std::string::npos);
}

TEST(OpenPassthroughDevicesTest, RegularFileIsNotACharDevice) {
  char path[] = "/tmp/uring_cmd_test.XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  auto fds = OpenPassthroughDevices({"/dev/null", path});
  EXPECT_EQ(fds.status().code(), absl::StatusCode::kFailedPrecondition) << fds.status();
  EXPECT_NE(fds.status().message().find("not a char device"), std::string::npos);
  unlink(path);
}

TEST(UringCmdBackendTest, CharDeviceThatIsNotNvmeIsRefusedWithTheReason) {
  auto fds = OpenPassthroughDevices({"/dev/null"});
  ASSERT_TRUE(fds.ok()) << fds.status();
  auto b = UringCmdBackend::Create(*fds, {});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_NE(b.status().message().find("/dev/null"), std::string::npos);
  EXPECT_NE(b.status().message().find("not an NVMe namespace"), std::string::npos);
  // The fd was handed over and closed.
  EXPECT_EQ(fcntl((*fds)[0], F_GETFD), -1);
}

TEST(UringCmdBackendTest, RegularFileFdIsRefused) {
  char path[] = "/tmp/uring_cmd_test.XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  auto b = UringCmdBackend::Create({fd}, {});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
  EXPECT_NE(b.status().message().find("not a char device"), std::string::npos);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);
}

TEST(UringCmdBackendTest, BadOptionsAreInvalidArgument) {
  EXPECT_EQ(UringCmdBackend::Create({}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  const int fd = open("/dev/null", O_RDWR);
  UringCmdOptions o;
  o.queue_depth = 0;
  EXPECT_EQ(UringCmdBackend::Create({fd}, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);
}

}  // namespace
}  // namespace tutti::io

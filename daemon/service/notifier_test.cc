// SystemdNotifier speaks sd_notify over NOTIFY_SOCKET and reads the watchdog from WATCHDOG_USEC.
#include "daemon/service/notifier.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tutti::service {
namespace {

class NotifierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = absl::StrCat("/tmp/notifier_test_", getpid());
    fd_ = socket(AF_UNIX, SOCK_DGRAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    unlink(path_.c_str());
    ASSERT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
    timeval tv{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    close(fd_);
    unlink(path_.c_str());
  }
  std::string Receive() {
    char buf[512];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, n) : "";
  }

  std::string path_;
  int fd_ = -1;
};

TEST_F(NotifierTest, SendsEachStateAsOneDatagram) {
  auto n = SystemdNotifier();
  n->Status("opening the pool\nand recovering");
  n->Ready();
  n->PetWatchdog();
  n->Reloading();
  n->Stopping();
  EXPECT_EQ(Receive(), "STATUS=opening the pool and recovering");
  EXPECT_EQ(Receive(), "READY=1");
  EXPECT_EQ(Receive(), "WATCHDOG=1");
  EXPECT_EQ(Receive(), "RELOADING=1");
  EXPECT_EQ(Receive(), "STOPPING=1");
  EXPECT_STREQ(getenv("NOTIFY_SOCKET"), path_.c_str()) << "the environment is left as it was";
}

TEST_F(NotifierTest, WithoutNotifySocketSendsNothingAndGoesOn) {
  unsetenv("NOTIFY_SOCKET");
  auto n = SystemdNotifier();
  n->Ready();
  setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  n->Status("after");
  EXPECT_EQ(Receive(), "STATUS=after") << "READY=1 was not sent";
}

TEST_F(NotifierTest, WatchdogIntervalComesFromTheEnvironment) {
  auto n = SystemdNotifier();
  EXPECT_EQ(n->WatchdogInterval(), absl::ZeroDuration());
  setenv("WATCHDOG_USEC", "400000", 1);
  EXPECT_EQ(n->WatchdogInterval(), absl::Milliseconds(400));
  setenv("WATCHDOG_PID", absl::StrCat(getpid()).c_str(), 1);
  EXPECT_EQ(n->WatchdogInterval(), absl::Milliseconds(400));
  setenv("WATCHDOG_PID", absl::StrCat(getpid() + 1).c_str(), 1);
  EXPECT_EQ(n->WatchdogInterval(), absl::ZeroDuration()) << "another process's watchdog";
}

}  // namespace
}  // namespace tutti::service

#include "daemon/server/server.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::server {
namespace {

// A socket path under a fresh directory in /tmp (sun_path is short), removed with the object.
class TempSocket {
 public:
  TempSocket() {
    // Not getpid(): tests in Bazel's sandbox share /tmp and may share a pid.
    std::string t = "/tmp/tutti_srv_test_XXXXXX";
    EXPECT_NE(mkdtemp(t.data()), nullptr);
    root_ = t;
    path_ = root_ + "/d/tuttid.sock";  // Start must create "d"
  }
  ~TempSocket() { std::filesystem::remove_all(root_); }
  const std::string& path() const { return path_; }

 private:
  std::string root_, path_;
};

// Leaves a socket file nobody listens on, as a crashed daemon would.
void MakeStaleSocket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
  close(fd);
}

TEST(ServerTest, CreatesDirectorySetsModeAndRemovesSocketAtExit) {
  TempSocket socket;
  const std::string& path = socket.path();
  {
    auto server = Server::Start({path, {0640, ""}}, {});
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ((*server)->target(), "unix:" + path);
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0640u);
    EXPECT_EQ(ProbeSocket(path, SOCK_STREAM), SocketState::kAnswering);
  }
  EXPECT_EQ(ProbeSocket(path, SOCK_STREAM), SocketState::kAbsent);
}

TEST(ServerTest, RefusesWhenAnotherServerAnswers) {
  TempSocket socket;
  const std::string& path = socket.path();
  auto first = Server::Start({path, {0660, ""}}, {});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Server::Start({path, {0660, ""}}, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr("answering"));
  EXPECT_EQ(ProbeSocket(path, SOCK_STREAM), SocketState::kAnswering);  // the first one is untouched
}

TEST(ServerTest, ReplacesAStaleSocket) {
  TempSocket socket;
  const std::string& path = socket.path();
  auto first = Server::Start({path, {0660, ""}}, {});  // creates the directory
  ASSERT_TRUE(first.ok()) << first.status();
  first->reset();
  MakeStaleSocket(path);
  EXPECT_EQ(ProbeSocket(path, SOCK_STREAM), SocketState::kStale);
  auto server = Server::Start({path, {0660, ""}}, {});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(ProbeSocket(path, SOCK_STREAM), SocketState::kAnswering);
}

TEST(ServerTest, RefusesToRemoveANonSocket) {
  TempSocket socket;
  const std::string& path = socket.path();
  auto first = Server::Start({path, {0660, ""}}, {});
  ASSERT_TRUE(first.ok()) << first.status();
  first->reset();
  const int fd = open(path.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  auto server = Server::Start({path, {0660, ""}}, {});
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(server.status().message()), ::testing::HasSubstr("not a socket"));
  unlink(path.c_str());
}

TEST(ServerTest, UnknownGroupOnlyWarns) {
  TempSocket socket;
  const std::string& path = socket.path();
  auto server = Server::Start({path, {0660, "no-such-group-tutti"}}, {});
  ASSERT_TRUE(server.ok()) << server.status();
}

TEST(ServerTest, RejectsRelativeOrLongPaths) {
  EXPECT_EQ(Server::Start({"relative.sock", {0660, ""}}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Server::Start({"/" + std::string(120, 'a'), 0660, ""}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti::server

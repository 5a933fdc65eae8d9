#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "daemon/common/handoff.h"
#include "daemon/server/credentials.h"
#include "daemon/server/handoff_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::server {
namespace {

using ::testing::HasSubstr;

class HandoffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tutti_handoff_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/tuttid.sock";
    auto server = HandoffServer::Start(HandoffPath(socket_), {0600, ""}, &table_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A raw exchange, for malformed requests: returns the reply.
  std::string Exchange(const std::string& payload) {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = HandoffPath(socket_);
    std::memcpy(addr.sun_path, path.data(), path.size());
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
    EXPECT_EQ(send(fd, payload.data(), payload.size(), 0), static_cast<ssize_t>(payload.size()));
    char reply[512];
    const ssize_t n = recv(fd, reply, sizeof(reply), 0);
    close(fd);
    return n > 0 ? std::string(reply, n) : std::string();
  }

  ManualClock clock_{1000};
  CredentialTable table_{{/*ttl_ms=*/1000, /*max_outstanding=*/8, /*max_per_uid=*/4}, &clock_};
  std::string dir_, socket_;
  std::unique_ptr<HandoffServer> server_;
};

TEST_F(HandoffTest, TheDaemonGetsTheEnginesDescriptorsAndIdentity) {
  const int memfd = memfd_create("engine-kv", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(ftruncate(memfd, 4096), 0);
  ASSERT_EQ(pwrite(memfd, "kv!", 3, 0), 3);
  const int fds[] = {memfd};
  absl::StatusOr<std::string> token = HandOff(socket_, fds);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->size(), kCredentialBytes);
  EXPECT_EQ(table_.outstanding(), 1u);

  absl::StatusOr<Credential> c = table_.Redeem(*token);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->peer.pid, getpid());
  EXPECT_EQ(c->peer.uid, getuid());
  EXPECT_EQ(c->peer.gid, getgid());
  ASSERT_EQ(c->fds.size(), 1u);
  char buf[3];
  ASSERT_EQ(pread(c->fds[0].get(), buf, 3, 0), 3);  // the same memory, through the daemon's fd
  EXPECT_EQ(std::string(buf, 3), "kv!");
  EXPECT_EQ(table_.Redeem(*token).status().code(), absl::StatusCode::kPermissionDenied);
  close(memfd);
}

TEST_F(HandoffTest, CredentialsExpireAndAreBoundedPerUser) {
  std::vector<std::string> tokens;
  for (int i = 0; i < 4; ++i) {
    auto t = HandOff(socket_, {});
    ASSERT_TRUE(t.ok()) << t.status();
    tokens.push_back(*t);
  }
  absl::StatusOr<std::string> fifth = HandOff(socket_, {});
  EXPECT_EQ(fifth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(fifth.status().message()), HasSubstr("per user"));
  clock_.AdvanceMs(1001);
  EXPECT_EQ(table_.Redeem(tokens[0]).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(table_.outstanding(), 0u);
  EXPECT_TRUE(HandOff(socket_, {}).ok());  // room again
}

TEST_F(HandoffTest, MalformedRequestsAreRefusedAndTheServerGoesOn) {
  EXPECT_EQ(Exchange("hello").substr(0, 2), "ER");
  std::string wrong_count("TUTTIHO1\x02\0\0\0", 12);  // announces 2 descriptors, carries none
  const std::string reply = Exchange(wrong_count);
  EXPECT_EQ(reply.substr(0, 2), "ER");
  EXPECT_THAT(reply, HasSubstr("announced 2 descriptors and carried 0"));
  std::string too_many("TUTTIHO1\xff\0\0\0", 12);
  EXPECT_EQ(Exchange(too_many).substr(0, 2), "ER");
  // A peer that connects and sends nothing does not hold up the next one.
  const int idle = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = HandoffPath(socket_);
  std::memcpy(addr.sun_path, path.data(), path.size());
  ASSERT_EQ(connect(idle, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  absl::StatusOr<std::string> t = HandOff(socket_, {}, absl::Milliseconds(500));
  EXPECT_TRUE(t.ok()) << t.status();
  close(idle);
  EXPECT_EQ(table_.outstanding(), 1u);
}

TEST_F(HandoffTest, TheSocketHasTheConfiguredModeAndNoDaemonMeansUnavailable) {
  struct stat st;
  ASSERT_EQ(stat(HandoffPath(socket_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  server_.reset();
  EXPECT_NE(stat(HandoffPath(socket_).c_str(), &st), 0);  // removed at stop
  absl::StatusOr<std::string> t = HandOff(socket_, {});
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("tuttid.sock.handoff"));
}

}  // namespace
}  // namespace tutti::server

#include "common/handoff.h"

#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
    Restart({0600, ""}, {});
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Restart(const SocketAccess& access, const HandoffLimits& limits) {
    server_.reset();
    auto server = HandoffServer::Start(HandoffPath(socket_), access, &table_, limits);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  // A connection to the handoff socket that sends nothing (-1 if connect failed).
  int Connect() {
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = HandoffPath(socket_);
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ADD_FAILURE() << "connect: " << strerror(errno);
      close(fd);
      return -1;
    }
    return fd;
  }

  // What the daemon sent on `fd` ("" when it closed without a word), waiting up to 10 s.
  static std::string Await(int fd) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return "(nothing in 10 s)";
    char reply[512];
    const ssize_t n = recv(fd, reply, sizeof(reply), MSG_DONTWAIT);
    return n > 0 ? std::string(reply, n) : std::string();
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
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("is tuttid running?"));
}

// Runs `party` in a child that takes on `uid` (root only); returns what it reported ("" when all
// its checks held).
std::string RunAsUid(uid_t uid, const std::function<std::string()>& party) {
  int out[2];
  if (pipe(out) != 0) return "pipe failed";
  const pid_t pid = fork();
  if (pid == 0) {
    close(out[0]);
    std::string r = setresgid(uid, uid, uid) == 0 && setresuid(uid, uid, uid) == 0
                        ? party()
                        : std::string("cannot become uid ") + std::to_string(uid);
    (void)!write(out[1], r.data(), r.size());
    _exit(0);
  }
  close(out[1]);
  std::string r;
  char buf[512];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;) r.append(buf, n);
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return r;
}

TEST_F(HandoffTest, IdleConnectionsPastTheUsersLimitAreToldWhyAndTimeOut) {
  Restart({0600, ""}, {/*per_user=*/4, /*total=*/8, absl::Milliseconds(300)});
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(Connect());
  absl::StatusOr<std::string> refused = HandOff(socket_, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(absl::StrCat("tuttid refused the handoff: user ", getuid(),
                                     " has 4 handoff connections open "
                                     "(limits.max_handoff_connections_per_user)")));
  // The idle ones are answered at their deadline and closed; their places are free again.
  for (int fd : idle) {
    EXPECT_THAT(Await(fd), HasSubstr("no handoff request within 300ms"));
    close(fd);
  }
  EXPECT_TRUE(HandOff(socket_, {}).ok());
}

// The attack: 200 idle connections of one user (the per-user limit's default is 16).
// The daemon accepts them all at once (none waits in the backlog) and tells the ones past the
// limit why; so is the user's next handoff, instead of a connect that fails with EAGAIN.
TEST_F(HandoffTest, OneUsersIdleConnectionsAreAcceptedAndThosePastTheLimitToldWhy) {
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(Connect());
  int told = 0;
  for (size_t i = 16; i < idle.size(); ++i) {
    told += Await(idle[i]).find(absl::StrCat("user ", getuid(),
                                             " has 16 handoff connections "
                                             "open (limits.max_handoff_connections_per_user)")) !=
            std::string::npos;
  }
  EXPECT_EQ(told, 184);
  absl::StatusOr<std::string> refused = HandOff(socket_, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("limits.max_handoff_connections_per_user"));
  for (int fd : idle) close(fd);
}

TEST_F(HandoffTest, PastTheTotalEveryoneIsToldSo) {
  Restart({0600, ""}, {/*per_user=*/16, /*total=*/4, absl::Seconds(60)});
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(Connect());
  absl::StatusOr<std::string> refused = HandOff(socket_, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("tuttid has 4 handoff connections open (limits.max_handoff_connections)"));
  for (int fd : idle) close(fd);
}

// With one user's connections at its limit, another user (a real other uid: root only, and not in
// a sandbox that maps no other uids; tests/integration/multi_user_test.cc runs it with real users
// too) still gets a credential.
TEST_F(HandoffTest, AnotherUserStillGetsACredential) {
  if (geteuid() != 0 || RunAsUid(64105, [] { return std::string(); }) != "") {
    GTEST_SKIP() << "cannot take on another uid here";
  }
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  Restart({0666, ""}, {/*per_user=*/16, /*total=*/256, absl::Seconds(60)});
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(Connect());
  EXPECT_EQ(HandOff(socket_, {}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RunAsUid(64105,
                     [&] {
                       absl::StatusOr<std::string> t = HandOff(socket_, {});
                       return t.ok() ? std::string() : t.status().ToString();
                     }),
            "");
  EXPECT_EQ(table_.outstanding(), 1u);
  for (int fd : idle) close(fd);
}

}  // namespace
}  // namespace tutti::server

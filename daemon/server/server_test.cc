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
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "tutti/v1/kvcache.grpc.pb.h"
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


// KeepAlive holds its thread until released: a stand-in for calls that run long (Retrieve).
class HoldingService final : public tutti::v1::KvCache::Service {
 public:
  grpc::Status KeepAlive(grpc::ServerContext*, const tutti::v1::KeepAliveRequest*,
                         tutti::v1::KeepAliveResponse*) override {
    {
      absl::MutexLock lock(&mu_);
      ++entered_;
    }
    release_.WaitForNotification();
    return grpc::Status::OK;
  }
  int entered() {
    absl::MutexLock lock(&mu_);
    return entered_;
  }
  void Release() { release_.Notify(); }

 private:
  absl::Mutex mu_;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification release_;
};

int ThreadsOfThisProcess() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.exists();
  return n;
}

// Issue 9: 1,000 open Retrieves made 999 daemon threads. With max_threads, gRPC's resource quota
// bounds the threads: calls past it are answered RESOURCE_EXHAUSTED instead of each getting one.
TEST(ServerTest, MaxThreadsBoundsTheThreadsOfCallsInFlight) {
  TempSocket socket;
  HoldingService service;
  constexpr int kCalls = 48;
  constexpr uint32_t kMaxThreads = 8;
  const int before = ThreadsOfThisProcess();
  auto server = Server::Start({socket.path(), {0600, ""}, kMaxThreads}, {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = tutti::v1::KvCache::NewStub(
      grpc::CreateChannel((*server)->target(), grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext ctx;
    tutti::v1::KeepAliveResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<tutti::v1::KeepAliveResponse>> reader;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kCalls; ++i) {
    auto c = std::make_unique<Call>();
    c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    c->reader = stub->AsyncKeepAlive(&c->ctx, tutti::v1::KeepAliveRequest(), &cq);
    c->reader->Finish(&c->resp, &c->status, c.get());
    calls.push_back(std::move(c));
  }
  // Let the server take in what it will.
  absl::SleepFor(absl::Seconds(2));
  const int held = service.entered();
  const int threads = ThreadsOfThisProcess() - before;
  service.Release();
  int exhausted = 0, ok = 0;
  for (int i = 0; i < kCalls; ++i) {
    void* tag = nullptr;
    bool got = false;
    ASSERT_TRUE(cq.Next(&tag, &got));
    const grpc::Status& s = static_cast<Call*>(tag)->status;
    ok += s.ok();
    exhausted += s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  EXPECT_LT(held, kCalls) << "every call got a thread";
  EXPECT_LE(held, static_cast<int>(kMaxThreads));
  EXPECT_LT(threads, kCalls / 2) << "threads grew with the calls";
  EXPECT_EQ(ok + exhausted, kCalls) << "the others were refused, not failed otherwise";
  EXPECT_GT(exhausted, 0);
  cq.Shutdown();
  (*server)->Shutdown(absl::ZeroDuration());
}

}  // namespace
}  // namespace tutti::server

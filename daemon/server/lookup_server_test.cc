// The lookup socket (lookup_server.h) in front of tuttid's own service: answers equal
// KvCache.Lookup's, the session's token and user are checked, bad frames are answered and
// survived, connections are bounded and a slow one holds nobody else.
#include "daemon/server/lookup_server.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/lookup_wire.h"
#include "daemon/server/kvcache_service.h"
#include "daemon/server/service_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::server::testing {
namespace {

using ::testing::HasSubstr;

struct Answer {
  int code = -1;  // -1: no answer (the connection ended)
  std::string body;
};

// A blocking client connection; reads with a 5 s timeout so that a broken server fails the test.
class Conn {
 public:
  explicit Conn(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ADD_FAILURE() << "connect: " << strerror(errno);
    }
    timeval tv{5, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    hello_ = Read();
  }
  ~Conn() { close(fd_); }
  const Answer& hello() const { return hello_; }
  void Send(const std::string& bytes) {
    ASSERT_EQ(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  Answer Call(const std::string& body, uint32_t kind = kLookupKind) {
    std::string frame(kLookupHeaderBytes, '\0');
    PutLookupU32(frame.data(), body.size());
    PutLookupU32(frame.data() + 4, kind);
    Send(frame + body);
    return Read();
  }
  Answer Read() {
    Answer a;
    char header[kLookupHeaderBytes];
    if (!ReadFull(header, sizeof(header))) return a;
    a.body.resize(GetLookupU32(header));
    if (!ReadFull(a.body.data(), a.body.size())) return a;
    a.code = static_cast<int>(GetLookupU32(header + 4));
    return a;
  }
  // True when the server has closed the connection (EOF within 5 s).
  bool Closed() {
    char c;
    return recv(fd_, &c, 1, 0) == 0;
  }

 private:
  bool ReadFull(char* p, size_t n) {
    while (n > 0) {
      const ssize_t got = recv(fd_, p, n, 0);
      if (got <= 0) return false;
      p += got;
      n -= got;
    }
    return true;
  }
  int fd_ = -1;
  Answer hello_;
};

class LookupServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    session_ = env_.Attach(engine_);
    ASSERT_NE(session_, 0u);
    engine_.Fill(0, 1000);
    engine_.Fill(1, 1001);
    tutti::v1::StoreRequest store;
    env_.Name(session_, &store);
    for (uint32_t b = 0; b < 2; ++b) {
      auto* p = store.add_blocks();
      p->set_key(KeyBytes(1000 + b));
      p->set_engine_block(b);
    }
    store.set_wait_durable(true);
    grpc::ClientContext ctx;
    tutti::v1::StoreResponse stored;
    ASSERT_TRUE(env_.kv().Store(&ctx, store, &stored).ok());
    Restart({});
  }

  void Restart(const LookupLimits& limits) {
    server_.reset();
    LookupLimits l = limits;
    l.max_request_bytes = MaxLookupRequest(16);  // the env's max_blocks_per_call
    auto server = LookupServer::Start(
        path(), {0660, ""},
        [kv = &env_.kv_service()](uint32_t uid, const tutti::v1::LookupRequest& req,
                                  tutti::v1::LookupResponse* resp) {
          return kv->LookupAs(uid, req, resp);
        },
        l);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  std::string path() const { return LookupSocketPath(env_.socket_path()); }

  tutti::v1::LookupRequest Request(std::vector<uint64_t> keys) const {
    tutti::v1::LookupRequest req;
    env_.Name(session_, &req);
    for (uint64_t k : keys) req.add_keys(KeyBytes(k));
    req.set_prompt_tokens(64);
    return req;
  }

  grpc::Status GrpcLookup(const tutti::v1::LookupRequest& req, tutti::v1::LookupResponse* resp) {
    grpc::ClientContext ctx;
    return env_.kv().Lookup(&ctx, req, resp);
  }

  // Waits up to 5 s for the server to count `n` open connections.
  bool WaitForOpen(uint32_t n) {
    for (int i = 0; i < 500 && server_->open_connections() != n; ++i) usleep(10'000);
    return server_->open_connections() == n;
  }

  ServiceEnv env_;
  ShmEngine engine_;
  uint64_t session_ = 0;
  std::unique_ptr<LookupServer> server_;
};

TEST_F(LookupServerTest, SocketFileTakesTheEngineSocketsMode) {
  struct stat st {};
  ASSERT_EQ(stat(path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  server_.reset();
  EXPECT_NE(stat(path().c_str(), &st), 0);  // removed at stop
}

TEST_F(LookupServerTest, AnswersAsTheGrpcLookup) {
  Conn c(path());
  ASSERT_EQ(c.hello().code, 0);
  EXPECT_EQ(c.hello().body, "");
  const tutti::v1::LookupRequest req = Request({1000, 1001, 1002});
  tutti::v1::LookupResponse by_grpc;
  ASSERT_TRUE(GrpcLookup(req, &by_grpc).ok());
  const Answer a = c.Call(req.SerializeAsString());
  ASSERT_EQ(a.code, 0) << a.body;
  tutti::v1::LookupResponse by_socket;
  ASSERT_TRUE(by_socket.ParseFromString(a.body));
  EXPECT_EQ(by_socket.hits(), 2u);
  // Everything but the lease (each Lookup takes its own) is the same.
  EXPECT_NE(by_socket.lease_id(), 0u);
  EXPECT_NE(by_socket.lease_id(), by_grpc.lease_id());
  by_grpc.set_lease_id(by_socket.lease_id());
  EXPECT_EQ(by_socket.SerializeAsString(), by_grpc.SerializeAsString());
  // The socket's lease is a lease of the session like any other.
  tutti::v1::ReleaseRequest rel;
  env_.Name(session_, &rel);
  rel.set_lease_id(by_socket.lease_id());
  grpc::ClientContext ctx;
  tutti::v1::ReleaseResponse released;
  EXPECT_TRUE(env_.kv().Release(&ctx, rel, &released).ok());
  // A miss: no lease, the same answer.
  const Answer miss = c.Call(Request({7}).SerializeAsString());
  ASSERT_EQ(miss.code, 0);
  tutti::v1::LookupResponse none;
  ASSERT_TRUE(none.ParseFromString(miss.body));
  EXPECT_EQ(none.hits(), 0u);
  EXPECT_EQ(none.lease_id(), 0u);
}

TEST_F(LookupServerTest, RefusesAsTheGrpcLookup) {
  Conn c(path());
  // A wrong token, too many keys, a malformed key: the gRPC answer's code and words.
  tutti::v1::LookupRequest wrong = Request({1000});
  wrong.set_session_token("not the token....");
  tutti::v1::LookupRequest many = Request({});
  for (uint64_t k = 0; k < 17; ++k) many.add_keys(KeyBytes(k));
  tutti::v1::LookupRequest malformed = Request({});
  malformed.add_keys("short");
  for (const auto& req : {wrong, many, malformed}) {
    tutti::v1::LookupResponse r;
    const grpc::Status g = GrpcLookup(req, &r);
    ASSERT_FALSE(g.ok());
    const Answer a = c.Call(req.SerializeAsString());
    EXPECT_EQ(a.code, static_cast<int>(g.error_code()));
    EXPECT_EQ(a.body, g.error_message());
  }
  EXPECT_EQ(c.Call(wrong.SerializeAsString()).body,
            absl::StrCat("session ", session_, " is unknown or expired"));
}

TEST_F(LookupServerTest, SessionOfAnotherUserIsUnknown) {
  // Tests run as one user: the check is the service's, called as the server calls it.
  const tutti::v1::LookupRequest req = Request({1000});
  tutti::v1::LookupResponse resp;
  const absl::Status other = env_.kv_service().LookupAs(getuid() + 1, req, &resp);
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other.message(), absl::StrCat("session ", session_, " is unknown or expired"));
  EXPECT_EQ(resp.lease_id(), 0u);
  EXPECT_TRUE(env_.kv_service().LookupAs(getuid(), req, &resp).ok());
  EXPECT_EQ(resp.hits(), 1u);
}

TEST_F(LookupServerTest, GarbageIsAnsweredAndTheConnectionServesOn) {
  Conn c(path());
  const Answer kind = c.Call("whatever", 7);
  EXPECT_EQ(kind.code, static_cast<int>(absl::StatusCode::kUnimplemented));
  EXPECT_THAT(kind.body, HasSubstr("kind 7"));
  const Answer junk = c.Call(std::string("\xff\xff\xff\xff\x0f\x01", 6));
  EXPECT_EQ(junk.code, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(junk.body, HasSubstr("not a serialized tutti.v1.LookupRequest"));
  const Answer empty = c.Call("");  // an empty LookupRequest: session 0
  EXPECT_EQ(empty.code, static_cast<int>(absl::StatusCode::kNotFound));
  const Answer good = c.Call(Request({1000}).SerializeAsString());
  EXPECT_EQ(good.code, 0) << good.body;
}

TEST_F(LookupServerTest, OversizeRequestIsRefusedAndClosed) {
  Conn c(path());
  std::string header(kLookupHeaderBytes, '\0');
  PutLookupU32(header.data(), 1u << 30);
  PutLookupU32(header.data() + 4, kLookupKind);
  c.Send(header);
  const Answer a = c.Read();
  EXPECT_EQ(a.code, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(a.body, HasSubstr("1073741824 bytes is longer than the lookup socket's limit of " +
                                std::to_string(MaxLookupRequest(16))));
  EXPECT_TRUE(c.Closed());
  Conn next(path());  // the server is fine
  EXPECT_EQ(next.Call(Request({1000}).SerializeAsString()).code, 0);
}

TEST_F(LookupServerTest, ConnectionsAreBoundedPerUserAndInAll) {
  LookupLimits limits;
  limits.max_connections_per_user = 2;
  limits.max_connections = 2;
  Restart(limits);
  auto a = std::make_unique<Conn>(path());
  Conn b(path());
  ASSERT_EQ(a->hello().code, 0);
  ASSERT_EQ(b.hello().code, 0);
  Conn refused(path());
  EXPECT_EQ(refused.hello().code, static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused.hello().body, HasSubstr("lookup connections open (limits.max_lookup_"));
  EXPECT_TRUE(refused.Closed());
  // One leaves: its place is free again.
  a.reset();
  ASSERT_TRUE(WaitForOpen(1));
  Conn c(path());
  EXPECT_EQ(c.hello().code, 0);
  EXPECT_EQ(c.Call(Request({1000}).SerializeAsString()).code, 0);
  limits.max_connections = 8;
  Restart(limits);
  Conn d(path()), e(path());
  Conn f(path());
  EXPECT_THAT(f.hello().body, HasSubstr("limits.max_lookup_connections_per_user"));
}

TEST_F(LookupServerTest, SlowClientHoldsOnlyItself) {
  LookupLimits limits;
  limits.io_timeout = absl::Milliseconds(200);
  Restart(limits);
  Conn slow(path());
  slow.Send(std::string("\x10\x00", 2));  // half a header, then nothing
  Conn idle(path());                       // connected, sends nothing: may stay
  Conn quick(path());
  const absl::Time start = absl::Now();
  EXPECT_EQ(quick.Call(Request({1000}).SerializeAsString()).code, 0);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_TRUE(slow.Closed());  // dropped after io_timeout
  EXPECT_TRUE(WaitForOpen(2));
  EXPECT_EQ(idle.Call(Request({1001}).SerializeAsString()).code, 0);
}

TEST_F(LookupServerTest, StopsWithConnectionsOpen) {
  Conn a(path()), b(path());
  ASSERT_EQ(a.Call(Request({1000}).SerializeAsString()).code, 0);
  server_.reset();  // returns: every connection's thread ended
  EXPECT_TRUE(a.Closed());
  EXPECT_TRUE(b.Closed());
}

}  // namespace
}  // namespace tutti::server::testing

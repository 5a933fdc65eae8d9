// Every kind of bad request gets the right gRPC code and a message, and the daemon goes on
// serving good requests, from the same session and from another one.
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"
#include "tutti/v1/kvcache.grpc.pb.h"

namespace tutti::testing {
namespace {

namespace v1 = tutti::v1;
using grpc::StatusCode;

constexpr uint32_t kMaxPerCall = 32;
constexpr uint32_t kEngineBlocks = 40;
constexpr uint64_t kNoSuchId = 987654321;

class BadInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    TuttidConfig config;
    config.object_bytes = 4096;
    config.max_objects = 8;
    config.max_blocks_per_call = kMaxPerCall;
    auto env = TuttidEnv::Create(config);
    ASSERT_TRUE(env.ok()) << env.status();
    env_ = env->release();
    auto daemon = TuttidProcess::Start(*env_);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = daemon->release();
    auto a = AttachEngine(*daemon_, SmallShape(), kEngineBlocks);
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = new EngineSession(std::move(*a));
    hostengine::EngineIdentity other;
    other.engine_id = "bystander";
    auto b = AttachEngine(*daemon_, SmallShape(), 8, other);
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = new EngineSession(std::move(*b));
    stored_ = hostengine::MakeKeyChain(1, 4);
    ASSERT_TRUE(hostengine::StoreKeys(*a_->client, *a_->engine, stored_, {}).status.ok());
  }
  static void TearDownTestSuite() {
    delete a_;
    delete b_;
    if (daemon_ != nullptr) {
      auto code = daemon_->Stop();
      EXPECT_TRUE(code.ok() && *code == 0) << daemon_->LogTail();
    }
    delete daemon_;
    delete env_;
  }
  void TearDown() override { ExpectStillServes(); }

  std::unique_ptr<grpc::ClientContext> Ctx() { return a_->client->NewContext(); }
  v1::KvCache::Stub& stub() { return a_->client->stub(); }
  uint64_t session() { return a_->client->session_id(); }

  // The call failed with `code` and said something about why.
  static void ExpectCode(const grpc::Status& s, StatusCode code, const std::string& what) {
    EXPECT_EQ(s.error_code(), code)
        << what << ": got " << s.error_code() << " \"" << s.error_message() << "\"";
    EXPECT_FALSE(s.error_message().empty()) << what << ": no message";
  }

  // A fresh block stores, hits, retrieves and verifies, for both sessions.
  void ExpectStillServes() {
    static uint64_t seed = 1000;
    for (EngineSession* s : {a_, b_}) {
      const auto keys = hostengine::MakeKeyChain(++seed, 2);
      const auto st = hostengine::StoreKeys(*s->client, *s->engine, keys, {});
      ASSERT_TRUE(st.status.ok()) << st.status << "\n" << daemon_->LogTail();
      EXPECT_EQ(st.durable, 2u);
      const auto rt = hostengine::RetrieveKeys(*s->client, *s->engine, keys, {});
      ASSERT_TRUE(rt.status.ok()) << rt.status;
      EXPECT_EQ(rt.hits, 2u) << "the daemon stopped serving after a bad request";
    }
    EXPECT_TRUE(daemon_->running());
  }

  // A valid request with a fresh credential for engine a's memory.
  v1::AttachRequest GoodAttach() const {
    v1::AttachRequest req = a_->engine->MakeAttachRequest(hostengine::EngineIdentity());
    absl::StatusOr<std::string> credential = a_->client->HandOff(a_->engine->fds());
    EXPECT_TRUE(credential.ok()) << credential.status();
    if (credential.ok()) req.set_credential(*credential);
    return req;
  }
  grpc::Status Attach(const v1::AttachRequest& req) {
    v1::AttachResponse resp;
    auto ctx = Ctx();
    grpc::Status s = stub().Attach(ctx.get(), req, &resp);
    if (s.ok()) {  // should not happen; do not leak the session
      v1::DetachRequest d;
      d.set_session_id(resp.session_id());
      d.set_session_token(resp.session_token());
      v1::DetachResponse dr;
      auto ctx2 = Ctx();
      stub().Detach(ctx2.get(), d, &dr);
    }
    return s;
  }
  // Names `session_id` (without a token: another engine's or no session), or 0: a's own session.
  template <class Request>
  static void NameSession(uint64_t session_id, Request* req) {
    if (session_id != 0) {
      req->set_session_id(session_id);
    } else {
      a_->client->Name(req);
    }
  }
  grpc::Status Lookup(const std::vector<std::string>& keys, uint64_t session_id = 0) {
    v1::LookupRequest req;
    NameSession(session_id, &req);
    for (const auto& k : keys) req.add_keys(k);
    v1::LookupResponse resp;
    auto ctx = Ctx();
    return stub().Lookup(ctx.get(), req, &resp);
  }
  grpc::Status Store(const std::vector<std::pair<std::string, uint32_t>>& pairs,
                     uint32_t layer_begin = 0, uint32_t layer_end = 0, uint64_t session_id = 0) {
    v1::StoreRequest req;
    NameSession(session_id, &req);
    for (const auto& [k, b] : pairs) {
      auto* p = req.add_blocks();
      p->set_key(k);
      p->set_engine_block(b);
    }
    req.set_layer_begin(layer_begin);
    req.set_layer_end(layer_end);
    req.set_wait_durable(true);
    v1::StoreResponse resp;
    auto ctx = Ctx();
    return stub().Store(ctx.get(), req, &resp);
  }
  grpc::Status Retrieve(uint64_t lease, const std::vector<std::pair<std::string, uint32_t>>& pairs,
                        uint32_t layer_begin = 0, uint32_t layer_end = 0, uint64_t session_id = 0) {
    v1::RetrieveRequest req;
    NameSession(session_id, &req);
    req.set_lease_id(lease);
    for (const auto& [k, b] : pairs) {
      auto* p = req.add_blocks();
      p->set_key(k);
      p->set_engine_block(b);
    }
    req.set_layer_begin(layer_begin);
    req.set_layer_end(layer_end);
    auto ctx = Ctx();
    auto reader = stub().Retrieve(ctx.get(), req);
    v1::RetrieveProgress progress;
    while (reader->Read(&progress)) {
    }
    return reader->Finish();
  }
  // A lease over the stored keys (the caller must end it).
  uint64_t PinStored() {
    auto lookup = a_->client->Lookup(stored_);
    EXPECT_TRUE(lookup.ok());
    EXPECT_EQ(lookup->hits(), stored_.size());
    return lookup->lease_id();
  }
  static std::string K(const Key& k) { return std::string(k.view()); }
  static std::string Fresh(int i) { return K(hostengine::MakeKeyChain(77 + i, 1)[0]); }

  static TuttidEnv* env_;
  static TuttidProcess* daemon_;
  static EngineSession* a_;
  static EngineSession* b_;
  static std::vector<Key> stored_;
};

TuttidEnv* BadInputTest::env_ = nullptr;
TuttidProcess* BadInputTest::daemon_ = nullptr;
EngineSession* BadInputTest::a_ = nullptr;
EngineSession* BadInputTest::b_ = nullptr;
std::vector<Key> BadInputTest::stored_;

TEST_F(BadInputTest, UnknownSession) {
  ExpectCode(Lookup({K(stored_[0])}, kNoSuchId), StatusCode::NOT_FOUND, "Lookup");
  ExpectCode(Store({{Fresh(0), 0}}, 0, 0, kNoSuchId), StatusCode::NOT_FOUND, "Store");
  ExpectCode(Retrieve(1, {{K(stored_[0]), 0}}, 0, 0, kNoSuchId), StatusCode::NOT_FOUND, "Retrieve");
  v1::KeepAliveRequest ka;
  ka.set_session_id(kNoSuchId);
  v1::KeepAliveResponse kar;
  auto ctx = Ctx();
  ExpectCode(stub().KeepAlive(ctx.get(), ka, &kar), StatusCode::NOT_FOUND, "KeepAlive");
  v1::DetachRequest d;
  d.set_session_id(kNoSuchId);
  v1::DetachResponse dr;
  auto ctx2 = Ctx();
  ExpectCode(stub().Detach(ctx2.get(), d, &dr), StatusCode::NOT_FOUND, "Detach");
  // Engine b naming engine a's live session (its id, b's own token) is answered as an unknown
  // session, with the same words, and a's session is untouched.
  v1::DetachRequest steal;
  steal.set_session_id(session());
  steal.set_session_token(b_->client->session_token());
  auto ctx3 = Ctx();
  const grpc::Status stolen = stub().Detach(ctx3.get(), steal, &dr);
  ExpectCode(stolen, StatusCode::NOT_FOUND, "Detach of another engine's session");
  EXPECT_EQ(stolen.error_message(), absl::StrCat("session ", session(), " is unknown or expired"));
  EXPECT_TRUE(a_->client->Lookup(stored_).ok()) << "a's session was detached by b";
}

TEST_F(BadInputTest, UnknownLease) {
  ExpectCode(Retrieve(kNoSuchId, {{K(stored_[0]), 0}}), StatusCode::NOT_FOUND, "Retrieve");
  EXPECT_EQ(a_->client->Release(kNoSuchId).code(), absl::StatusCode::kNotFound);
  // Another session's lease is unknown to this one.
  auto lookup = b_->client->Lookup(stored_);
  ASSERT_TRUE(lookup.ok());
  ASSERT_EQ(lookup->hits(), stored_.size());
  ExpectCode(Retrieve(lookup->lease_id(), {{K(stored_[0]), 0}}), StatusCode::NOT_FOUND,
             "Retrieve under another session's lease");
  EXPECT_TRUE(b_->client->Release(lookup->lease_id()).ok());
}

TEST_F(BadInputTest, KeyNotPinnedByTheLease) {
  const uint64_t lease = PinStored();
  ExpectCode(Retrieve(lease, {{Fresh(1), 0}}), StatusCode::FAILED_PRECONDITION,
             "Retrieve of a key the lease does not pin");
  (void)a_->client->Release(lease);
}

TEST_F(BadInputTest, LayoutDoesNotFitOrIsMalformed) {
  v1::AttachRequest req = GoodAttach();
  req.mutable_namespace_()->mutable_layout()->set_head_dim(0);
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "zero head_dim");
  req = GoodAttach();
  req.mutable_namespace_()->mutable_layout()->set_format(v1::KV_FORMAT_UNSPECIFIED);
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "no format");
  req = GoodAttach();  // 8 KiB objects in a pool of 4 KiB objects
  req.mutable_namespace_()->mutable_layout()->set_head_dim(128);
  ExpectCode(Attach(req), StatusCode::FAILED_PRECONDITION, "objects larger than the pool's");
  req = GoodAttach();  // 10 objects per block in a pool of 8
  req.mutable_namespace_()->mutable_layout()->set_num_layers(5);
  ExpectCode(Attach(req), StatusCode::FAILED_PRECONDITION, "more objects than the pool's");
  req = GoodAttach();
  req.mutable_placements()->RemoveLast();
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "one placement short");
  req = GoodAttach();  // the last object of the last block would end past the region
  req.mutable_regions(0)->mutable_host_shm()->set_size_bytes(a_->engine->region().size() - 1);
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "region smaller than the placements");
  req = GoodAttach();
  req.set_num_blocks(kEngineBlocks + 1);
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "more blocks than the region holds");
  req = GoodAttach();
  req.set_num_blocks(0);
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "zero blocks");
  req = GoodAttach();
  req.clear_namespace_();
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "no namespace");
  req = GoodAttach();
  req.mutable_namespace_()->set_tp_rank(1);
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "tp_rank >= tp_size");
}

TEST_F(BadInputTest, MalformedMemoryNamesAndCredentials) {
  for (const std::string& name :
       {"/" + std::string(250, 'x'), std::string("/nul\0in", 7), std::string("/new\nline")}) {
    v1::AttachRequest req = GoodAttach();
    req.mutable_regions(0)->mutable_host_shm()->set_name(name);
    ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "shm name '" + name + "'");
  }
  v1::AttachRequest req = GoodAttach();
  req.clear_credential();  // memory named, not handed over: v1 before the handoff
  ExpectCode(Attach(req), StatusCode::PERMISSION_DENIED, "no credential");
  req = GoodAttach();
  req.mutable_regions(0)->mutable_host_shm()->set_fd_index(3);
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "an fd_index past the handoff");
  req = GoodAttach();  // claims more bytes than the object has
  req.mutable_regions(0)->mutable_host_shm()->set_size_bytes(a_->engine->region().size() * 2);
  req.set_num_blocks(kEngineBlocks);
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "size beyond the object");
  req = GoodAttach();
  req.mutable_regions(0)->mutable_cuda_ipc()->set_ipc_handle(std::string(64, '\0'));
  ExpectCode(Attach(req), StatusCode::FAILED_PRECONDITION, "cuda_ipc on a host-mode daemon");
  req = GoodAttach();
  req.clear_regions();
  ExpectCode(Attach(req), StatusCode::INVALID_ARGUMENT, "no regions");
}

TEST_F(BadInputTest, EngineBlockOutOfRange) {
  ExpectCode(Store({{Fresh(2), kEngineBlocks}}), StatusCode::INVALID_ARGUMENT, "Store");
  ExpectCode(Store({{Fresh(2), 0xffffffffu}}), StatusCode::INVALID_ARGUMENT, "Store max");
  const uint64_t lease = PinStored();
  ExpectCode(Retrieve(lease, {{K(stored_[0]), kEngineBlocks}}), StatusCode::INVALID_ARGUMENT,
             "Retrieve");
  (void)a_->client->Release(lease);
}

TEST_F(BadInputTest, LayerOutOfRange) {
  ExpectCode(Store({{Fresh(3), 0}}, 4, 0), StatusCode::INVALID_ARGUMENT, "Store begin = layers");
  ExpectCode(Store({{Fresh(3), 0}}, 0, 5), StatusCode::INVALID_ARGUMENT, "Store end > layers");
  ExpectCode(Store({{Fresh(3), 0}}, 2, 2), StatusCode::INVALID_ARGUMENT, "Store empty range");
  const uint64_t lease = PinStored();
  ExpectCode(Retrieve(lease, {{K(stored_[0]), 0}}, 3, 2), StatusCode::INVALID_ARGUMENT,
             "Retrieve begin > end");
  ExpectCode(Retrieve(lease, {{K(stored_[0]), 0}}, 0, 9), StatusCode::INVALID_ARGUMENT,
             "Retrieve end > layers");
  (void)a_->client->Release(lease);
}

TEST_F(BadInputTest, TooManyBlocksInOneCall) {
  std::vector<std::string> keys;
  std::vector<std::pair<std::string, uint32_t>> pairs;
  for (const Key& k : hostengine::MakeKeyChain(55, kMaxPerCall + 1)) {
    keys.push_back(K(k));
    pairs.emplace_back(K(k), pairs.size());
  }
  ExpectCode(Lookup(keys), StatusCode::INVALID_ARGUMENT, "Lookup");
  ExpectCode(Store(pairs), StatusCode::INVALID_ARGUMENT, "Store");
  ExpectCode(Retrieve(1, pairs), StatusCode::INVALID_ARGUMENT, "Retrieve");
  keys.pop_back();
  EXPECT_TRUE(Lookup(keys).ok()) << "exactly the limit is allowed";
}

TEST_F(BadInputTest, DuplicateKeysOrBlocks) {
  const std::string k = Fresh(4), k2 = Fresh(5);
  ExpectCode(Lookup({k, k2, k}), StatusCode::INVALID_ARGUMENT, "Lookup duplicate key");
  ExpectCode(Store({{k, 0}, {k, 1}}), StatusCode::INVALID_ARGUMENT, "Store duplicate key");
  ExpectCode(Store({{k, 0}, {k2, 0}}), StatusCode::INVALID_ARGUMENT, "Store duplicate block");
  const uint64_t lease = PinStored();
  ExpectCode(Retrieve(lease, {{K(stored_[0]), 0}, {K(stored_[0]), 1}}),
             StatusCode::INVALID_ARGUMENT, "Retrieve duplicate key");
  ExpectCode(Retrieve(lease, {{K(stored_[0]), 0}, {K(stored_[1]), 0}}),
             StatusCode::INVALID_ARGUMENT, "Retrieve duplicate block");
  (void)a_->client->Release(lease);
}

TEST_F(BadInputTest, KeysOfTheWrongLength) {
  for (size_t len : {0, 1, 15, 17, 32}) {
    const std::string bad(len, 'k');
    ExpectCode(Lookup({bad}), StatusCode::INVALID_ARGUMENT, absl::StrCat("Lookup len ", len));
    ExpectCode(Lookup({K(stored_[0]), bad}), StatusCode::INVALID_ARGUMENT,
               absl::StrCat("Lookup second key len ", len));
    ExpectCode(Store({{bad, 0}}), StatusCode::INVALID_ARGUMENT, absl::StrCat("Store len ", len));
  }
  const uint64_t lease = PinStored();
  ExpectCode(Retrieve(lease, {{std::string(15, 'k'), 0}}), StatusCode::INVALID_ARGUMENT,
             "Retrieve 15-byte key");
  (void)a_->client->Release(lease);
}

TEST_F(BadInputTest, EmptyCalls) {
  ExpectCode(Store({}), StatusCode::INVALID_ARGUMENT, "Store of nothing");
  EXPECT_TRUE(Lookup({}).ok()) << "an empty chain is a lookup of nothing";
}

TEST_F(BadInputTest, AdminEvictGuards) {
  auto s = AdminEvict(*daemon_, 0, false);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(s.status().message().empty());
  EXPECT_EQ(AdminEvict(*daemon_, kNoSuchId, false).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tutti::testing

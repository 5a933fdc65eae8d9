// Issue 19, item 1: a session belongs to the engine that attached it. Session ids count 1, 2, 3;
// before the token a caller that guessed one read the victim's events, stored and retrieved through
// its memory, claimed its lease, reported compute in its name and detached it. Every call of the
// engine API that names a session now needs the session's token, and a missing or wrong token is
// answered exactly as an unknown session: same code, same words.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/server/service_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::server::testing {
namespace {

// Calls one RPC naming session `id` with `token`; returns its status (a stream's final status).
using Call = std::function<grpc::Status(uint64_t id, const std::string& token)>;

class SessionTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    victim_ = env_.Attach(victim_engine_);
    intruder_ = env_.Attach(intruder_engine_);  // the same uid: tokens, not uids, decide
    ASSERT_NE(victim_, 0u);
    ASSERT_NE(intruder_, 0u);
    for (uint32_t b = 0; b < 2; ++b) victim_engine_.Fill(b, 1000 + b);
    tutti::v1::StoreRequest store;
    env_.Name(victim_, &store);
    AddBlock(&store, 1000, 0);
    AddBlock(&store, 1001, 1);
    store.set_wait_durable(true);
    grpc::ClientContext ctx;
    tutti::v1::StoreResponse stored;
    ASSERT_TRUE(env_.kv().Store(&ctx, store, &stored).ok());
    tutti::v1::LookupRequest lookup;
    env_.Name(victim_, &lookup);
    lookup.add_keys(KeyBytes(1000));
    lookup.add_keys(KeyBytes(1001));
    grpc::ClientContext lctx;
    tutti::v1::LookupResponse found;
    ASSERT_TRUE(env_.kv().Lookup(&lctx, lookup, &found).ok());
    ASSERT_EQ(found.hits(), 2u);
    lease_ = found.lease_id();
    intruder_engine_.Fill(0, 666);
  }

  template <class Request>
  static void AddBlock(Request* req, uint64_t key, uint32_t block) {
    auto* p = req->add_blocks();
    p->set_key(KeyBytes(key));
    p->set_engine_block(block);
  }
  template <class Request>
  static Request Named(uint64_t id, const std::string& token) {
    Request req;
    req.set_session_id(id);
    req.set_session_token(token);
    return req;
  }

  // Every RPC of the engine API that names a session, each doing what an intruder would.
  std::vector<std::pair<std::string, Call>> Calls() {
    auto& kv = env_.kv();
    const uint64_t lease = lease_;
    return {
        {"KeepAlive",
         [&kv](uint64_t id, const std::string& t) {
           grpc::ClientContext ctx;
           tutti::v1::KeepAliveResponse r;
           return kv.KeepAlive(&ctx, Named<tutti::v1::KeepAliveRequest>(id, t), &r);
         }},
        {"Lookup",
         [&kv](uint64_t id, const std::string& t) {
           auto req = Named<tutti::v1::LookupRequest>(id, t);
           req.add_keys(KeyBytes(1000));
           grpc::ClientContext ctx;
           tutti::v1::LookupResponse r;
           return kv.Lookup(&ctx, req, &r);
         }},
        {"Store",
         [&kv](uint64_t id, const std::string& t) {
           auto req = Named<tutti::v1::StoreRequest>(id, t);
           AddBlock(&req, 4242, 0);  // the victim's block 0, which the victim never stored
           grpc::ClientContext ctx;
           tutti::v1::StoreResponse r;
           return kv.Store(&ctx, req, &r);
         }},
        {"Retrieve",
         [&kv, lease](uint64_t id, const std::string& t) {
           auto req = Named<tutti::v1::RetrieveRequest>(id, t);
           req.set_lease_id(lease);
           AddBlock(&req, 1000, 1);  // over the victim's block 1
           grpc::ClientContext ctx;
           auto reader = kv.Retrieve(&ctx, req);
           tutti::v1::RetrieveProgress p;
           while (reader->Read(&p)) {
           }
           return reader->Finish();
         }},
        {"Release",
         [&kv, lease](uint64_t id, const std::string& t) {
           auto req = Named<tutti::v1::ReleaseRequest>(id, t);
           req.set_lease_id(lease);
           grpc::ClientContext ctx;
           tutti::v1::ReleaseResponse r;
           return kv.Release(&ctx, req, &r);
         }},
        {"ReportCompute",
         [&kv](uint64_t id, const std::string& t) {
           auto req = Named<tutti::v1::ReportComputeRequest>(id, t);
           auto* s = req.add_samples();
           s->set_new_tokens(16);
           s->set_context_tokens(16);
           s->set_layer_ms(1);
           grpc::ClientContext ctx;
           tutti::v1::ReportComputeResponse r;
           return kv.ReportCompute(&ctx, req, &r);
         }},
        {"WatchEvents",
         [&kv](uint64_t id, const std::string& t) {
           grpc::ClientContext ctx;
           auto reader = kv.WatchEvents(&ctx, Named<tutti::v1::WatchEventsRequest>(id, t));
           tutti::v1::WatchEventsResponse m;
           if (reader->Read(&m)) {
             ctx.TryCancel();  // it was let in: the first message came
             while (reader->Read(&m)) {
             }
             return grpc::Status(grpc::StatusCode::OK, "let in");
           }
           return reader->Finish();
         }},
        {"Detach",
         [&kv](uint64_t id, const std::string& t) {
           grpc::ClientContext ctx;
           tutti::v1::DetachResponse r;
           return kv.Detach(&ctx, Named<tutti::v1::DetachRequest>(id, t), &r);
         }},
    };
  }

  ServiceEnv env_;
  ShmEngine victim_engine_, intruder_engine_;
  uint64_t victim_ = 0, intruder_ = 0, lease_ = 0;
};

TEST_F(SessionTokenTest, AnyTokenButTheSessionsOwnIsAnsweredAsAnUnknownSession) {
  const std::string token = env_.Token(victim_);
  ASSERT_EQ(token.size(), 16u);
  std::string flipped = token;
  flipped[0] ^= 0x80;
  const std::vector<std::pair<std::string, std::string>> wrong = {
      {"no token", ""},
      {"another session's token", env_.Token(intruder_)},
      {"one bit off", flipped},
      {"a prefix", token.substr(0, 8)},
  };
  // The reference: an id no session has, with a token of a live session.
  const uint64_t unknown = victim_ + intruder_ + 100;
  for (auto& [rpc, call] : Calls()) {
    const grpc::Status reference = call(unknown, env_.Token(intruder_));
    ASSERT_EQ(reference.error_code(), grpc::StatusCode::NOT_FOUND) << rpc;
    EXPECT_EQ(reference.error_message(),
              absl::StrCat("session ", unknown, " is unknown or expired"))
        << rpc;
    for (const auto& [what, bad] : wrong) {
      const grpc::Status s = call(victim_, bad);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << rpc << " with " << what;
      EXPECT_EQ(s.error_message(), absl::StrCat("session ", victim_, " is unknown or expired"))
          << rpc << " with " << what;
    }
  }
  // Nothing the intruder tried took effect: the victim is attached, its lease holds, its block 1
  // is as it was, block 0 was not stored under key 4242, and the victim's own calls work.
  EXPECT_EQ(env_.sessions().num_sessions(), 2u);
  EXPECT_TRUE(victim_engine_.Check(1, 1001));
  for (auto& [rpc, call] : Calls()) {
    if (rpc == "Release" || rpc == "Detach" || rpc == "Store") continue;
    EXPECT_TRUE(call(victim_, token).ok()) << rpc << " of the victim itself";
  }
  EXPECT_TRUE(victim_engine_.Check(1, 1000)) << "the victim's own Retrieve under its lease";
  tutti::v1::LookupRequest lookup;
  env_.Name(victim_, &lookup);
  lookup.add_keys(KeyBytes(4242));
  grpc::ClientContext ctx;
  tutti::v1::LookupResponse r;
  ASSERT_TRUE(env_.kv().Lookup(&ctx, lookup, &r).ok());
  EXPECT_EQ(r.hits(), 0u) << "a Store with a wrong token stored the victim's block";
  const auto detach = Calls().back().second;
  EXPECT_TRUE(detach(victim_, token).ok());
  EXPECT_EQ(env_.sessions().num_sessions(), 1u);
}

}  // namespace
}  // namespace tutti::server::testing

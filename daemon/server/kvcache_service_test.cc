// The engine API end to end over a unix socket: the real BlockStore ("memory" backend), real
// host-shm engine memory, and every validation error with its code and message.
#include "daemon/server/kvcache_service.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/server/service_test_env.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace tutti::server::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using tutti::v1::RetrieveProgress;

struct Pair {
  uint64_t key;
  uint32_t block;
};

template <typename Request>
void AddPairs(const std::vector<Pair>& pairs, Request* req) {
  for (const Pair& p : pairs) {
    auto* bp = req->add_blocks();
    bp->set_key(KeyBytes(p.key));
    bp->set_engine_block(p.block);
  }
}

class KvCacheServiceTest : public ::testing::Test {
 protected:
  grpc::Status Store(uint64_t session, std::vector<Pair> pairs, tutti::v1::StoreResponse* resp,
                     bool wait_durable = true, uint32_t lb = 0, uint32_t le = 0) {
    tutti::v1::StoreRequest req;
    env_.Name(session, &req);
    AddPairs(pairs, &req);
    req.set_layer_begin(lb);
    req.set_layer_end(le);
    req.set_wait_durable(wait_durable);
    grpc::ClientContext ctx;
    return env_.kv().Store(&ctx, req, resp);
  }

  grpc::Status Lookup(uint64_t session, std::vector<std::string> keys,
                      tutti::v1::LookupResponse* resp) {
    tutti::v1::LookupRequest req;
    env_.Name(session, &req);
    for (auto& k : keys) req.add_keys(k);
    grpc::ClientContext ctx;
    return env_.kv().Lookup(&ctx, req, resp);
  }

  grpc::Status Retrieve(uint64_t session, uint64_t lease, std::vector<Pair> pairs,
                        std::vector<RetrieveProgress>* progress, uint32_t lb = 0, uint32_t le = 0) {
    tutti::v1::RetrieveRequest req;
    env_.Name(session, &req);
    req.set_lease_id(lease);
    AddPairs(pairs, &req);
    req.set_layer_begin(lb);
    req.set_layer_end(le);
    grpc::ClientContext ctx;
    auto reader = env_.kv().Retrieve(&ctx, req);
    RetrieveProgress p;
    while (reader->Read(&p)) progress->push_back(p);
    return reader->Finish();
  }

  // Stores blocks 0..n-1 of `engine` under keys base..base+n-1, durably.
  void StoreBlocks(uint64_t session, ShmEngine& engine, uint64_t base, uint32_t n) {
    std::vector<Pair> pairs;
    for (uint32_t i = 0; i < n; ++i) {
      engine.Fill(i, base + i);
      pairs.push_back({base + i, i});
    }
    tutti::v1::StoreResponse resp;
    grpc::Status s = Store(session, pairs, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    for (int o : resp.outcomes()) EXPECT_EQ(o, tutti::v1::STORE_DURABLE);
  }

  uint64_t LookupLease(uint64_t session, std::vector<uint64_t> keys, uint32_t want_hits) {
    std::vector<std::string> raw;
    for (uint64_t k : keys) raw.push_back(KeyBytes(k));
    tutti::v1::LookupResponse resp;
    grpc::Status s = Lookup(session, raw, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.hits(), want_hits);
    return resp.lease_id();
  }

  // A request that must still work after a bad one.
  void ExpectStillServing(uint64_t session) {
    tutti::v1::LookupResponse resp;
    grpc::Status s = Lookup(session, {KeyBytes(987654)}, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.hits(), 0u);
  }

  static void ExpectError(const grpc::Status& s, grpc::StatusCode code, const std::string& part) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(part));
  }

  ServiceEnv env_;
};

TEST_F(KvCacheServiceTest, StoreLookupRetrieveRoundTrip) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  ASSERT_NE(session, 0u);
  StoreBlocks(session, engine, 100, 4);

  // The chain 100..103 is present; 200 is not; hits stop at the first miss.
  const uint64_t lease = LookupLease(session, {100, 101, 102, 103, 200, 104}, 4);
  ASSERT_NE(lease, 0u);
  for (uint32_t b = 4; b < 8; ++b) engine.Zero(b);
  std::vector<RetrieveProgress> progress;
  grpc::Status s = Retrieve(session, lease, {{102, 4}, {100, 5}, {103, 6}, {101, 7}}, &progress);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(progress.size(), kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(progress[l].layer(), l);
    EXPECT_EQ(progress[l].failed_size(), 0);
  }
  EXPECT_TRUE(engine.Check(4, 102));
  EXPECT_TRUE(engine.Check(5, 100));
  EXPECT_TRUE(engine.Check(6, 103));
  EXPECT_TRUE(engine.Check(7, 101));

  // The lease ended with the Retrieve.
  grpc::ClientContext ctx;
  tutti::v1::ReleaseRequest rel;
  env_.Name(session, &rel);
  rel.set_lease_id(lease);
  tutti::v1::ReleaseResponse rr;
  ExpectError(env_.kv().Release(&ctx, rel, &rr), grpc::StatusCode::NOT_FOUND, "lease");
  EXPECT_EQ(env_.sessions().List()[0].pinned_blocks, 0u);
}

TEST_F(KvCacheServiceTest, RetrieveOfALayerRangeCopiesOnlyThoseLayers) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreBlocks(session, engine, 300, 1);
  const uint64_t lease = LookupLease(session, {300}, 1);
  engine.Zero(3);
  std::vector<RetrieveProgress> progress;
  ASSERT_TRUE(Retrieve(session, lease, {{300, 3}}, &progress, 1, 2).ok());
  ASSERT_EQ(progress.size(), 1u);
  EXPECT_EQ(progress[0].layer(), 1u);
  EXPECT_TRUE(engine.Check(3, 300, 1, 2));
  EXPECT_FALSE(engine.Check(3, 300, 0, 1));  // layer 0 untouched (zeros)
}

TEST_F(KvCacheServiceTest, StoreOutcomesAlreadyPresentAndLayerwiseCapture) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreBlocks(session, engine, 400, 1);
  tutti::v1::StoreResponse again;
  ASSERT_TRUE(Store(session, {{400, 0}}, &again).ok());
  EXPECT_THAT(again.outcomes(), ElementsAre(tutti::v1::STORE_ALREADY_PRESENT));

  // Layer 0 alone captures but does not complete the block; layer 1 completes it.
  engine.Fill(1, 77);
  tutti::v1::StoreResponse first, second;
  ASSERT_TRUE(Store(session, {{500, 1}}, &first, false, 0, 1).ok());
  EXPECT_THAT(first.outcomes(), ElementsAre(tutti::v1::STORE_CAPTURED));
  LookupLease(session, {500}, 0);
  ASSERT_TRUE(Store(session, {{500, 1}}, &second, true, 1, 2).ok());
  EXPECT_THAT(second.outcomes(), ElementsAre(tutti::v1::STORE_DURABLE));
  const uint64_t lease = LookupLease(session, {500}, 1);
  engine.Zero(2);
  std::vector<RetrieveProgress> progress;
  ASSERT_TRUE(Retrieve(session, lease, {{500, 2}}, &progress).ok());
  EXPECT_TRUE(engine.Check(2, 77));
}

TEST_F(KvCacheServiceTest, AttachErrors) {
  ShmEngine engine;
  auto attach = [this](const tutti::v1::AttachRequest& req) {
    grpc::ClientContext ctx;
    tutti::v1::AttachResponse resp;
    return env_.kv().Attach(&ctx, req, &resp);
  };
  auto req = env_.AttachRequest(engine);
  req.mutable_regions(0)->mutable_cuda_ipc()->set_ipc_handle(std::string(64, 'h'));
  ExpectError(attach(req), grpc::StatusCode::FAILED_PRECONDITION,
              "cuda_ipc needs a GPU build/daemon in cuda mode");

  req = env_.AttachRequest(engine);
  req.mutable_regions(0)->mutable_host_shm()->set_name("/tutti\n[info] forged");
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT,
              "regions[0].host_shm.name: control character");
  req = env_.AttachRequest(engine);
  req.mutable_regions(0)->mutable_host_shm()->set_fd_index(1);
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "fd_index = 1");

  req = env_.AttachRequest(engine);
  req.mutable_regions(0)->mutable_host_shm()->set_size_bytes(kEngineBlocks * kBlockBytes + 1);
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "exceeds the object's size");

  req = env_.AttachRequest(engine);
  req.set_num_blocks(kEngineBlocks + 1);  // the last block runs past the region
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "placements[");
  req = env_.AttachRequest(engine);
  req.mutable_placements()->RemoveLast();
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "placements: 3 given");
  req = env_.AttachRequest(engine);
  req.mutable_placements(2)->set_region(1);
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "placements[2].region");
  req = env_.AttachRequest(engine);
  req.clear_regions();
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "regions");

  req = env_.AttachRequest(engine);
  req.clear_namespace_();
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "namespace");
  req = env_.AttachRequest(engine);
  req.mutable_namespace_()->mutable_layout()->set_format(tutti::v1::KV_FORMAT_UNSPECIFIED);
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "format");
  req = env_.AttachRequest(engine);
  req.mutable_namespace_()->mutable_layout()->set_head_dim(4096);  // 256 KiB objects > 4 KiB
  ExpectError(attach(req), grpc::StatusCode::FAILED_PRECONDITION, "pool");
  req = env_.AttachRequest(engine);
  req.set_num_blocks(0);
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "num_blocks");

  EXPECT_EQ(env_.sessions().num_sessions(), 0u);
  EXPECT_EQ(env_.credentials().outstanding(), 0u);  // every refused Attach used its credential up
  // Fill every session slot; the next is RESOURCE_EXHAUSTED; the others keep working.
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(env_.Attach(engine));
  ExpectError(attach(env_.AttachRequest(engine)), grpc::StatusCode::RESOURCE_EXHAUSTED,
              "max_sessions");
  ExpectStillServing(ids[0]);
}

// Memory is reached only through descriptors the engine handed over: a request naming shm
// objects (as v1 before the handoff allowed) is refused, as is a credential used twice.
TEST_F(KvCacheServiceTest, AttachNeedsAFreshCredential) {
  ShmEngine engine;
  auto attach = [this](const tutti::v1::AttachRequest& req) {
    grpc::ClientContext ctx;
    tutti::v1::AttachResponse resp;
    return env_.kv().Attach(&ctx, req, &resp);
  };
  ExpectError(attach(engine.AttachRequest()), grpc::StatusCode::PERMISSION_DENIED,
              "credential: missing");
  tutti::v1::AttachRequest req = env_.AttachRequest(engine);
  ASSERT_TRUE(attach(req).ok());
  ExpectError(attach(req), grpc::StatusCode::PERMISSION_DENIED, "already used or expired");
  req.set_credential(std::string(16, 'x'));
  ExpectError(attach(req), grpc::StatusCode::PERMISSION_DENIED, "unknown");
}

// Client text is checked before anything is kept: no forged log lines, no namespace journaled for
// an Attach that fails, and no namespace flood.
TEST_F(KvCacheServiceTest, AttachChecksTextAndJournalsNothingItRefuses) {
  ShmEngine engine;
  auto attach = [this](const tutti::v1::AttachRequest& req) {
    grpc::ClientContext ctx;
    tutti::v1::AttachResponse resp;
    return env_.kv().Attach(&ctx, req, &resp);
  };
  auto req = env_.AttachRequest(engine, "engine\n2026-12-01 [info] forged line");
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "engine_id: control character");
  req = env_.AttachRequest(engine);
  req.mutable_namespace_()->set_model_id(std::string(3 << 20, 'm'));
  ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "namespace.model_id:");
  const size_t before = env_.store().Stats().namespaces.size();
  for (int i = 0; i < 5; ++i) {
    req = env_.AttachRequest(engine);
    req.mutable_namespace_()->set_model_id(absl::StrCat("fresh-model-", i));
    req.mutable_regions(0)->mutable_host_shm()->set_size_bytes(kEngineBlocks * kBlockBytes + 1);
    ExpectError(attach(req), grpc::StatusCode::INVALID_ARGUMENT, "exceeds the object's size");
  }
  EXPECT_EQ(env_.store().Stats().namespaces.size(), before);
}

TEST(KvCacheLimitsTest, NamespacesAreBounded) {
  EnvOptions options;
  options.max_namespaces = 2;
  ServiceEnv env(options);
  ShmEngine engine;
  for (int i = 0; i < 3; ++i) {
    auto req = env.AttachRequest(engine);
    req.mutable_namespace_()->set_model_id(absl::StrCat("model-", i));
    grpc::ClientContext ctx;
    tutti::v1::AttachResponse resp;
    const grpc::Status s = env.kv().Attach(&ctx, req, &resp);
    if (i < 2) {
      EXPECT_TRUE(s.ok()) << s.error_message();
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_THAT(s.error_message(), HasSubstr("limits.max_namespaces"));
    }
  }
}

// Issue 9: 1,000 open Retrieves of one client made 999 daemon threads. A session has at most
// max_calls_per_session calls in flight (64 here); past them its calls are refused, naming the
// limit, and other sessions are not affected.
TEST(KvCacheBacklogTest, PastTheWriteBacklogStoreAnswersFullWithTheReason) {
  EnvOptions options;
  options.max_write_backlog_bytes = 1;  // one queued block is past it
  ServiceEnv env(options);
  ShmEngine engine;
  const uint64_t session = env.Attach(engine);
  env.backend().SetPaused(true);  // the writer's pool writes wait
  auto store = [&](uint64_t key, tutti::v1::StoreResponse* resp) {
    engine.Fill(0, key);
    tutti::v1::StoreRequest req;
    env.Name(session, &req);
    AddPairs({{key, 0}}, &req);
    grpc::ClientContext ctx;
    return env.kv().Store(&ctx, req, resp);
  };
  tutti::v1::StoreResponse first, second;
  ASSERT_TRUE(store(1, &first).ok());
  EXPECT_THAT(first.outcomes(), ElementsAre(tutti::v1::STORE_CAPTURED));
  ASSERT_TRUE(store(2, &second).ok());
  EXPECT_THAT(second.outcomes(), ElementsAre(tutti::v1::STORE_REJECTED_FULL));
  EXPECT_THAT(second.rejected_why(), HasSubstr("datapath.max_write_backlog_bytes"));
  grpc::ClientContext ctx;
  tutti::v1::StatsResponse stats;
  ASSERT_TRUE(env.admin().Stats(&ctx, {}, &stats).ok());
  EXPECT_EQ(stats.write_backlog_blocks(), 1u);
  EXPECT_GT(stats.write_backlog_bytes(), 0u);
  EXPECT_EQ(stats.store_rejected_backlog(), 1u);
  EXPECT_EQ(stats.store_rejected(), 1u);
  env.backend().SetPaused(false);
}

// Issue 23: with pool.admission "second_sight" a block's first Store is answered STORE_DECLINED
// (nothing kept: a Lookup misses), its second is written; Stats counts both; "all" (the default,
// every other test here) answers as before.
TEST(KvCacheAdmissionTest, SecondSightDeclinesTheFirstStoreAndTellsTheEngine) {
  EnvOptions options;
  options.admission = "second_sight";
  ServiceEnv env(options);
  ShmEngine engine;
  const uint64_t session = env.Attach(engine);
  ASSERT_NE(session, 0u);
  auto store = [&](tutti::v1::StoreResponse* resp) {
    tutti::v1::StoreRequest req;
    env.Name(session, &req);
    AddPairs({{1, 0}, {2, 1}}, &req);
    req.set_wait_durable(true);
    grpc::ClientContext ctx;
    return env.kv().Store(&ctx, req, resp);
  };
  auto hits = [&]() {
    tutti::v1::LookupRequest req;
    env.Name(session, &req);
    req.add_keys(KeyBytes(1));
    req.add_keys(KeyBytes(2));
    grpc::ClientContext ctx;
    tutti::v1::LookupResponse resp;
    EXPECT_TRUE(env.kv().Lookup(&ctx, req, &resp).ok());
    if (resp.lease_id() != 0) {
      tutti::v1::ReleaseRequest rel;
      env.Name(session, &rel);
      rel.set_lease_id(resp.lease_id());
      grpc::ClientContext rctx;
      tutti::v1::ReleaseResponse rresp;
      EXPECT_TRUE(env.kv().Release(&rctx, rel, &rresp).ok());
    }
    return resp.hits();
  };
  engine.Fill(0, 1);
  engine.Fill(1, 2);
  tutti::v1::StoreResponse first, second;
  ASSERT_TRUE(store(&first).ok());
  EXPECT_THAT(first.outcomes(), ElementsAre(tutti::v1::STORE_DECLINED, tutti::v1::STORE_DECLINED));
  EXPECT_EQ(first.rejected_why(), "");  // not a refusal
  EXPECT_EQ(hits(), 0u);
  ASSERT_TRUE(store(&second).ok());
  EXPECT_THAT(second.outcomes(), ElementsAre(tutti::v1::STORE_DURABLE, tutti::v1::STORE_DURABLE));
  EXPECT_EQ(hits(), 2u);
  grpc::ClientContext ctx;
  tutti::v1::StatsResponse stats;
  ASSERT_TRUE(env.admin().Stats(&ctx, {}, &stats).ok());
  EXPECT_EQ(stats.admission(), "second_sight");
  EXPECT_EQ(stats.blocks_declined(), 2u);
  EXPECT_EQ(stats.blocks_admitted(), 2u);
  EXPECT_EQ(stats.blocks_stored(), 2u);
  EXPECT_EQ(stats.store_rejected(), 0u);
}

// Issue 23: with pool.admission "dram_front" a block's first Store is answered STORE_IN_DRAM
// even with wait_durable (in DRAM only, not durable); a Lookup finds it, and that hit writes it
// to the pool; Stats counts the front.
TEST(KvCacheAdmissionTest, DramFrontKeepsTheFirstStoreInDramAndTellsTheEngine) {
  EnvOptions options;
  options.admission = "dram_front";
  options.dram_bytes = 8 * 8 * 4096;  // 8 blocks of the env's pool (8 objects of 4 KiB)
  ServiceEnv env(options);
  ShmEngine engine;
  const uint64_t session = env.Attach(engine);
  ASSERT_NE(session, 0u);
  engine.Fill(0, 1);
  engine.Fill(1, 2);
  tutti::v1::StoreRequest req;
  env.Name(session, &req);
  AddPairs({{1, 0}, {2, 1}}, &req);
  req.set_wait_durable(true);
  grpc::ClientContext ctx;
  tutti::v1::StoreResponse resp;
  ASSERT_TRUE(env.kv().Store(&ctx, req, &resp).ok());
  EXPECT_THAT(resp.outcomes(), ElementsAre(tutti::v1::STORE_IN_DRAM, tutti::v1::STORE_IN_DRAM));
  auto stats = [&]() {
    grpc::ClientContext sctx;
    tutti::v1::StatsResponse st;
    EXPECT_TRUE(env.admin().Stats(&sctx, {}, &st).ok());
    return st;
  };
  tutti::v1::StatsResponse st = stats();
  EXPECT_EQ(st.admission(), "dram_front");
  EXPECT_EQ(st.front_kept(), 2u);
  EXPECT_EQ(st.front_blocks(), 2u);
  EXPECT_EQ(st.blocks_stored(), 0u);
  tutti::v1::LookupRequest look;
  env.Name(session, &look);
  look.add_keys(KeyBytes(1));
  look.add_keys(KeyBytes(2));
  grpc::ClientContext lctx;
  tutti::v1::LookupResponse hit;
  ASSERT_TRUE(env.kv().Lookup(&lctx, look, &hit).ok());
  EXPECT_EQ(hit.hits(), 2u);
  tutti::v1::ReleaseRequest rel;
  env.Name(session, &rel);
  rel.set_lease_id(hit.lease_id());
  grpc::ClientContext rctx;
  tutti::v1::ReleaseResponse rresp;
  EXPECT_TRUE(env.kv().Release(&rctx, rel, &rresp).ok());
  env.store().Flush();
  st = stats();
  EXPECT_EQ(st.front_promoted(), 2u);
  EXPECT_EQ(st.blocks_stored(), 2u);
  EXPECT_EQ(st.front_blocks(), 0u);
}

TEST_F(KvCacheServiceTest, CallsInFlightPerSessionAreBounded) {
  ShmEngine engine;
  const uint64_t busy = env_.Attach(engine), other = env_.Attach(engine);
  auto state = env_.sessions().Touch(busy, env_.Token(busy));
  ASSERT_TRUE(state.ok());
  (*state)->calls.store(64);  // as if 64 calls of `busy` were running
  tutti::v1::LookupResponse resp;
  ExpectError(Lookup(busy, {KeyBytes(1)}, &resp), grpc::StatusCode::RESOURCE_EXHAUSTED,
              "limits.max_calls_per_session");
  tutti::v1::StoreResponse sresp;
  ExpectError(Store(busy, {{1, 0}}, &sresp), grpc::StatusCode::RESOURCE_EXHAUSTED,
              "limits.max_calls_per_session");
  ExpectStillServing(other);
  EXPECT_EQ((*state)->calls.load(), 64u) << "a refused call takes no slot";
  (*state)->calls.store(0);
  ExpectStillServing(busy);
  EXPECT_EQ((*state)->calls.load(), 0u) << "a finished call gives its slot back";
}

// Issue 9: bytes that do not decode as the method's message got INTERNAL with an empty message.
TEST_F(KvCacheServiceTest, UndecodableRequestsAreInvalidArgument) {
  grpc::GenericStub stub(env_.channel());
  grpc::CompletionQueue cq;
  const std::string truncated(
      "\x0a\x10"
      "ab",
      4);                                                 // engine_id: 16 bytes announced, 2 sent
  const std::string not_utf8("\x0a\x03\xff\xfe\xfd", 5);  // engine_id: not UTF-8
  for (const std::string& junk : {truncated, not_utf8}) {
    grpc::ClientContext ctx;
    grpc::Slice slice(junk);
    grpc::ByteBuffer request(&slice, 1), response;
    auto call = stub.PrepareUnaryCall(&ctx, "/tutti.v1.KvCache/Attach", request, &cq);
    call->StartCall();
    grpc::Status status;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    ExpectError(status, grpc::StatusCode::INVALID_ARGUMENT, "could not be decoded");
    EXPECT_THAT(status.error_message(), HasSubstr("/tutti.v1.KvCache/Attach"));
  }
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(KvCacheServiceTest, LookupErrors) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  tutti::v1::LookupResponse resp;
  ExpectError(Lookup(session + 1000, {KeyBytes(1)}, &resp), grpc::StatusCode::NOT_FOUND, "session");
  ExpectError(Lookup(session, {KeyBytes(1), "short"}, &resp), grpc::StatusCode::INVALID_ARGUMENT,
              "keys[1]: a key must be exactly 16 bytes");
  ExpectError(Lookup(session, {KeyBytes(1), KeyBytes(2), KeyBytes(1)}, &resp),
              grpc::StatusCode::INVALID_ARGUMENT, "keys[2]: duplicate of keys[0]");
  std::vector<std::string> many;
  for (int i = 0; i < 17; ++i) many.push_back(KeyBytes(i));
  ExpectError(Lookup(session, many, &resp), grpc::StatusCode::INVALID_ARGUMENT,
              "max_blocks_per_call");
  ExpectStillServing(session);
}

TEST_F(KvCacheServiceTest, RetrieveErrorsLeaveTheLeaseUsable) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  const uint64_t other = env_.Attach(engine);
  StoreBlocks(session, engine, 600, 3);
  const uint64_t lease = LookupLease(session, {600, 601}, 2);
  std::vector<RetrieveProgress> p;
  ExpectError(Retrieve(session + 1000, lease, {{600, 4}}, &p), grpc::StatusCode::NOT_FOUND,
              "session");
  ExpectError(Retrieve(session, lease + 1000, {{600, 4}}, &p), grpc::StatusCode::NOT_FOUND,
              "lease");
  ExpectError(Retrieve(other, lease, {{600, 4}}, &p), grpc::StatusCode::NOT_FOUND, "lease");
  ExpectError(Retrieve(session, lease, {{602, 4}}, &p), grpc::StatusCode::FAILED_PRECONDITION,
              "not pinned under lease");
  ExpectError(Retrieve(session, lease, {{600, kEngineBlocks}}, &p),
              grpc::StatusCode::INVALID_ARGUMENT, "engine_block = 8");
  ExpectError(Retrieve(session, lease, {{600, 4}, {601, 4}}, &p),
              grpc::StatusCode::INVALID_ARGUMENT, "blocks[1].engine_block = 4: duplicate");
  ExpectError(Retrieve(session, lease, {{600, 4}, {600, 5}}, &p),
              grpc::StatusCode::INVALID_ARGUMENT, "blocks[1].key: duplicate");
  ExpectError(Retrieve(session, lease, {{600, 4}}, &p, 1, 1), grpc::StatusCode::INVALID_ARGUMENT,
              "layer range");
  ExpectError(Retrieve(session, lease, {{600, 4}}, &p, 0, kLayers + 1),
              grpc::StatusCode::INVALID_ARGUMENT, "layer range");
  ExpectError(Retrieve(session, lease, {}, &p), grpc::StatusCode::INVALID_ARGUMENT, "at least one");
  EXPECT_TRUE(p.empty());
  // None of those touched the lease: a good Retrieve under it still works.
  engine.Zero(5);
  ASSERT_TRUE(Retrieve(session, lease, {{601, 5}}, &p).ok());
  EXPECT_TRUE(engine.Check(5, 601));
}

TEST_F(KvCacheServiceTest, StoreErrors) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  tutti::v1::StoreResponse resp;
  ExpectError(Store(session + 1000, {{1, 0}}, &resp), grpc::StatusCode::NOT_FOUND, "session");
  ExpectError(Store(session, {{1, 9}}, &resp), grpc::StatusCode::INVALID_ARGUMENT,
              "engine_block = 9");
  ExpectError(Store(session, {{1, 0}, {1, 1}}, &resp), grpc::StatusCode::INVALID_ARGUMENT,
              "duplicate");
  ExpectError(Store(session, {{1, 0}, {2, 0}}, &resp), grpc::StatusCode::INVALID_ARGUMENT,
              "duplicate");
  ExpectError(Store(session, {{1, 0}}, &resp, true, 2, 3), grpc::StatusCode::INVALID_ARGUMENT,
              "layer range");
  std::vector<Pair> many;
  for (uint32_t i = 0; i < 17; ++i) many.push_back({i, i % kEngineBlocks});
  ExpectError(Store(session, many, &resp), grpc::StatusCode::INVALID_ARGUMENT, "blocks");
  LookupLease(session, {1}, 0);  // nothing was stored
  ExpectStillServing(session);
}

TEST_F(KvCacheServiceTest, ReleaseKeepAliveDetach) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreBlocks(session, engine, 700, 2);
  const uint64_t lease = LookupLease(session, {700, 701}, 2);
  EXPECT_EQ(env_.sessions().List()[0].pinned_blocks, 2u);

  grpc::ClientContext c1;
  tutti::v1::ReleaseRequest rel;
  env_.Name(session, &rel);
  rel.set_lease_id(lease);
  tutti::v1::ReleaseResponse rr;
  ASSERT_TRUE(env_.kv().Release(&c1, rel, &rr).ok());
  EXPECT_EQ(env_.sessions().List()[0].pinned_blocks, 0u);
  grpc::ClientContext c2;
  ExpectError(env_.kv().Release(&c2, rel, &rr), grpc::StatusCode::NOT_FOUND, "lease");

  grpc::ClientContext c3;
  tutti::v1::KeepAliveRequest ka;
  env_.Name(session, &ka);
  tutti::v1::KeepAliveResponse kar;
  ASSERT_TRUE(env_.kv().KeepAlive(&c3, ka, &kar).ok());
  EXPECT_EQ(kar.session_ttl_ms(), 30000u);

  grpc::ClientContext c4;
  tutti::v1::DetachRequest det;
  env_.Name(session, &det);
  tutti::v1::DetachResponse dr;
  ASSERT_TRUE(env_.kv().Detach(&c4, det, &dr).ok());
  grpc::ClientContext c5;
  ExpectError(env_.kv().Detach(&c5, det, &dr), grpc::StatusCode::NOT_FOUND, "session");
  grpc::ClientContext c6;
  ExpectError(env_.kv().KeepAlive(&c6, ka, &kar), grpc::StatusCode::NOT_FOUND, "session");
}

TEST_F(KvCacheServiceTest, ExpiredSessionDropsItsPins) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreBlocks(session, engine, 800, 2);
  LookupLease(session, {800, 801}, 2);
  env_.clock().AdvanceMs(30001);
  env_.sessions().Reap();
  tutti::v1::LookupResponse resp;
  ExpectError(Lookup(session, {KeyBytes(800)}, &resp), grpc::StatusCode::NOT_FOUND, "expired");
  // The pins are gone: evicting everything evicts both blocks.
  grpc::ClientContext ctx;
  tutti::v1::EvictRequest ev;
  ev.set_all(true);
  tutti::v1::EvictResponse er;
  ASSERT_TRUE(env_.admin().Evict(&ctx, ev, &er).ok());
  EXPECT_EQ(er.evicted(), 2u);
  EXPECT_EQ(er.skipped_pinned(), 0u);
}

TEST_F(KvCacheServiceTest, DetachDuringRetrieveKeepsMemoryMappedAndCancels) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreBlocks(session, engine, 900, 2);
  const uint64_t lease = LookupLease(session, {900, 901}, 2);
  env_.backend().SetPaused(true);  // the Retrieve's first layer read waits
  std::vector<RetrieveProgress> progress;
  grpc::Status retrieve_status;
  std::thread t([&] {
    retrieve_status = Retrieve(session, lease, {{900, 4}, {901, 5}}, &progress);
  });
  for (int i = 0; i < 500 && env_.backend().queued_batches() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_GT(env_.backend().queued_batches(), 0u);
  grpc::ClientContext ctx;
  tutti::v1::DetachRequest det;
  env_.Name(session, &det);
  tutti::v1::DetachResponse dr;
  ASSERT_TRUE(env_.kv().Detach(&ctx, det, &dr).ok());
  env_.backend().SetPaused(false);
  t.join();
  ExpectError(retrieve_status, grpc::StatusCode::CANCELLED, "session was closed");
  EXPECT_TRUE(progress.empty());
  // The claimed lease was released when the Retrieve ended: nothing stays pinned.
  grpc::ClientContext ctx2;
  tutti::v1::EvictRequest ev;
  ev.set_all(true);
  tutti::v1::EvictResponse er;
  ASSERT_TRUE(env_.admin().Evict(&ctx2, ev, &er).ok());
  EXPECT_EQ(er.skipped_pinned(), 0u);
}

TEST_F(KvCacheServiceTest, ShutdownLetsARunningRetrieveFinishAndRefusesNewCalls) {
  ShmEngine engine;
  const uint64_t session = env_.Attach(engine);
  StoreBlocks(session, engine, 950, 1);
  const uint64_t lease = LookupLease(session, {950}, 1);
  engine.Zero(6);
  env_.backend().SetPaused(true);
  std::vector<RetrieveProgress> progress;
  grpc::Status retrieve_status;
  std::thread retrieve([&] { retrieve_status = Retrieve(session, lease, {{950, 6}}, &progress); });
  for (int i = 0; i < 500 && env_.backend().queued_batches() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  std::thread stop([&] { env_.server().Shutdown(absl::Seconds(20)); });
  // New calls are refused while the running one may still finish.
  grpc::Status refused;
  for (int i = 0; i < 500; ++i) {
    tutti::v1::LookupResponse resp;
    refused = Lookup(session, {KeyBytes(1)}, &resp);
    if (refused.error_code() == grpc::StatusCode::UNAVAILABLE) break;
    absl::SleepFor(absl::Milliseconds(2));
  }
  ExpectError(refused, grpc::StatusCode::UNAVAILABLE, "shutting down");
  env_.backend().SetPaused(false);
  retrieve.join();
  stop.join();
  EXPECT_TRUE(retrieve_status.ok()) << retrieve_status.error_message();
  EXPECT_EQ(progress.size(), kLayers);
  EXPECT_TRUE(engine.Check(6, 950));
}

TEST_F(KvCacheServiceTest, ConcurrentSessionsRoundTrip) {
  constexpr int kSessions = 4;
  std::vector<std::unique_ptr<ShmEngine>> engines;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int e = 0; e < kSessions; ++e) engines.push_back(std::make_unique<ShmEngine>());
  for (int e = 0; e < kSessions; ++e) {
    threads.emplace_back([&, e] {
      ShmEngine& engine = *engines[e];
      const uint64_t session = env_.Attach(engine);
      const uint64_t base = 10000 + e * 100;
      for (int round = 0; round < 5; ++round) {
        const uint64_t key = base + round;
        engine.Fill(0, key);
        tutti::v1::StoreResponse sr;
        const grpc::Status stored = Store(session, {{key, 0}}, &sr);
        if (!stored.ok()) {
          ADD_FAILURE() << "session " << e << " round " << round
                        << ": Store: " << stored.error_message();
          return;
        }
        const uint64_t lease = LookupLease(session, {key}, 1);
        engine.Zero(1);
        std::vector<RetrieveProgress> p;
        const grpc::Status retrieved = Retrieve(session, lease, {{key, 1}}, &p);
        if (!retrieved.ok()) {
          ADD_FAILURE() << "session " << e << " round " << round
                        << ": Retrieve: " << retrieved.error_message();
          return;
        }
        if (!engine.Check(1, key)) {
          ADD_FAILURE() << "session " << e << " round " << round << ": wrong bytes retrieved";
          return;
        }
      }
      ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kSessions);
}

}  // namespace
}  // namespace tutti::server::testing

// GPU-mode session rules in the engine API, without a GPU: an EngineIo that says it is device
// memory with ready words (engine::MakeFakeEngineIo, copying through host shared memory
// underneath) records every word the service writes. Checks that an admitted Retrieve writes each
// of its words exactly once whatever happens, that a refused one writes none, one Retrieve and one
// Store in flight per session, and the Store's captured word.
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"
#include "daemon/engine/fake_engine_io.h"
#include "daemon/server/kvcache_service.h"
#include "daemon/server/service_test_env.h"
#include "gtest/gtest.h"

namespace tutti::server::testing {
namespace {

using Signals = engine::FakeEngineLog::Signals;  // (word, ticket)

class GpuSessionTest : public ::testing::Test {
 protected:
  explicit GpuSessionTest(uint64_t dram_bytes = 0, uint64_t retrieve_staging_bytes = 4ull << 20)
      : env_(Options(&log_, dram_bytes, retrieve_staging_bytes)) {
    session_ = env_.Attach(engine_);
    for (uint32_t b = 0; b < 2; ++b) engine_.Fill(b, 500 + b);
    tutti::v1::StoreResponse resp;
    EXPECT_TRUE(Store(/*ticket=*/3, &resp).ok());
    EXPECT_EQ(log_.Take(), (Signals{{kLayers, 3}}));  // captured
  }

  static EnvOptions Options(engine::FakeEngineLog* log, uint64_t dram_bytes,
                            uint64_t retrieve_staging_bytes) {
    EnvOptions o;
    o.dram_bytes = dram_bytes;
    o.retrieve_staging_bytes = retrieve_staging_bytes;
    MemoryOpener host = HostMemoryOpener();
    o.opener = [host, log](
                   const tutti::v1::AttachRequest& req, const store::NamespaceInfo& ns,
                   Credential& credential) -> absl::StatusOr<std::unique_ptr<engine::EngineIo>> {
      ASSIGN_OR_RETURN(std::unique_ptr<engine::EngineIo> io, host(req, ns, credential));
      engine::FakeEngineOptions device;
      device.kind = "fake_cuda_ipc";
      device.is_device = true;
      device.has_ready_words = true;
      device.num_layers = kLayers;
      return engine::MakeFakeEngineIo(device, std::move(io), log);
    };
    return o;
  }

  grpc::Status Store(uint32_t ticket, tutti::v1::StoreResponse* resp) {
    tutti::v1::StoreRequest req;
    env_.Name(session_, &req);
    for (uint32_t b = 0; b < 2; ++b) {
      auto* p = req.add_blocks();
      p->set_key(KeyBytes(500 + b));
      p->set_engine_block(b);
    }
    req.set_wait_durable(true);
    req.set_ticket(ticket);
    grpc::ClientContext ctx;
    return env_.kv().Store(&ctx, req, resp);
  }

  uint64_t Lease() {
    tutti::v1::LookupRequest req;
    env_.Name(session_, &req);
    req.add_keys(KeyBytes(500));
    req.add_keys(KeyBytes(501));
    grpc::ClientContext ctx;
    tutti::v1::LookupResponse resp;
    EXPECT_TRUE(env_.kv().Lookup(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.hits(), 2u);
    return resp.lease_id();
  }

  grpc::Status Retrieve(uint64_t lease, uint32_t ticket, uint32_t layer_begin = 0,
                        uint32_t layer_end = 0, std::vector<uint32_t>* progress = nullptr) {
    tutti::v1::RetrieveRequest req;
    env_.Name(session_, &req);
    req.set_lease_id(lease);
    for (uint32_t b = 0; b < 2; ++b) {
      auto* p = req.add_blocks();
      p->set_key(KeyBytes(500 + b));
      p->set_engine_block(4 + b);
    }
    req.set_ticket(ticket);
    req.set_layer_begin(layer_begin);
    req.set_layer_end(layer_end);
    grpc::ClientContext ctx;
    auto reader = env_.kv().Retrieve(&ctx, req);
    tutti::v1::RetrieveProgress p;
    while (reader->Read(&p)) {
      if (progress != nullptr) progress->push_back(p.layer());
    }
    return reader->Finish();
  }

  engine::FakeEngineLog log_;
  ShmEngine engine_;
  ServiceEnv env_;
  uint64_t session_ = 0;
};

TEST_F(GpuSessionTest, RetrieveWritesEachLayerWordOnceAfterItsCopy) {
  ASSERT_TRUE(Retrieve(Lease(), 10).ok());
  EXPECT_EQ(log_.Take(), (Signals{{0, 10}, {1, 10}}));
  EXPECT_TRUE(engine_.Check(4, 500));
  EXPECT_TRUE(engine_.Check(5, 501));
}

// With staging for several layers, the reader leaves a layer's staging untouched until the next
// layer's call returns: every SSD layer but the last is only enqueued, as DRAM-tier layers are.
TEST_F(GpuSessionTest, SsdLayersOverlapWhenStagingHoldsSeveralLayers) {
  std::vector<uint32_t> progress;
  ASSERT_TRUE(Retrieve(Lease(), 14, 0, 0, &progress).ok());
  EXPECT_EQ(progress, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(log_.Take(), (Signals{{0, 14}, {1, 14}}));
  EXPECT_TRUE(engine_.Check(4, 500));
  EXPECT_TRUE(engine_.Check(5, 501));
  absl::MutexLock lock(&log_.mu);
  EXPECT_EQ(log_.enqueued, (std::vector<uint32_t>{0}));  // the last layer waits until landed
  EXPECT_EQ(log_.drains, 0);
}

// Staging for exactly one layer (2 blocks x 2 objects of 4 KiB): the reader reuses it once the
// sink returns, so every layer waits until landed.
class GpuSessionOneLayerStagingTest : public GpuSessionTest {
 protected:
  GpuSessionOneLayerStagingTest()
      : GpuSessionTest(0, /*retrieve_staging_bytes=*/2 * kParts * 4096) {}
};

TEST_F(GpuSessionOneLayerStagingTest, LayersFromTheSsdTierWaitUntilLanded) {
  std::vector<uint32_t> progress;
  ASSERT_TRUE(Retrieve(Lease(), 14, 0, 0, &progress).ok());
  EXPECT_EQ(progress, (std::vector<uint32_t>{0, 1}));
  absl::MutexLock lock(&log_.mu);
  EXPECT_TRUE(log_.enqueued.empty());  // SSD staging is reused once the sink returns
  EXPECT_EQ(log_.drains, 0);
}

// With the DRAM tier on, blocks stay in it: every layer but the last is only enqueued (the next
// one overlaps its tail), its progress follows once the next call has seen it land, in order.
class GpuSessionDramTest : public GpuSessionTest {
 protected:
  GpuSessionDramTest() : GpuSessionTest(/*dram_bytes=*/8ull << 20) {}
};

TEST_F(GpuSessionDramTest, DramTierLayersOverlapAndProgressStaysInOrder) {
  std::vector<uint32_t> progress;
  ASSERT_TRUE(Retrieve(Lease(), 15, 0, 0, &progress).ok());
  EXPECT_EQ(progress, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(log_.Take(), (Signals{{0, 15}, {1, 15}}));
  EXPECT_TRUE(engine_.Check(4, 500));
  EXPECT_TRUE(engine_.Check(5, 501));
  absl::MutexLock lock(&log_.mu);
  EXPECT_EQ(log_.enqueued, (std::vector<uint32_t>{0}));  // the last layer waits until landed
  EXPECT_EQ(log_.drains, 0);
}

TEST_F(GpuSessionDramTest, AFailedLayerAfterAnEnqueuedOneDrainsAndStillWritesEveryWord) {
  {
    absl::MutexLock lock(&log_.mu);
    log_.fail_layer = 1;
  }
  std::vector<uint32_t> progress;
  const grpc::Status s = Retrieve(Lease(), 16, 0, 0, &progress);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
  // Layer 0 was enqueued; layer 1 failed: the copier is drained before the Read returns (the DRAM
  // tier's blocks are released then), layer 1's word is still written, and no progress claims a
  // layer (the client counts every block failed on a broken call).
  EXPECT_EQ(log_.Take(), (Signals{{0, 16}, {1, 16}}));
  EXPECT_TRUE(progress.empty());
  absl::MutexLock lock(&log_.mu);
  EXPECT_EQ(log_.enqueued, (std::vector<uint32_t>{0}));
  EXPECT_EQ(log_.drains, 1);
}

TEST_F(GpuSessionTest, AFailedRetrieveStillWritesEveryWord) {
  // Unknown lease: the request is admitted, fails, and releases the engine's stream.
  EXPECT_EQ(Retrieve(/*lease=*/999, 11).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(log_.Take(), (Signals{{0, 11}, {1, 11}}));
  // A bad layer range: every word of the namespace, since the range is unknown.
  EXPECT_EQ(Retrieve(Lease(), 12, 1, 7).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(log_.Take(), (Signals{{0, 12}, {1, 12}}));
  // Only layer 1 asked for: only its word.
  ASSERT_TRUE(Retrieve(Lease(), 13, 1, 2).ok());
  EXPECT_EQ(log_.Take(), (Signals{{1, 13}}));
}

TEST_F(GpuSessionTest, OneRetrieveInFlightPerSessionAndTheRefusedOneWritesNothing) {
  absl::Notification hold, inside;
  log_.hold = &hold;
  log_.inside = &inside;
  const uint64_t lease = Lease();
  std::thread first([&] { EXPECT_TRUE(Retrieve(lease, 20).ok()); });
  inside.WaitForNotification();  // the first Retrieve took the hold and waits in layer 0
  const grpc::Status second = Retrieve(Lease(), 21);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << second.error_message();
  EXPECT_TRUE(log_.Take().empty());  // word 0 of ticket 21 would release ticket 20's wait
  hold.Notify();
  first.join();
  EXPECT_EQ(log_.Take(), (Signals{{0, 20}, {1, 20}}));
  ASSERT_TRUE(Retrieve(Lease(), 22).ok());  // admitted again once the first ended
  EXPECT_EQ(log_.Take(), (Signals{{0, 22}, {1, 22}}));
}

TEST_F(GpuSessionTest, StoreWritesTheCapturedWordAlsoWhenNothingIsCopied) {
  tutti::v1::StoreResponse resp;
  ASSERT_TRUE(Store(30, &resp).ok());  // already present: no gather, the word still comes
  ASSERT_EQ(resp.outcomes_size(), 2);
  EXPECT_EQ(resp.outcomes(0), tutti::v1::STORE_ALREADY_PRESENT);
  EXPECT_EQ(log_.Take(), (Signals{{kLayers, 30}}));
}

TEST_F(GpuSessionTest, ClosingTheSessionStopsWordsForLaterFailures) {
  const uint64_t lease = Lease();
  ASSERT_TRUE(env_.sessions().Close(session_, "test").ok());
  EXPECT_EQ(Retrieve(lease, 40).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(log_.Take().empty());  // the engine is gone: nothing is written into its memory
}

TEST(HostSessionTest, ReadyWordsNeedGpuMemory) {
  ServiceEnv env;
  ShmEngine engine;
  tutti::v1::AttachRequest req = env.AttachRequest(engine);
  req.mutable_ready_words()->set_count(3);
  grpc::ClientContext ctx;
  tutti::v1::AttachResponse resp;
  const grpc::Status s = env.kv().Attach(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("ready_words"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace tutti::server::testing

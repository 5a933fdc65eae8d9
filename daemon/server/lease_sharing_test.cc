// Issue 12 over the engine API: memory-less sessions (vLLM's scheduler) and Retrieves under the
// leases of another session of the same engine_group (its workers), with lease_ids.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/server/kvcache_service.h"
#include "daemon/server/service_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::server::testing {
namespace {

using ::testing::HasSubstr;
using tutti::v1::RetrieveProgress;

const std::string kGroup = "engine-group-0001";  // 17 bytes

class LeaseSharingServiceTest : public ::testing::Test {
 protected:
  static EnvOptions Options() {
    EnvOptions o;
    o.max_sessions = 8;
    return o;
  }

  grpc::Status Attach(const tutti::v1::AttachRequest& req, uint64_t* session = nullptr) {
    grpc::ClientContext ctx;
    tutti::v1::AttachResponse resp;
    grpc::Status s = env_.kv().Attach(&ctx, req, &resp);
    if (session != nullptr) *session = env_.Remember(resp);
    return s;
  }
  // The engine's request with memory and `group`.
  tutti::v1::AttachRequest WithMemory(const std::string& group) {
    tutti::v1::AttachRequest req = env_.AttachRequest(engine_);
    req.set_engine_group(group);
    return req;
  }
  // No regions, no placements, num_blocks 0; still a credential.
  tutti::v1::AttachRequest Memoryless(const std::string& group) {
    tutti::v1::AttachRequest req = WithMemory(group);
    req.clear_regions();
    req.clear_placements();
    req.set_num_blocks(0);
    return req;
  }
  uint64_t Open(const tutti::v1::AttachRequest& req) {
    uint64_t id = 0;
    grpc::Status s = Attach(req, &id);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return id;
  }

  // Stores engine blocks 0..n-1 under keys base.. from session `session`, durably.
  void StoreBlocks(uint64_t session, uint64_t base, uint32_t n) {
    tutti::v1::StoreRequest req;
    env_.Name(session, &req);
    req.set_wait_durable(true);
    for (uint32_t i = 0; i < n; ++i) {
      engine_.Fill(i, base + i);
      auto* p = req.add_blocks();
      p->set_key(KeyBytes(base + i));
      p->set_engine_block(i);
    }
    grpc::ClientContext ctx;
    tutti::v1::StoreResponse resp;
    grpc::Status s = env_.kv().Store(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  uint64_t Lookup(uint64_t session, std::vector<uint64_t> keys, uint32_t want_hits) {
    tutti::v1::LookupRequest req;
    env_.Name(session, &req);
    for (uint64_t k : keys) req.add_keys(KeyBytes(k));
    grpc::ClientContext ctx;
    tutti::v1::LookupResponse resp;
    grpc::Status s = env_.kv().Lookup(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.hits(), want_hits);
    return resp.lease_id();
  }
  // Retrieves key k into engine block `block` for each (k, block), under lease_id and lease_ids.
  grpc::Status Retrieve(uint64_t session, uint64_t lease_id, std::vector<uint64_t> lease_ids,
                        std::vector<std::pair<uint64_t, uint32_t>> pairs) {
    tutti::v1::RetrieveRequest req;
    env_.Name(session, &req);
    req.set_lease_id(lease_id);
    for (uint64_t id : lease_ids) req.add_lease_ids(id);
    for (const auto& [key, block] : pairs) {
      auto* p = req.add_blocks();
      p->set_key(KeyBytes(key));
      p->set_engine_block(block);
    }
    grpc::ClientContext ctx;
    auto reader = env_.kv().Retrieve(&ctx, req);
    RetrieveProgress progress;
    while (reader->Read(&progress)) {
      EXPECT_EQ(progress.failed_size(), 0);
    }
    return reader->Finish();
  }
  grpc::Status Release(uint64_t session, uint64_t lease) {
    tutti::v1::ReleaseRequest req;
    env_.Name(session, &req);
    req.set_lease_id(lease);
    grpc::ClientContext ctx;
    tutti::v1::ReleaseResponse resp;
    return env_.kv().Release(&ctx, req, &resp);
  }
  // Blocks the sessions' leases pin, claimed ones included.
  uint64_t Pinned() {
    uint64_t n = 0;
    for (const SessionSummary& row : env_.sessions().List()) n += row.pinned_blocks;
    return n;
  }
  static void ExpectError(const grpc::Status& s, grpc::StatusCode code, const std::string& part) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(part));
  }

  ServiceEnv env_{Options()};
  ShmEngine engine_;
};

TEST_F(LeaseSharingServiceTest, AMemorylessSessionLooksUpAndReleasesButNeitherRetrievesNorStores) {
  const uint64_t worker = Open(WithMemory(kGroup));
  StoreBlocks(worker, 100, 3);
  const uint64_t scheduler = Open(Memoryless(kGroup));
  ASSERT_NE(scheduler, 0u);
  const uint64_t lease = Lookup(scheduler, {100, 101, 102, 103}, 3);
  ASSERT_NE(lease, 0u);
  ExpectError(Retrieve(scheduler, lease, {}, {{100, 0}}), grpc::StatusCode::FAILED_PRECONDITION,
              "memory-less");
  tutti::v1::StoreRequest store;
  env_.Name(scheduler, &store);
  auto* p = store.add_blocks();
  p->set_key(KeyBytes(500));
  p->set_engine_block(0);
  grpc::ClientContext ctx;
  tutti::v1::StoreResponse resp;
  ExpectError(env_.kv().Store(&ctx, store, &resp), grpc::StatusCode::FAILED_PRECONDITION,
              "memory-less");
  EXPECT_TRUE(Release(scheduler, lease).ok()) << "the refused Retrieve left the lease as it was";
  tutti::v1::ReportComputeRequest report;
  env_.Name(scheduler, &report);
  grpc::ClientContext rctx;
  tutti::v1::ReportComputeResponse rresp;
  EXPECT_TRUE(env_.kv().ReportCompute(&rctx, report, &rresp).ok());
  // Without a group too (a lookup-only client).
  EXPECT_NE(Open(Memoryless("")), 0u);
}

TEST_F(LeaseSharingServiceTest, MemoryGivenInPartOrABadGroupIsInvalid) {
  tutti::v1::AttachRequest req = Memoryless(kGroup);
  req.add_placements()->set_block_stride(kBlockBytes);
  ExpectError(Attach(req), grpc::StatusCode::INVALID_ARGUMENT, "num_blocks: 0");
  req = WithMemory(kGroup);
  req.set_num_blocks(0);
  ExpectError(Attach(req), grpc::StatusCode::INVALID_ARGUMENT, "num_blocks: 0");
  req = WithMemory(kGroup);
  req.clear_placements();
  ExpectError(Attach(req), grpc::StatusCode::INVALID_ARGUMENT, "placements: none");
  req = WithMemory(kGroup);
  req.clear_regions();
  ExpectError(Attach(req), grpc::StatusCode::INVALID_ARGUMENT, "regions: none");
  req = Memoryless(kGroup);
  req.mutable_ready_words()->set_count(3);
  ExpectError(Attach(req), grpc::StatusCode::INVALID_ARGUMENT, "num_blocks: 0");
  for (size_t n : {1, 15, 65}) {
    ExpectError(Attach(Memoryless(std::string(n, 'g'))), grpc::StatusCode::INVALID_ARGUMENT,
                "engine_group: " + std::to_string(n) + " bytes; must be 16 to 64");
  }
  EXPECT_EQ(env_.sessions().num_sessions(), 0u);
  EXPECT_NE(Open(Memoryless(std::string(16, 'g'))), 0u);
  EXPECT_NE(Open(Memoryless(std::string(64, 'g'))), 0u);
  EXPECT_NE(Open(Memoryless("")), 0u);
}

TEST_F(LeaseSharingServiceTest, AWorkerRetrievesUnderTheSchedulersLeasesAndEndsThem) {
  const uint64_t worker = Open(WithMemory(kGroup));
  StoreBlocks(worker, 100, 4);
  const uint64_t scheduler = Open(Memoryless(kGroup));
  const uint64_t first = Lookup(scheduler, {100, 101}, 2);
  const uint64_t second = Lookup(scheduler, {100, 101, 102, 103}, 4);  // shares a prefix
  for (uint32_t b = 4; b < 8; ++b) engine_.Zero(b);
  grpc::Status s = Retrieve(worker, 0, {first, second}, {{100, 4}, {101, 5}, {102, 6}, {103, 7}});
  ASSERT_TRUE(s.ok()) << s.error_message();
  for (uint32_t i = 0; i < 4; ++i) EXPECT_TRUE(engine_.Check(4 + i, 100 + i)) << i;
  // Both ended with the Retrieve, and every pin is gone.
  EXPECT_EQ(Release(scheduler, first).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Release(scheduler, second).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Pinned(), 0u);
  // lease_id and lease_ids together.
  const uint64_t a = Lookup(scheduler, {100}, 1), b = Lookup(scheduler, {101}, 1);
  ASSERT_TRUE(Retrieve(worker, a, {b}, {{100, 4}, {101, 5}}).ok());
  EXPECT_EQ(Pinned(), 0u);
}

TEST_F(LeaseSharingServiceTest, LeasesOfOtherGroupsNamespacesOrNoGroupAreNotFound) {
  const uint64_t writer = Open(WithMemory(""));
  StoreBlocks(writer, 100, 1);
  const uint64_t scheduler = Open(Memoryless(kGroup));
  const uint64_t lease = Lookup(scheduler, {100}, 1);
  tutti::v1::AttachRequest other_ns = WithMemory(kGroup);
  other_ns.mutable_namespace_()->set_model_id("another-model");
  for (const tutti::v1::AttachRequest& req :
       {WithMemory("engine-group-0002"), WithMemory(""), other_ns}) {
    const uint64_t thief = Open(req);
    const grpc::Status s = Retrieve(thief, lease, {}, {{100, 0}});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_EQ(s.error_message(), absl::StrCat("lease ", lease, " is not held by session ", thief,
                                              " (unknown, released or expired)"));
  }
  // A session without a group cannot lend its own leases either.
  const uint64_t plain_lease = Lookup(writer, {100}, 1);
  const uint64_t grouped = Open(WithMemory(kGroup));
  EXPECT_EQ(Retrieve(grouped, plain_lease, {}, {{100, 0}}).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Release(scheduler, lease).ok());
  EXPECT_TRUE(Release(writer, plain_lease).ok());
}

TEST_F(LeaseSharingServiceTest, OneBadLeaseClaimsNothingAndDuplicatesAreRefused) {
  const uint64_t worker = Open(WithMemory(kGroup));
  StoreBlocks(worker, 100, 2);
  const uint64_t scheduler = Open(Memoryless(kGroup));
  const uint64_t a = Lookup(scheduler, {100}, 1), b = Lookup(scheduler, {101}, 1);
  ExpectError(Retrieve(worker, 0, {a, b, 424242}, {{100, 0}, {101, 1}}),
              grpc::StatusCode::NOT_FOUND, "lease 424242");
  ExpectError(Retrieve(worker, 0, {a}, {{100, 0}, {101, 1}}), grpc::StatusCode::FAILED_PRECONDITION,
              "blocks[1]");
  ExpectError(Retrieve(worker, a, {b, a}, {{100, 0}}), grpc::StatusCode::INVALID_ARGUMENT,
              "lease_ids[1]");
  EXPECT_EQ(Pinned(), 2u);
  EXPECT_TRUE(Release(scheduler, a).ok());
  EXPECT_TRUE(Release(scheduler, b).ok());
  EXPECT_EQ(Pinned(), 0u);
}

}  // namespace
}  // namespace tutti::server::testing

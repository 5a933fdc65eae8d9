// The bench workloads and EngineClient against the in-process fake daemon: what they send, and
// that they notice what goes wrong (corruption, failed blocks, misses, full staging, RPC errors).
#include "client/hostengine/workload.h"

#include <stdlib.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "client/hostengine/content.h"
#include "common/connect.h"
#include "gtest/gtest.h"
#include "tests/common/fake_tuttid.h"

namespace tutti::hostengine {
namespace {

KvShape SmallShape() {
  KvShape s;
  s.layers = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  return s;
}

class WorkloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A fresh directory: pids repeat across Bazel's sandboxes, so they cannot name the socket.
    char dir[] = "/tmp/tutti-fake-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_ = dir_ + "/s.sock";
    auto fake = testing::FakeTuttid::Start(socket_);
    ASSERT_TRUE(fake.ok()) << fake.status();
    fake_ = std::move(*fake);
    auto channel = ConnectToTuttid(socket_, absl::Seconds(5));
    ASSERT_TRUE(channel.ok()) << channel.status();
    client_ = std::make_unique<EngineClient>(*channel, socket_);
    auto engine = HostEngine::Create(SmallShape(), 16, "tutti-wl-test");
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    auto attach = client_->Attach(engine_->MakeAttachRequest(EngineIdentity()), engine_->fds());
    ASSERT_TRUE(attach.ok()) << attach.status();
  }
  void TearDown() override {
    client_.reset();
    fake_.reset();
    unlink(socket_.c_str());
    rmdir(dir_.c_str());
  }

  std::string dir_, socket_;
  std::unique_ptr<testing::FakeTuttid> fake_;
  std::unique_ptr<EngineClient> client_;
  std::unique_ptr<HostEngine> engine_;
};

TEST_F(WorkloadTest, StoreThenRetrieveVerifies) {
  const auto keys = MakeKeyChain(5, 40);
  StoreOptions so;
  so.batch = 8;
  const StoreTally st = StoreKeys(*client_, *engine_, keys, so);
  ASSERT_TRUE(st.status.ok()) << st.status;
  EXPECT_EQ(st.durable, 40u);
  EXPECT_EQ(st.bytes, 40 * SmallShape().block_bytes());
  EXPECT_EQ(fake_->store_calls(), 5u);
  EXPECT_EQ(fake_->blocks(), 40u);

  RetrieveOptions ro;
  ro.batch = 16;
  const RetrieveTally rt = RetrieveKeys(*client_, *engine_, keys, ro);
  ASSERT_TRUE(rt.status.ok()) << rt.status;
  EXPECT_EQ(rt.hits, 40u);
  EXPECT_EQ(rt.misses + rt.failed + rt.mismatched_blocks + rt.progress_errors, 0u);
  EXPECT_EQ(rt.lookup_us.size(), 3u);
  for (KeyResult r : rt.results) EXPECT_EQ(r, KeyResult::kHit);

  // Storing again finds them present.
  const StoreTally again = StoreKeys(*client_, *engine_, keys, so);
  EXPECT_EQ(again.already_present, 40u);
}

TEST_F(WorkloadTest, MissesAreClassifiedOneByOne) {
  const auto keys = MakeKeyChain(6, 20);
  // Store every key but 3 and 11.
  std::vector<Key> some;
  for (int i = 0; i < 20; ++i) {
    if (i != 3 && i != 11) some.push_back(keys[i]);
  }
  ASSERT_TRUE(StoreKeys(*client_, *engine_, some, StoreOptions()).status.ok());
  const RetrieveTally rt = RetrieveKeys(*client_, *engine_, keys, RetrieveOptions());
  ASSERT_TRUE(rt.status.ok());
  EXPECT_EQ(rt.hits, 18u);
  EXPECT_EQ(rt.misses, 2u);
  EXPECT_EQ(rt.results[3], KeyResult::kMiss);
  EXPECT_EQ(rt.results[11], KeyResult::kMiss);
  EXPECT_EQ(rt.results[12], KeyResult::kHit);
}

TEST_F(WorkloadTest, CorruptionIsAMismatch) {
  const auto keys = MakeKeyChain(7, 10);
  ASSERT_TRUE(StoreKeys(*client_, *engine_, keys, StoreOptions()).status.ok());
  fake_->CorruptNextRetrieve();
  const RetrieveTally rt = RetrieveKeys(*client_, *engine_, keys, RetrieveOptions());
  EXPECT_EQ(rt.mismatched_blocks, 1u);
  EXPECT_EQ(rt.mismatched_bytes, 1u);
  EXPECT_EQ(rt.hits, 9u);
  EXPECT_EQ(rt.results[0], KeyResult::kMismatch);
}

TEST_F(WorkloadTest, FailedBlocksAreNotHits) {
  const auto keys = MakeKeyChain(8, 6);
  ASSERT_TRUE(StoreKeys(*client_, *engine_, keys, StoreOptions()).status.ok());
  fake_->FailKey(keys[2]);
  const RetrieveTally rt = RetrieveKeys(*client_, *engine_, keys, RetrieveOptions());
  EXPECT_EQ(rt.failed, 1u);
  EXPECT_EQ(rt.results[2], KeyResult::kFailed);
  EXPECT_EQ(rt.hits, 5u);
}

TEST_F(WorkloadTest, RejectedBlocksAreRetried) {
  const auto keys = MakeKeyChain(9, 10);
  fake_->RejectNextStores(4);
  StoreOptions so;
  so.retry_backoff = absl::Milliseconds(1);
  const StoreTally st = StoreKeys(*client_, *engine_, keys, so);
  EXPECT_EQ(st.durable, 10u);
  EXPECT_EQ(st.rejected_full, 0u);
  EXPECT_EQ(fake_->store_calls(), 2u);

  const auto more = MakeKeyChain(10, 3);
  fake_->RejectNextStores(1000);
  so.reject_retries = 2;
  const StoreTally full = StoreKeys(*client_, *engine_, more, so);
  EXPECT_EQ(full.rejected_full, 3u);
  EXPECT_EQ(full.durable, 0u);
}

TEST_F(WorkloadTest, RpcErrorStopsAndIsReported) {
  const auto keys = MakeKeyChain(11, 10);
  fake_->FailStoresWith(static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  const StoreTally st = StoreKeys(*client_, *engine_, keys, StoreOptions());
  EXPECT_EQ(st.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.outcomes[0], tutti::v1::STORE_OUTCOME_UNSPECIFIED);
}

TEST_F(WorkloadTest, KeepAliveRunsAndDetachEndsSession) {
  absl::SleepFor(absl::Milliseconds(350));  // ttl 400 ms: keep-alive every 100 ms
  EXPECT_GE(fake_->keepalives(), 2u);
  EXPECT_EQ(client_->keepalive_failures(), 0u);
  EXPECT_EQ(fake_->sessions(), 1u);
  EXPECT_TRUE(client_->Detach().ok());
  EXPECT_EQ(fake_->sessions(), 0u);
  EXPECT_EQ(client_->Detach().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ConnectTest, UnreachableSaysWhy) {
  auto missing = ConnectToTuttid("/tmp/tutti-no-such-dir/x.sock", absl::Seconds(1));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(missing.status().message().find("cannot reach tuttid at /tmp/tutti-no-such-dir/x.sock"),
            std::string::npos);
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos);
  EXPECT_NE(missing.status().message().find("systemctl status tuttid"), std::string::npos);
}

TEST(QuantileTest, NearestRank) {
  EXPECT_EQ(Quantile({}, 0.5), 0);
  EXPECT_EQ(Quantile({3, 1, 2}, 0.5), 2);
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(Quantile(v, 0.99), 99);
  EXPECT_EQ(Quantile(v, 1.0), 100);
  EXPECT_EQ(Quantile(v, 0.0), 1);
}

}  // namespace
}  // namespace tutti::hostengine

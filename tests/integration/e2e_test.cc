// End to end through the real tuttid: store blocks from a host-mode engine, retrieve them into
// other engine blocks and verify every byte; restart the daemon (SIGTERM) and find them all
// again; the Admin API and the tuttictl binary report what happened.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tutti::testing {
namespace {

using hostengine::KeyResult;

constexpr uint32_t kBlocks = 200;
constexpr uint32_t kEngineBlocks = 64;

class E2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TuttidConfig config;
    config.capacity_bytes = 64ull << 20;
    config.object_bytes = 4096;
    config.max_objects = 8;
    auto env = TuttidEnv::Create(config);
    ASSERT_TRUE(env.ok()) << env.status();
    env_ = std::move(*env);
    StartDaemon();
  }
  void StartDaemon() {
    auto daemon = TuttidProcess::Start(*env_);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
  }
  void StopDaemon() {
    auto code = daemon_->Stop();
    ASSERT_TRUE(code.ok()) << code.status() << "\n" << daemon_->LogTail();
    EXPECT_EQ(*code, 0) << daemon_->LogTail();
  }
  // Every key must come back and verify.
  void ExpectAllVerify(EngineSession& s, const std::vector<Key>& keys) {
    hostengine::RetrieveOptions ro;
    ro.batch = 32;
    const auto t = hostengine::RetrieveKeys(*s.client, *s.engine, keys, ro);
    ASSERT_TRUE(t.status.ok()) << t.status << "\n" << daemon_->LogTail();
    EXPECT_EQ(t.hits, keys.size());
    EXPECT_EQ(t.misses, 0u);
    EXPECT_EQ(t.failed, 0u);
    EXPECT_EQ(t.mismatched_blocks, 0u) << t.mismatched_bytes << " bytes differ";
    EXPECT_EQ(t.progress_errors, 0u);
  }

  std::unique_ptr<TuttidEnv> env_;
  std::unique_ptr<TuttidProcess> daemon_;
};

TEST_F(E2eTest, StoreRetrieveRestartRetrieve) {
  const auto shape = SmallShape();
  const auto keys = hostengine::MakeKeyChain(42, kBlocks);
  {
    auto s = AttachEngine(*daemon_, shape, kEngineBlocks);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->attach.object_bytes(), shape.object_len());
    EXPECT_GE(s->attach.max_blocks_per_call(), 32u);

    hostengine::StoreOptions so;
    so.batch = 32;
    const auto st = hostengine::StoreKeys(*s->client, *s->engine, keys, so);
    ASSERT_TRUE(st.status.ok()) << st.status << "\n" << daemon_->LogTail();
    EXPECT_EQ(st.durable, kBlocks);
    ExpectAllVerify(*s, keys);

    // The same keys again: present, nothing copied.
    const auto again = hostengine::StoreKeys(*s->client, *s->engine, keys, so);
    EXPECT_EQ(again.already_present, kBlocks);

    // Admin numbers while the session is attached.
    auto status = AdminStatus(*daemon_);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->io_backend(), "uring");
    EXPECT_EQ(status->device_mode(), "host");
    EXPECT_LE(status->capacity_bytes(), 64ull << 20);
    EXPECT_GT(status->capacity_bytes(), 32ull << 20);
    EXPECT_EQ(status->slots_used(), kBlocks);
    EXPECT_GT(status->slots_total(), kBlocks);
    EXPECT_GE(status->used_bytes(), kBlocks * shape.block_bytes());
    EXPECT_LE(status->used_bytes(), status->capacity_bytes());
    EXPECT_EQ(status->sessions(), 1u);
    EXPECT_FALSE(status->version().empty());

    auto sessions = AdminSessions(*daemon_);
    ASSERT_TRUE(sessions.ok());
    ASSERT_EQ(sessions->sessions_size(), 1);
    EXPECT_EQ(sessions->sessions(0).session_id(), s->attach.session_id());
    EXPECT_EQ(sessions->sessions(0).engine_id(), "tuttictl-bench");
    EXPECT_EQ(sessions->sessions(0).model_id(), "bench-llama3-8b");
    EXPECT_EQ(sessions->sessions(0).num_blocks(), kEngineBlocks);
    EXPECT_EQ(sessions->sessions(0).namespace_id(), s->attach.namespace_id());

    auto stats = AdminStats(*daemon_);
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->blocks_stored(), kBlocks);
    EXPECT_EQ(stats->bytes_read(), kBlocks * shape.block_bytes());
    EXPECT_GE(stats->bytes_written(), kBlocks * shape.block_bytes());
    EXPECT_EQ(stats->blocks_retrieved(), kBlocks);
    EXPECT_EQ(stats->lookup_hits(), kBlocks);
    EXPECT_EQ(stats->lookup_misses(), 0u);
    EXPECT_GE(stats->lookups(), kBlocks / 32);
    EXPECT_EQ(stats->verify_errors() + stats->io_errors() + stats->store_failed(), 0u);
    EXPECT_EQ(stats->sessions(), 1u);
    ASSERT_EQ(stats->namespaces_size(), 1);
    EXPECT_EQ(stats->namespaces(0).namespace_id(), s->attach.namespace_id());
    EXPECT_EQ(stats->namespaces(0).blocks_ssd(), kBlocks);
    ASSERT_TRUE(s->client->Detach().ok());
  }
  StopDaemon();

  // A new daemon on the same pool and journal has every block.
  StartDaemon();
  auto s = AttachEngine(*daemon_, shape, kEngineBlocks);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectAllVerify(*s, keys);
  auto stats = AdminStats(*daemon_);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->namespaces_size(), 1);
  EXPECT_EQ(stats->namespaces(0).blocks_ssd(), kBlocks);
  EXPECT_EQ(stats->verify_errors(), 0u);

  // Evicting the namespace makes every block a miss.
  auto evicted = AdminEvict(*daemon_, s->attach.namespace_id(), false);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(evicted->evicted(), kBlocks);
  EXPECT_EQ(evicted->skipped_pinned(), 0u);
  auto lookup = s->client->Lookup(absl::MakeConstSpan(keys).subspan(0, 16));
  ASSERT_TRUE(lookup.ok());
  EXPECT_EQ(lookup->hits(), 0u);
  EXPECT_EQ(lookup->lease_id(), 0u);
  s->client.reset();
  StopDaemon();
}

TEST_F(E2eTest, LayerRangeRetrieveTouchesOnlyThoseLayers) {
  const auto shape = SmallShape();
  auto s = AttachEngine(*daemon_, shape, 8);
  ASSERT_TRUE(s.ok()) << s.status();
  const auto keys = hostengine::MakeKeyChain(7, 4);
  ASSERT_TRUE(hostengine::StoreKeys(*s->client, *s->engine, keys, {}).status.ok());
  auto lookup = s->client->Lookup(keys);
  ASSERT_TRUE(lookup.ok());
  ASSERT_EQ(lookup->hits(), 4u);
  const std::vector<uint32_t> targets = {7, 5, 6, 4};
  for (uint32_t b : targets) s->engine->ZeroBlock(b);
  auto r = s->client->Retrieve(lookup->lease_id(), keys, targets, 1, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->layers, (std::vector<uint32_t>{1, 2}));
  EXPECT_TRUE(r->failed.empty());
  const uint64_t layer_bytes = shape.object_len() * shape.parts();
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(s->engine->VerifyBlock(targets[i], keys[i], 1, 3), 0u);
    // Layers 0 and 3 were not copied: still all zero, so nearly every byte differs.
    EXPECT_GT(s->engine->VerifyBlock(targets[i], keys[i], 0, 1), layer_bytes * 9 / 10);
    EXPECT_GT(s->engine->VerifyBlock(targets[i], keys[i], 3, 4), layer_bytes * 9 / 10);
  }
  // The lease ended with the Retrieve: releasing it again is NOT_FOUND.
  EXPECT_EQ(s->client->Release(lookup->lease_id()).code(), absl::StatusCode::kNotFound);
}

TEST_F(E2eTest, TuttictlAgainstTheDaemon) {
  const std::string ctl = RunfilePath("client/tuttictl");
  const std::string sock = "--socket=" + env_->socket();
  const std::vector<std::string> bench = {ctl,           sock,           "bench",
                                          "--layers=4",  "--kv_heads=2", "--head_dim=64",
                                          "--blocks=96", "--batch=32",   "--verify"};
  CommandResult r = RunCommand(bench);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err << daemon_->LogTail();
  EXPECT_NE(r.out.find("hits 96, misses 0, failed 0, mismatches 0 blocks"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("durable 96"), std::string::npos) << r.out;

  r = RunCommand({ctl, sock, "stats", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"blocks_stored\":96"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"verify_errors\":0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"model_id\":\"bench-llama3-8b\",\"blocks_ssd\":96"), std::string::npos)
      << r.out;
  r = RunCommand({ctl, sock, "status"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("io backend   uring"), std::string::npos) << r.out;
  r = RunCommand({ctl, sock, "sessions"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "no sessions\n");  // the bench detached

  StopDaemon();
  StartDaemon();
  // A later run with the same seed verifies what the first one stored, across the restart.
  std::vector<std::string> again = bench;
  again.push_back("--phase=retrieve");
  r = RunCommand(again);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  again.push_back("--seed=9");  // never stored: every block a miss, exit 1
  r = RunCommand(again);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("verify failed: 96 misses"), std::string::npos) << r.err;

  r = RunCommand({ctl, sock, "evict", "--namespace=bench-llama3-8b"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "evicted 96 blocks; 0 pinned blocks kept\n");
  r = RunCommand({ctl, sock, "evict"});
  EXPECT_EQ(r.exit_code, 2);

  StopDaemon();
  r = RunCommand({ctl, sock, "status"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot reach tuttid at " + env_->socket()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("is it running? (systemctl status tuttid)"), std::string::npos);
}

}  // namespace
}  // namespace tutti::testing

// LRU order survives a clean restart (SIGTERM: tuttid writes a final checkpoint, which keeps each
// block's last use): of a full pool's blocks, half looked up just before the restart and half not,
// the new blocks stored after it evict only the ones not looked up.
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tutti::testing {
namespace {

constexpr uint32_t kEngineBlocks = 32;
constexpr uint32_t kBatch = 32;

void Store(EngineSession& s, const std::vector<Key>& keys) {
  hostengine::StoreOptions so;
  so.batch = kBatch;
  const auto t = hostengine::StoreKeys(*s.client, *s.engine, keys, so);
  ASSERT_TRUE(t.status.ok()) << t.status;
  ASSERT_EQ(t.durable, keys.size());
}

hostengine::RetrieveTally Retrieve(EngineSession& s, const std::vector<Key>& keys) {
  hostengine::RetrieveOptions ro;
  ro.batch = kBatch;
  auto t = hostengine::RetrieveKeys(*s.client, *s.engine, keys, ro);
  EXPECT_TRUE(t.status.ok()) << t.status;
  EXPECT_EQ(t.mismatched_blocks + t.failed, 0u);
  return t;
}

TEST(RecencyTest, HotBlocksSurviveTheEvictionAfterACleanRestart) {
  TuttidConfig config;
  config.capacity_bytes = 64ull << 20;
  config.object_bytes = 64 << 10;
  config.max_objects = 8;
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto status = AdminStatus(**daemon);
  ASSERT_TRUE(status.ok()) << status.status();
  const uint64_t slots = status->slots_total();
  ASSERT_GE(slots, 64u);
  // The hot blocks go first (the lowest slots), so slot order would make them the oldest.
  const auto hot = hostengine::MakeKeyChain(31, slots / 2);
  const auto cold = hostengine::MakeKeyChain(32, slots - slots / 2);
  const auto fresh = hostengine::MakeKeyChain(33, slots / 4);
  {
    auto s = AttachEngine(**daemon, SmallShape(), kEngineBlocks);
    ASSERT_TRUE(s.ok()) << s.status();
    Store(*s, hot);
    Store(*s, cold);
    EXPECT_EQ(Retrieve(*s, hot).hits, hot.size());
  }
  auto stats = AdminStats(**daemon);
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->evictions(), 0u);
  ASSERT_EQ(stats->slots_used(), slots) << "the pool is full";
  auto code = (*daemon)->Stop();
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_EQ(*code, 0) << (*daemon)->LogTail();

  daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto s = AttachEngine(**daemon, SmallShape(), kEngineBlocks);
  ASSERT_TRUE(s.ok()) << s.status();
  Store(*s, fresh);
  EXPECT_EQ(Retrieve(*s, hot).hits, hot.size()) << "hot blocks were evicted";
  EXPECT_EQ(Retrieve(*s, cold).misses, fresh.size());
}

}  // namespace
}  // namespace tutti::testing

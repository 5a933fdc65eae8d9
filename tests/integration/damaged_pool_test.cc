// A pool file cut short while tuttid was down (an operator's mistake, a broken copy): the daemon
// still starts, restores the file's size, serves every block that lay before the cut, and reports
// every block after it as failed (a counted verification error, then a miss), never as data.
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
#include "daemon/pool/layout.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tutti::testing {
namespace {

TEST(DamagedPoolTest, TruncatedPoolFileCostsOnlyTheBlocksItLost) {
  TuttidConfig config;  // one pool file, 4 KiB objects, 8 per block, no DRAM tier
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();
  auto layout = pool::PoolLayout::Compute(config.capacity_bytes, 1, config.object_bytes,
                                          config.max_objects);
  ASSERT_TRUE(layout.ok());
  const auto shape = SmallShape();
  const auto keys = hostengine::MakeKeyChain(7, 200);
  {
    auto daemon = TuttidProcess::Start(**env);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    auto s = AttachEngine(**daemon, shape, 64);
    ASSERT_TRUE(s.ok()) << s.status();
    hostengine::StoreOptions so;
    so.batch = 50;
    ASSERT_EQ(hostengine::StoreKeys(*s->client, *s->engine, keys, so).durable, keys.size());
    ASSERT_TRUE(s->client->Detach().ok());
    auto code = (*daemon)->Stop();
    ASSERT_TRUE(code.ok() && *code == 0);
  }
  // Slots are handed out from 0 up: cut the file just past the last frame of slots 0..99. With
  // extents a group's slots share each object's run, so every later slot has a frame past it.
  uint64_t cut = 0;
  for (uint64_t slot = 0; slot < 100; ++slot) {
    for (uint32_t j = 0; j < layout->max_objects(); ++j) {
      cut = std::max(cut, layout->ObjectLocation(slot, j).offset + layout->object_bytes());
    }
  }
  const std::string path = (*env)->pool_dir() + "/tutti.pool";
  ASSERT_EQ(truncate(path.c_str(), cut), 0);

  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status() << " (a truncated pool must not stop the daemon)";
  auto s = AttachEngine(**daemon, shape, 64);
  ASSERT_TRUE(s.ok()) << s.status();
  hostengine::RetrieveOptions ro;
  ro.batch = 50;
  const auto before_cut = absl::MakeConstSpan(keys).subspan(0, 100);
  const auto kept = hostengine::RetrieveKeys(*s->client, *s->engine, before_cut, ro);
  ASSERT_TRUE(kept.status.ok()) << kept.status;
  EXPECT_EQ(kept.hits, 100u);
  EXPECT_EQ(kept.failed + kept.misses + kept.mismatched_blocks, 0u);

  const auto after_cut = absl::MakeConstSpan(keys).subspan(100);
  const auto lost = hostengine::RetrieveKeys(*s->client, *s->engine, after_cut, ro);
  ASSERT_TRUE(lost.status.ok()) << lost.status;
  EXPECT_EQ(lost.mismatched_blocks, 0u) << "nothing wrong is ever served";
  EXPECT_GT(lost.failed, 0u) << "blocks past the cut are reported failed";
  auto stats = AdminStats(**daemon);
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->verify_errors(), 0u);
  EXPECT_EQ(stats->verify_errors(), lost.failed);

  // Once reported, a lost block is a miss.
  const auto again = hostengine::RetrieveKeys(*s->client, *s->engine, after_cut, ro);
  EXPECT_EQ(again.failed + again.mismatched_blocks, 0u);
  EXPECT_EQ(again.hits, 0u);
}

}  // namespace
}  // namespace tutti::testing

// Storing 3x the configured capacity: the pool files never take more disk than
// pool.capacity_bytes, old blocks are evicted (misses), recent ones verify; blocks pinned by a
// Lookup lease survive stores that would evict them, and are evictable once released.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tutti::testing {
namespace {

using hostengine::KeyResult;

constexpr uint64_t kCapacity = 64ull << 20;
constexpr uint32_t kEngineBlocks = 64;
constexpr uint32_t kBatch = 32;

// 4 layers x 8 KV heads x 128 dims x 2 bytes x 16 tokens: 32 KiB objects, 256 KiB blocks.
hostengine::KvShape BigObjectShape() {
  hostengine::KvShape s;
  s.layers = 4;
  return s;
}

class CapacityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TuttidConfig config;
    config.capacity_bytes = kCapacity;
    config.object_bytes = 32768;
    config.max_objects = 8;
    config.lease_ttl_ms = 600000;  // the pin must outlast the stores below
    auto env = TuttidEnv::Create(config);
    ASSERT_TRUE(env.ok()) << env.status();
    env_ = std::move(*env);
    auto daemon = TuttidProcess::Start(*env_);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    auto s = AttachEngine(*daemon_, BigObjectShape(), kEngineBlocks);
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = std::move(*s);
    auto status = AdminStatus(*daemon_);
    ASSERT_TRUE(status.ok());
    slots_ = status->slots_total();
    ASSERT_GT(slots_, 100u);
    ASSERT_LT(slots_ * BigObjectShape().block_bytes(), kCapacity);
  }

  // Stores `keys` batch by batch, checking the pool's disk use after each batch.
  void StoreCheckingDisk(const std::vector<Key>& keys) {
    for (size_t i = 0; i < keys.size(); i += kBatch) {
      const size_t n = std::min<size_t>(kBatch, keys.size() - i);
      hostengine::StoreOptions so;
      so.batch = kBatch;
      const auto t = hostengine::StoreKeys(*session_.client, *session_.engine,
                                           absl::MakeConstSpan(keys).subspan(i, n), so);
      ASSERT_TRUE(t.status.ok()) << t.status << "\n" << daemon_->LogTail();
      ASSERT_EQ(t.durable, n) << "failed " << t.failed << " rejected " << t.rejected_full;
      ExpectWithinCapacity();
    }
  }

  void ExpectWithinCapacity() {
    const auto use = env_->PoolDiskUse();
    ASSERT_GE(use.files, 1u);
    EXPECT_LE(use.apparent_bytes, kCapacity);
    EXPECT_LE(use.allocated_bytes, kCapacity);
    auto status = AdminStatus(*daemon_);
    ASSERT_TRUE(status.ok());
    EXPECT_LE(status->used_bytes(), status->capacity_bytes());
    EXPECT_LE(status->slots_used(), status->slots_total());
    EXPECT_LE(status->capacity_bytes(), kCapacity);
  }

  hostengine::RetrieveTally Retrieve(const std::vector<Key>& keys) {
    hostengine::RetrieveOptions ro;
    ro.batch = kBatch;
    return hostengine::RetrieveKeys(*session_.client, *session_.engine, keys, ro);
  }

  std::unique_ptr<TuttidEnv> env_;
  std::unique_ptr<TuttidProcess> daemon_;
  EngineSession session_;
  uint64_t slots_ = 0;
};

TEST_F(CapacityTest, ThreeTimesCapacityStaysWithinItAndEvictsOldest) {
  const auto keys = hostengine::MakeKeyChain(11, 3 * slots_);
  StoreCheckingDisk(keys);
  // The oldest tenth is gone, the newest tenth is there and verifies.
  const size_t tenth = slots_ / 10;
  const std::vector<Key> oldest(keys.begin(), keys.begin() + tenth);
  const std::vector<Key> newest(keys.end() - tenth, keys.end());
  const auto old_t = Retrieve(oldest);
  ASSERT_TRUE(old_t.status.ok()) << old_t.status;
  EXPECT_EQ(old_t.misses, tenth);
  const auto new_t = Retrieve(newest);
  ASSERT_TRUE(new_t.status.ok()) << new_t.status;
  EXPECT_EQ(new_t.hits, tenth);
  EXPECT_EQ(new_t.mismatched_blocks + new_t.failed, 0u);
  auto stats = AdminStats(*daemon_);
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->evictions(), 2 * slots_);
  EXPECT_EQ(stats->verify_errors(), 0u);
  EXPECT_LE(stats->slots_used(), slots_);
  EXPECT_GT(stats->slots_used(), slots_ / 2);
}

TEST_F(CapacityTest, PinnedBlocksStayUntilReleased) {
  const auto pinned = hostengine::MakeKeyChain(21, 16);
  StoreCheckingDisk(pinned);
  auto lease = session_.client->Lookup(pinned);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_EQ(lease->hits(), 16u);

  // Twice the capacity of other blocks: without the pin, these 16 (the oldest) would go first.
  StoreCheckingDisk(hostengine::MakeKeyChain(22, 2 * slots_));
  auto evict = AdminEvict(*daemon_, session_.attach.namespace_id(), false);
  ASSERT_TRUE(evict.ok()) << evict.status();
  EXPECT_EQ(evict->skipped_pinned(), 16u);
  EXPECT_GT(evict->evicted(), 0u);

  // Still there under the original lease, byte for byte.
  std::vector<uint32_t> targets;
  for (uint32_t i = 0; i < 16; ++i) {
    targets.push_back(kEngineBlocks - 1 - i);
    session_.engine->ZeroBlock(targets.back());
  }
  auto r = session_.client->Retrieve(lease->lease_id(), pinned, targets);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->failed.empty());
  for (uint32_t i = 0; i < 16; ++i) {
    EXPECT_EQ(session_.engine->VerifyBlock(targets[i], pinned[i]), 0u) << i;
  }

  // Pin again, release explicitly, and store past capacity: now they are evicted.
  auto lease2 = session_.client->Lookup(pinned);
  ASSERT_TRUE(lease2.ok());
  ASSERT_EQ(lease2->hits(), 16u);
  ASSERT_TRUE(session_.client->Release(lease2->lease_id()).ok());
  StoreCheckingDisk(hostengine::MakeKeyChain(23, slots_ + kBatch));
  const auto after = Retrieve(pinned);
  ASSERT_TRUE(after.status.ok());
  EXPECT_EQ(after.misses, 16u);
  EXPECT_EQ(after.hits, 0u);
}

}  // namespace
}  // namespace tutti::testing

// The store's block events (BlockStore::events): STORED when a block is durable and visible,
// REMOVED when it leaves the pool (LRU eviction, Evict, a failed read), nothing for the DRAM tier
// or a key already present, and what a restart says (pool_id, boot_id, blocks_lost_at_start).
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/io/memory_backend.h"
#include "daemon/pool/pool_files.h"
#include "daemon/store/block_store.h"
#include "daemon/store/events.h"
#include "daemon/store/store_test_util.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kLayers = 2;
constexpr uint32_t kObjects = 2 * kLayers;
constexpr uint32_t kObjectLen = 2048;
constexpr uint32_t kFrame = 4096;
constexpr uint64_t kPoolBytes = 8ull << 20;
constexpr uint64_t kPoolId = 0x1122334455667788ull;

Key K(uint32_t i) { return testing::TestKey(i); }

class BlockStoreEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/events_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ + "/state");
    auto layout = pool::PoolLayout::Compute(kPoolBytes, 1, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    options_.layout = *layout;
    options_.state_dir = root_ + "/state";
    options_.store_staging_bytes = 16 * kObjects * kFrame;
    options_.retrieve_staging_bytes = 16 * kObjects * kFrame;
    options_.write_batch_blocks = 4;
    options_.pool_id = kPoolId;
    disk_ = testing::TestDisk(options_.layout);
    ASSERT_NE(disk_, nullptr);
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(root_);
  }

  void Open() {
    store_.reset();
    auto store = BlockStore::Open(options_, io::MemoryBackend::CreateOn(disk_), &clock_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
    auto ns = store_->RegisterNamespace(testing::TestNamespace(kLayers));
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
    cursor_ = store_->events().Subscribe(ns_, 0, 0, &resumed_);
  }

  std::vector<CaptureOutcome> Store(std::vector<Key> keys) {
    auto gather = [](absl::Span<const engine::CopyOp> ops) {
      for (const engine::CopyOp& op : ops) std::memset(op.staging, op.block + 1, kObjectLen);
      return absl::OkStatus();
    };
    auto out = store_->Capture(ns_, keys, 0, kLayers, gather, /*wait_durable=*/true);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<CaptureOutcome>();
  }

  // The events since the last call (none waited for: the hooks run before Capture returns).
  std::vector<BlockEvent> Events() {
    std::vector<BlockEvent> got;
    absl::Status s = store_->events().Next(&cursor_, absl::InfinitePast(), 1 << 20, &got);
    EXPECT_TRUE(s.ok()) << s;
    return got;
  }

  std::string root_;
  StoreOptions options_;
  std::shared_ptr<io::MemoryDisk> disk_;
  ManualClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceId ns_ = 0;
  EventHub::Cursor cursor_;
  bool resumed_ = false;
};

TEST_F(BlockStoreEventsTest, ADurableBlockIsStoredOnceAndVisibleWhenItsEventIs) {
  Open();
  ASSERT_EQ(Store({K(1), K(2)}), std::vector<CaptureOutcome>(2, CaptureOutcome::kDurable));
  std::vector<BlockEvent> got = Events();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].seq, 1u);
  EXPECT_EQ(got[0].kind, BlockEventKind::kStored);
  EXPECT_EQ(got[0].key, K(1));
  EXPECT_EQ(got[1].key, K(2));
  std::vector<Key> k1{K(1)};
  EXPECT_EQ(store_->LookupAndPin(ns_, k1), 1u);
  store_->Unpin(ns_, k1);
  EXPECT_EQ(Store({K(1)})[0], CaptureOutcome::kAlreadyPresent);
  EXPECT_TRUE(Events().empty()) << "a store of a present key is no event";
}

TEST_F(BlockStoreEventsTest, CaptureAloneIsNoEvent) {
  Open();
  auto gather = [](absl::Span<const engine::CopyOp>) { return absl::OkStatus(); };
  std::vector<Key> keys{K(3)};
  auto out = store_->Capture(ns_, keys, 0, 1, gather, false);  // one layer of two: partial
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(Events().empty());
}

TEST_F(BlockStoreEventsTest, EvictAndLruEvictionAreRemoved) {
  Open();
  const uint64_t slots = options_.layout.num_slots();
  ASSERT_GE(slots, 4u);
  for (uint32_t i = 0; i < slots; i += 8) {
    std::vector<Key> some;
    for (uint32_t j = i; j < std::min<uint64_t>(slots, i + 8); ++j) some.push_back(K(1000 + j));
    Store(some);
  }
  EXPECT_EQ(Events().size(), slots);
  // The pool is full: one more block evicts the least recently used, K(100).
  Store({K(99)});
  std::vector<BlockEvent> got = Events();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, BlockEventKind::kRemoved);
  EXPECT_EQ(got[0].key, K(1000));
  EXPECT_EQ(got[1].kind, BlockEventKind::kStored);
  EXPECT_EQ(got[1].key, K(99));
  const auto [evicted, skipped] = store_->Evict(ns_);
  EXPECT_EQ(evicted, slots);
  got = Events();
  ASSERT_EQ(got.size(), slots);
  for (const BlockEvent& e : got) EXPECT_EQ(e.kind, BlockEventKind::kRemoved);
  EXPECT_EQ(got.back().seq, 2 * slots + 2);
}

TEST_F(BlockStoreEventsTest, AFailedReadIsRemoved) {
  Open();
  std::vector<Key> keys{K(7)};
  Store(keys);
  Events();
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 1u);
  const pool::Location loc = options_.layout.ObjectLocation(0, 1);
  disk_->Corrupt(loc.file, loc.offset + 3, 1);
  absl::Status s = store_->Read(ns_, keys, 0, kLayers,
                                [](const datapath::LayerObjects&) { return absl::OkStatus(); });
  EXPECT_TRUE(s.ok()) << s;
  store_->Unpin(ns_, keys);
  std::vector<BlockEvent> got = Events();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, BlockEventKind::kRemoved);
  EXPECT_EQ(got[0].key, K(7));
}

TEST_F(BlockStoreEventsTest, ARestartOnTheSamePoolKeepsPoolIdTakesANewBootAndLosesNothing) {
  Open();
  Store({K(1), K(2), K(3)});
  const uint64_t boot = store_->events().boot_id();
  EXPECT_EQ(store_->events().pool_id(), kPoolId);
  Open();
  EXPECT_EQ(store_->events().pool_id(), kPoolId);
  EXPECT_NE(store_->events().boot_id(), boot);
  EXPECT_EQ(store_->events().blocks_lost_at_start(), 0u);
  EXPECT_EQ(store_->events().last_seq(ns_), 0u) << "recovered blocks are no events";
  std::vector<Key> keys{K(1), K(2), K(3)};
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 3u);
  store_->Unpin(ns_, keys);
  bool resumed = true;
  store_->events().Subscribe(ns_, 3, boot, &resumed);
  EXPECT_FALSE(resumed) << "the previous run's seqs do not resume";
}

TEST_F(BlockStoreEventsTest, ALostStateDirectoryOverAKeptPoolCountsTheBlocksLost) {
  Open();
  Store({K(1), K(2)});
  store_.reset();
  fs::remove_all(options_.state_dir);
  fs::create_directories(options_.state_dir);
  Open();
  EXPECT_EQ(store_->events().blocks_lost_at_start(), 2u);
}

TEST_F(BlockStoreEventsTest, BlocksOfAnotherPoolGeometryAreLostAtStart) {
  Open();
  Store({K(1), K(2), K(3)});
  store_.reset();
  // The same files under a layout of smaller blocks: recovery skips every Put.
  auto layout = pool::PoolLayout::Compute(kPoolBytes, 1, kFrame, kObjects / 2);
  ASSERT_TRUE(layout.ok());
  options_.layout = *layout;
  auto store = BlockStore::Open(options_, io::MemoryBackend::CreateOn(disk_), &clock_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->events().blocks_lost_at_start(), 3u);
}

TEST_F(BlockStoreEventsTest, ANewPoolHasANewPoolIdAndAReopenedOneTheSame) {
  const std::string dir = root_ + "/pool";
  fs::create_directories(dir);
  auto layout = pool::PoolLayout::Compute(kPoolBytes, 1, kFrame, kObjects);
  ASSERT_TRUE(layout.ok());
  uint64_t first = 0;
  {
    auto files = pool::OpenOrCreatePool({dir}, *layout, nullptr);
    ASSERT_TRUE(files.ok()) << files.status();
    first = PoolIdOf(files->uuid);
    EXPECT_EQ(absl::StrCat(absl::Hex(first, absl::kZeroPad16)), files->UuidHex().substr(0, 16));
  }
  {
    auto files = pool::OpenOrCreatePool({dir}, *layout, nullptr);
    ASSERT_TRUE(files.ok()) << files.status();
    EXPECT_EQ(PoolIdOf(files->uuid), first);
  }
  fs::remove_all(dir);  // wiped
  fs::create_directories(dir);
  auto files = pool::OpenOrCreatePool({dir}, *layout, nullptr);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_NE(PoolIdOf(files->uuid), first);
}

}  // namespace
}  // namespace tutti::store

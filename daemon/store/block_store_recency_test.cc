// Recency across a restart: the blocks looked up last are the last evicted, whether or not the
// store was restarted in between (clean stop, or a crash after a checkpoint). Recovery rebuilds the
// LRU list from the last use each checkpoint keeps (JOURNAL.md, record type 6).
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/io/memory_backend.h"
#include "daemon/store/block_store.h"
#include "daemon/store/store_test_util.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kLayers = 4;
constexpr uint32_t kObjects = 2 * kLayers;
constexpr uint32_t kFrame = 4096;
constexpr uint32_t kSlots = 120;  // 60 hot blocks and 60 cold ones fill the pool

enum class Restart {
  kNone,                  // the reference: the same store throughout
  kClean,                 // the store is closed (SIGTERM: a final checkpoint) and reopened
  kCrashAfterCheckpoint,  // the state directory as a checkpoint after the lookups left it
};

std::string Name(const ::testing::TestParamInfo<Restart>& info) {
  switch (info.param) {
    case Restart::kNone:
      return "NoRestart";
    case Restart::kClean:
      return "CleanRestart";
    case Restart::kCrashAfterCheckpoint:
      return "CrashAfterCheckpoint";
  }
  return "";
}

class RecencyTest : public ::testing::TestWithParam<Restart> {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/recency_", getpid(), "_", Name({GetParam(), 0}));
    fs::remove_all(root_);
    state_dir_ = root_ + "/state";
    fs::create_directories(state_dir_);
    // Extents of 6 slots per file, 2 files: the smallest pool of at least kSlots slots has kSlots.
    absl::StatusOr<pool::PoolLayout> layout;
    for (uint64_t capacity = 1ull << 20; capacity < (64ull << 20); capacity += 64 << 10) {
      layout = pool::PoolLayout::Compute(capacity, 2, kFrame, kObjects, 6);
      if (layout.ok() && layout->num_slots() >= kSlots) break;
    }
    ASSERT_TRUE(layout.ok()) << layout.status();
    ASSERT_EQ(layout->num_slots(), kSlots);
    testing::UseTestPool(&options_, *layout, state_dir_);
    options_.checkpoint_every = 1;  // a checkpoint after every batch
    disk_ = testing::TestDisk(options_.layout);
    ASSERT_NE(disk_, nullptr);
    Open();
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
  }

  // Stores `keys`, `per_call` per Capture (staging holds 64 blocks), each call waiting for
  // durability; then waits for the writer's checkpoint.
  void Store(const std::vector<Key>& keys, size_t per_call = 32) {
    for (size_t i = 0; i < keys.size(); i += per_call) {
      std::vector<Key> part(keys.begin() + i, keys.begin() + std::min(keys.size(), i + per_call));
      auto out = store_->Capture(
          ns_, part, 0, kLayers,
          [](absl::Span<const engine::CopyOp> ops) {
            for (const engine::CopyOp& op : ops) op.staging[0] = static_cast<uint8_t>(op.block);
            return absl::OkStatus();
          },
          /*wait_durable=*/true);
      ASSERT_TRUE(out.ok()) << out.status();
      for (CaptureOutcome o : *out) ASSERT_EQ(o, CaptureOutcome::kDurable);
    }
    store_->Flush();
  }

  // Looks up each key (a use), dropping the pin again.
  void Use(const std::vector<Key>& keys) {
    for (const Key& k : keys) {
      ASSERT_EQ(store_->LookupAndPin(ns_, {k}), 1u);
      store_->Unpin(ns_, {k});
    }
  }

  // How many of `keys` the store holds (looks each up: call once, at the end).
  uint32_t Present(const std::vector<Key>& keys) {
    uint32_t n = 0;
    for (const Key& k : keys) {
      if (store_->LookupAndPin(ns_, {k}) == 1) {
        ++n;
        store_->Unpin(ns_, {k});
      }
    }
    return n;
  }

  // Restarts the store as GetParam() says.
  void RestartStore() {
    switch (GetParam()) {
      case Restart::kNone:
        return;
      case Restart::kClean:
        Open();
        return;
      case Restart::kCrashAfterCheckpoint: {
        // The state directory as the crash would leave it (the last batch's checkpoint, taken
        // after the lookups, and its journal); the store's own final checkpoint is thrown away.
        const std::string saved = root_ + "/saved";
        fs::copy(state_dir_, saved, fs::copy_options::recursive);
        store_.reset();
        fs::remove_all(state_dir_);
        fs::rename(saved, state_dir_);
        disk_->SimulateCrash();
        Open();
        return;
      }
    }
  }

  std::string root_, state_dir_;
  StoreOptions options_;
  std::shared_ptr<io::MemoryDisk> disk_;
  ManualClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceId ns_ = 0;
};

// The hot blocks are stored first (the lowest slots) and looked up after the cold ones were
// stored; one more cold block's batch then writes a checkpoint. 30 new blocks must evict 30 cold
// ones and no hot one. (Rebuilding the LRU list in slot order, as recovery did, evicted 30 hot
// blocks and no cold one.)
TEST_P(RecencyTest, NewBlocksEvictTheLeastRecentlyUsedAcrossARestart) {
  const std::vector<Key> hot = testing::TestKeys(0, kSlots / 2);
  const std::vector<Key> cold = testing::TestKeys(1000, kSlots / 2);
  Store(hot);
  Store(std::vector<Key>(cold.begin(), cold.end() - 1));
  Use(hot);
  Store({cold.back()});
  ASSERT_EQ(store_->Stats().slots_used, kSlots) << "the pool is full";
  ASSERT_EQ(store_->Stats().evictions, 0u);
  RestartStore();
  Store(testing::TestKeys(5000, kSlots / 4));
  EXPECT_EQ(store_->Stats().evictions, kSlots / 4);
  EXPECT_EQ(Present(hot), hot.size()) << "hot blocks evicted";
  EXPECT_EQ(Present(cold), cold.size() - kSlots / 4);
}

// Tail-first recency (pool.recency "tail_first"): of one request's blocks the pool evicts the tail
// before the head, since a hit needs the head. A's 40 blocks come in one call that spans five
// write batches of 8, B's 79 in two calls, then one Lookup of all of A; so, oldest first:
// B39..B0, B78..B40, A39..A0, then D. 50 new blocks must evict B's first call whole and the tail
// of its second (B78..B69), keep B40..B68, and keep all of A, across a restart too. (In chain order
// they evicted B0..B49 and kept B's tail B50..B78.)
TEST_P(RecencyTest, TailFirstEvictsARequestsTailBeforeItsHead) {
  options_.tail_first = true;
  Open();
  const std::vector<Key> a = testing::TestKeys(0, 40);
  const std::vector<Key> b = testing::TestKeys(1000, 79);
  Store(a, /*per_call=*/40);
  Store(b, /*per_call=*/40);
  ASSERT_EQ(store_->LookupAndPin(ns_, a), a.size());
  store_->Unpin(ns_, a);
  Store(testing::TestKeys(3000, 1));  // a checkpoint after the Lookup
  ASSERT_EQ(store_->Stats().slots_used, kSlots) << "the pool is full";
  ASSERT_EQ(store_->Stats().evictions, 0u);
  RestartStore();
  Store(testing::TestKeys(5000, 50), /*per_call=*/50);
  EXPECT_EQ(store_->Stats().evictions, 50u);
  EXPECT_EQ(Present(a), a.size()) << "the looked-up request lost blocks";
  EXPECT_EQ(Present(std::vector<Key>(b.begin(), b.begin() + 40)), 0u);
  EXPECT_EQ(Present(std::vector<Key>(b.begin() + 40, b.begin() + 69)), 29u) << "B's head evicted";
  EXPECT_EQ(Present(std::vector<Key>(b.begin() + 69, b.end())), 0u) << "B's tail kept";
}

INSTANTIATE_TEST_SUITE_P(Restarts, RecencyTest,
                         ::testing::Values(Restart::kNone, Restart::kClean,
                                           Restart::kCrashAfterCheckpoint),
                         Name);

}  // namespace
}  // namespace tutti::store

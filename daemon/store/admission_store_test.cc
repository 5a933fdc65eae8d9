// The block store with an admission policy (StoreOptions::admission): declined blocks are
// answered kDeclined, counted, never retrievable, never journaled, and their staging goes back;
// "all" keeps the store as it was.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/io/memory_backend.h"
#include "daemon/store/block_store.h"
#include "daemon/store/store_test_util.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint32_t kObjects = 2 * kLayers;
constexpr uint32_t kObjectLen = 2048;
constexpr uint32_t kFrame = 4096;

BlockStore::Gatherer Fill() {
  return [](absl::Span<const engine::CopyOp> ops) {
    for (const engine::CopyOp& op : ops) {
      for (uint32_t i = 0; i < kObjectLen; ++i) op.staging[i] = static_cast<uint8_t>(op.object + i);
    }
    return absl::OkStatus();
  };
}

class AdmissionStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = store::testing::FreshStateDir("admission");
    auto layout = pool::PoolLayout::Compute(8ull << 20, 2, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    testing::UseTestPool(&options_, *layout, state_dir_);
    disk_ = testing::TestDisk(options_.layout);
    ASSERT_NE(disk_, nullptr);
  }

  absl::Status Open() {
    store_.reset();
    auto store = BlockStore::Open(options_, io::MemoryBackend::CreateOn(disk_), &clock_);
    if (!store.ok()) return store.status();
    store_ = std::move(store).value();
    auto ns = store_->RegisterNamespace(testing::TestNamespace(kLayers));
    if (!ns.ok()) return ns.status();
    ns_ = *ns;
    return absl::OkStatus();
  }

  std::vector<CaptureOutcome> Store(absl::Span<const Key> keys, uint32_t begin = 0,
                                    uint32_t end = kLayers) {
    auto out = store_->Capture(ns_, keys, begin, end, Fill(), /*wait_durable=*/true);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<CaptureOutcome>{};
  }

  uint32_t Hits(absl::Span<const Key> keys) {
    const uint32_t hits = store_->LookupAndPin(ns_, keys);
    store_->Unpin(ns_, keys.subspan(0, hits));
    return hits;
  }

  // The store's admitted, declined and stored block counts.
  void ExpectCounts(uint64_t admitted, uint64_t declined, uint64_t stored) {
    const StoreStats st = store_->Stats();
    EXPECT_EQ(st.blocks_admitted, admitted);
    EXPECT_EQ(st.blocks_declined, declined);
    EXPECT_EQ(st.blocks_stored, stored);
  }

  uint64_t JournalBytes() const {
    uint64_t bytes = 0;
    for (const auto& f : std::filesystem::directory_iterator(state_dir_)) {
      if (f.path().filename().string().rfind("journal.", 0) == 0) bytes += f.file_size();
    }
    return bytes;
  }

  std::string state_dir_;
  StoreOptions options_;
  std::shared_ptr<io::MemoryDisk> disk_;
  ManualClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceId ns_ = 0;
};

TEST_F(AdmissionStoreTest, AllWritesEveryBlockAsBefore) {
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 6);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  EXPECT_EQ(Hits(keys), 6u);
  ExpectCounts(6, 0, 6);
}

TEST_F(AdmissionStoreTest, SecondSightDeclinesTheFirstStoreAndWritesTheSecond) {
  options_.admission = "second_sight";
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 6);
  store_->Flush();
  const uint64_t journal_before = JournalBytes();
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kDeclined);
  store_->Flush();
  EXPECT_EQ(Hits(keys), 0u);  // not retrievable
  ExpectCounts(0, 6, 0);
  const StoreStats st = store_->Stats();
  EXPECT_EQ(st.bytes_written, 0u);
  EXPECT_EQ(st.slots_used, 0u);
  EXPECT_EQ(st.store_staging_used, 0u);  // nothing kept
  EXPECT_EQ(st.write_backlog_blocks, 0u);
  EXPECT_EQ(st.pending_dropped, 0u);
  EXPECT_EQ(JournalBytes(), journal_before);  // nothing journaled

  // Second sight: written, durable, found.
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  EXPECT_EQ(Hits(keys), 6u);
  ExpectCounts(6, 6, 6);
  EXPECT_GT(JournalBytes(), journal_before);
  // Present blocks are not offered to the policy again.
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kAlreadyPresent);
  EXPECT_EQ(store_->Stats().blocks_admitted, 6u);
}

// A block admitted but refused for full staging is offered again by its engine: it counts as
// admitted once, when it is captured.
TEST_F(AdmissionStoreTest, AdmittedCountsABlockOnceThoughFullStagingRefusedItFirst) {
  options_.admission = "second_sight";
  options_.store_staging_bytes = 2 * kObjects * kFrame;  // two blocks at a time
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 3);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kDeclined);
  auto out = store_->Capture(ns_, keys, 0, kLayers, Fill(), /*wait_durable=*/false);
  ASSERT_TRUE(out.ok()) << out.status();
  uint32_t full = 0;
  for (CaptureOutcome o : *out) full += o == CaptureOutcome::kRejectedFull;
  ASSERT_EQ(full, 1u);  // the policy admitted all three; staging took two
  EXPECT_EQ(store_->Stats().blocks_admitted, 2u);
  store_->Flush();
  for (CaptureOutcome o : Store(keys)) {
    EXPECT_TRUE(o == CaptureOutcome::kDurable || o == CaptureOutcome::kAlreadyPresent);
  }
  EXPECT_EQ(Hits(keys), 3u);
  ExpectCounts(3, 3, 3);
}

TEST_F(AdmissionStoreTest, DeclinedBlocksAreGoneAfterARestart) {
  options_.admission = "second_sight";
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 3);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kDeclined);
  ASSERT_TRUE(Open().ok());  // recovery from the journal
  EXPECT_EQ(Hits(keys), 0u);
  EXPECT_EQ(store_->Stats().slots_used, 0u);
  // The ghost lives in memory only: after the restart a Store is a first sight again.
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kDeclined);
}

TEST_F(AdmissionStoreTest, ABlockStoredLayerByLayerIsJudgedOnceComplete) {
  options_.admission = "second_sight";
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 2);
  for (CaptureOutcome o : Store(keys, 0, 2)) EXPECT_EQ(o, CaptureOutcome::kCaptured);
  EXPECT_EQ(store_->Stats().blocks_declined, 0u);  // not asked while partial
  for (CaptureOutcome o : Store(keys, 2, kLayers)) EXPECT_EQ(o, CaptureOutcome::kDeclined);
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.blocks_declined, 2u);
  EXPECT_EQ(st.store_staging_used, 0u);  // its staging went back
  EXPECT_EQ(Hits(keys), 0u);
  // The second sight, layer by layer again: written.
  for (CaptureOutcome o : Store(keys, 0, 2)) EXPECT_EQ(o, CaptureOutcome::kCaptured);
  for (CaptureOutcome o : Store(keys, 2, kLayers)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  EXPECT_EQ(Hits(keys), 2u);
  EXPECT_EQ(store_->Stats().blocks_admitted, 2u);
}

TEST_F(AdmissionStoreTest, ARepeatedKeyInOneCallIsOneSight) {
  options_.admission = "second_sight";
  ASSERT_TRUE(Open().ok());
  const Key k = testing::TestKey(7);
  const std::vector<Key> twice = {k, k};
  for (CaptureOutcome o : Store(twice)) EXPECT_EQ(o, CaptureOutcome::kDeclined);
  EXPECT_EQ(store_->Stats().blocks_declined, 1u);
  auto out = Store(twice);
  EXPECT_EQ(out[0], CaptureOutcome::kDurable);
  EXPECT_EQ(Hits({k}), 1u);
}

TEST_F(AdmissionStoreTest, GhostBoundForgetsOldFirstSights) {
  options_.admission = "second_sight";
  options_.admission_ghost_blocks = 2;
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 3);
  for (const Key& k : keys) EXPECT_EQ(Store({k})[0], CaptureOutcome::kDeclined);
  EXPECT_EQ(Store({keys[0]})[0], CaptureOutcome::kDeclined);  // forgotten
  EXPECT_EQ(Store({keys[2]})[0], CaptureOutcome::kDurable);   // still remembered
}

TEST_F(AdmissionStoreTest, AnUnknownPolicyStopsOpenNamingTheField) {
  options_.admission = "maybe";
  const absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pool.admission"), std::string::npos) << s;
}

}  // namespace
}  // namespace tutti::store

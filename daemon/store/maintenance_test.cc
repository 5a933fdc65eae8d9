// BlockStore::Scrub and FlushFor (maintenance.cc): a block corrupted on the media is found and
// dropped, exactly it; the others stay.
#include <unistd.h>

#include <filesystem>

#include "absl/strings/match.h"
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
constexpr uint32_t kBlocks = 20;

class MaintenanceTest : public ::testing::Test {
 protected:
  void Open(uint64_t dram_bytes = 0) {
    state_dir_ = store::testing::FreshStateDir("maint");
    auto layout = pool::PoolLayout::Compute(8ull << 20, 2, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    testing::UseTestPool(&options_, *layout, state_dir_);
    options_.dram_bytes = dram_bytes;
    disk_ = testing::TestDisk(options_.layout);
    ASSERT_NE(disk_, nullptr);
    backend_ = io::MemoryBackend::CreateOn(disk_).release();
    auto store = BlockStore::Open(options_, std::unique_ptr<io::IoBackend>(backend_), &clock_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
    auto ns = store_->RegisterNamespace(testing::TestNamespace(kLayers));
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
  }

  void Store(uint32_t first, uint32_t n, bool wait = true) {
    std::vector<Key> keys;
    for (uint32_t i = first; i < first + n; ++i) keys.push_back(testing::TestKey(i));
    auto out = store_->Capture(
        ns_, keys, 0, kLayers,
        [](absl::Span<const engine::CopyOp> ops) {
          for (const engine::CopyOp& op : ops) memset(op.staging, 0x40 + op.object, kObjectLen);
          return absl::OkStatus();
        },
        wait);
    ASSERT_TRUE(out.ok()) << out.status();
  }

  // Whether key i is found (its pin dropped again).
  bool Present(uint32_t i) {
    const Key k = testing::TestKey(i);
    const bool hit = store_->LookupAndPin(ns_, absl::MakeConstSpan(&k, 1)) == 1;
    if (hit) store_->Unpin(ns_, absl::MakeConstSpan(&k, 1));
    return hit;
  }

  // The index of the test key whose block is `key` (-1 if none).
  int KeyIndex(const Key& key) {
    for (uint32_t i = 0; i < kBlocks; ++i) {
      if (testing::TestKey(i) == key) return static_cast<int>(i);
    }
    return -1;
  }

  // Scrubs in batches of 3 and expects exactly one bad block, in `slot`, whose reason starts
  // with `reason`; every other block stays.
  void ExpectOnlyBadSlot(uint64_t slot, const std::string& reason) {
    std::vector<ScrubProgress> reports;
    auto result = store_->Scrub(ScrubOptions{3}, [&](const ScrubProgress& p) {
      reports.push_back(p);
      return true;
    });
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->blocks_total, kBlocks);
    EXPECT_EQ(result->blocks_checked, kBlocks);
    ASSERT_EQ(result->blocks_bad, 1u);
    ASSERT_EQ(result->bad.size(), 1u);
    EXPECT_EQ(result->bad[0].slot, slot);
    EXPECT_TRUE(absl::StartsWith(result->bad[0].reason, reason)) << result->bad[0].reason;
    ASSERT_EQ(reports.size(), 7u) << "20 blocks in batches of 3";
    for (size_t r = 1; r < reports.size(); ++r) {
      EXPECT_GT(reports[r].blocks_checked, reports[r - 1].blocks_checked);
    }
    EXPECT_EQ(reports.back().blocks_checked, kBlocks);
    const int bad = KeyIndex(result->bad[0].key);
    ASSERT_GE(bad, 0);
    for (uint32_t i = 0; i < kBlocks; ++i) {
      EXPECT_EQ(Present(i), static_cast<int>(i) != bad) << "block " << i;
    }
    EXPECT_EQ(store_->Stats().slots_used, kBlocks - 1);
    // A second scrub finds nothing more.
    auto again = store_->Scrub(ScrubOptions{8}, nullptr);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->blocks_total, kBlocks - 1);
    EXPECT_EQ(again->blocks_bad, 0u);
  }

  std::string state_dir_;
  StoreOptions options_;
  std::shared_ptr<io::MemoryDisk> disk_;
  io::MemoryBackend* backend_ = nullptr;  // owned by store_
  ManualClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceId ns_ = 0;
};

TEST_F(MaintenanceTest, ScrubOfAHealthyPoolReadsEveryHeaderAndObject) {
  Open();
  Store(0, kBlocks);
  auto result = store_->Scrub(ScrubOptions{}, nullptr);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->blocks_checked, kBlocks);
  EXPECT_EQ(result->blocks_bad, 0u);
  EXPECT_EQ(result->bytes_read, kBlocks * (pool::kSlotHeaderBytes + kObjects * kObjectLen));
  EXPECT_EQ(store_->Stats().verify_errors, 0u);
}

TEST_F(MaintenanceTest, ScrubFindsAndDropsExactlyTheBlockWithACorruptObject) {
  Open();
  Store(0, kBlocks);
  const pool::Location loc = options_.layout.ObjectLocation(7, 5);
  disk_->Corrupt(loc.file, loc.offset + 100, 1);
  ExpectOnlyBadSlot(7, "object checksum mismatch");
  EXPECT_EQ(store_->Stats().verify_errors, 1u);
}

TEST_F(MaintenanceTest, ScrubFindsACorruptSlotHeader) {
  Open();
  Store(0, kBlocks);
  const pool::Location loc = options_.layout.HeaderLocation(12);
  disk_->Corrupt(loc.file, loc.offset + 20, 1);
  ExpectOnlyBadSlot(12, "slot header");
}

TEST_F(MaintenanceTest, ScrubReadsTheSsdEvenWhenTheDramTierHoldsAGoodCopy) {
  Open(/*dram_bytes=*/kBlocks * kObjects * kFrame * 2);
  Store(0, kBlocks);
  const pool::Location loc = options_.layout.ObjectLocation(3, 0);
  disk_->Corrupt(loc.file, loc.offset, 1);
  ExpectOnlyBadSlot(3, "object checksum mismatch");
}

TEST_F(MaintenanceTest, ScrubCountsAReadErrorAsAnIoError) {
  Open();
  Store(0, kBlocks);
  disk_->FailNext(0, io::Op::kRead, 1, EIO);
  auto result = store_->Scrub(ScrubOptions{1}, nullptr);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->blocks_bad, 1u);
  EXPECT_TRUE(absl::StrContains(result->bad[0].reason, "I/O error")) << result->bad[0].reason;
  EXPECT_EQ(store_->Stats().io_errors, 1u);
}

TEST_F(MaintenanceTest, ScrubStopsWhenTheCallbackSaysSo) {
  Open();
  Store(0, kBlocks);
  int calls = 0;
  auto result = store_->Scrub(ScrubOptions{4}, [&](const ScrubProgress& p) {
    ++calls;
    return p.blocks_checked < 8;
  });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  EXPECT_EQ(calls, 2);
}

TEST_F(MaintenanceTest, FlushForWaitsForTheBacklogOrTimesOut) {
  Open();
  backend_->SetPaused(true);
  Store(0, 4, /*wait=*/false);
  EXPECT_EQ(store_->Stats().write_backlog_blocks, 4u);
  EXPECT_FALSE(store_->FlushFor(absl::Milliseconds(20))) << "writes are held by the backend";
  backend_->SetPaused(false);
  EXPECT_TRUE(store_->FlushFor(absl::Seconds(30)));
  EXPECT_EQ(store_->Stats().write_backlog_blocks, 0u);
  EXPECT_TRUE(Present(0));
}

}  // namespace
}  // namespace tutti::store

// The bounded write backlog (issue 10, section 3): past its bytes or its age, Capture refuses new
// blocks at once (kRejectedBacklog, answered as "full"), and accepts again once the writer drains.
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/io/memory_backend.h"
#include "daemon/store/block_store.h"
#include "daemon/store/store_test_util.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint64_t kBlockBytes = 2ull * kLayers * 4096;  // K and V of 2 KiB, 4 KiB frames

class WriteBacklogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = store::testing::FreshStateDir("backlog");
    auto layout = pool::PoolLayout::Compute(16ull << 20, 2, 4096, 2 * kLayers);
    ASSERT_TRUE(layout.ok()) << layout.status();
    options_.layout = *layout;
    options_.state_dir = state_dir_;
    options_.store_staging_bytes = 16 * kBlockBytes;
    options_.retrieve_staging_bytes = 1ull << 20;
    options_.write_batch_blocks = 4;
  }

  void TearDown() override {
    if (backend_ != nullptr) backend_->SetPaused(false);
    store_.reset();
  }

  void Open() {
    auto backend = io::MemoryBackend::Create(
        std::vector<uint64_t>(options_.layout.num_files(), options_.layout.file_bytes()));
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = backend->get();
    auto store = BlockStore::Open(options_, std::move(backend).value(), &clock_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
    auto ns = store_->RegisterNamespace(testing::TestNamespace(kLayers));
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
  }

  // Captures layers [begin, end) of block i (zeros); returns its outcome.
  CaptureOutcome Capture(uint32_t i, uint32_t begin = 0, uint32_t end = kLayers) {
    const Key key = testing::TestKey(i);
    auto out = store_->Capture(
        ns_, absl::MakeConstSpan(&key, 1), begin, end,
        [](absl::Span<const engine::CopyOp>) { return absl::OkStatus(); }, /*wait_durable=*/false);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? (*out)[0] : CaptureOutcome::kFailed;
  }

  std::string state_dir_;
  StoreOptions options_;
  ManualClock clock_{1000};
  io::MemoryBackend* backend_ = nullptr;  // owned by store_
  std::unique_ptr<BlockStore> store_;
  NamespaceId ns_ = 0;
};

TEST_F(WriteBacklogTest, PastTheByteBoundNewBlocksAreRefusedAtOnce) {
  options_.max_write_backlog_bytes = 2 * kBlockBytes;
  Open();
  backend_->SetPaused(true);  // the writer's pool writes wait: nothing becomes durable
  EXPECT_EQ(Capture(1, 0, 1), CaptureOutcome::kCaptured);  // begun before the bound is reached
  EXPECT_EQ(Capture(2), CaptureOutcome::kCaptured);
  EXPECT_EQ(Capture(3), CaptureOutcome::kCaptured);
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.write_backlog_blocks, 2u);
  EXPECT_EQ(st.write_backlog_bytes, 2 * kBlockBytes);
  EXPECT_EQ(Capture(4), CaptureOutcome::kRejectedBacklog) << "staging has room; the backlog not";
  EXPECT_EQ(Capture(1, 1, kLayers), CaptureOutcome::kCaptured) << "a block begun is finished";
  st = store_->Stats();
  EXPECT_EQ(st.write_backlog_blocks, 3u);
  EXPECT_EQ(st.store_rejected_backlog, 1u);
  EXPECT_EQ(st.store_rejected, 1u);
  EXPECT_LT(st.store_staging_used, st.store_staging_bytes / 2);

  backend_->SetPaused(false);
  store_->Flush();
  st = store_->Stats();
  EXPECT_EQ(st.write_backlog_blocks, 0u);
  EXPECT_EQ(st.write_backlog_bytes, 0u);
  EXPECT_EQ(st.blocks_stored, 3u);
  EXPECT_EQ(Capture(4), CaptureOutcome::kCaptured) << "accepted again once the writer drained";
}

TEST_F(WriteBacklogTest, PastTheAgeBoundNewBlocksAreRefused) {
  options_.max_write_backlog_age_ms = 10000;
  Open();
  backend_->SetPaused(true);
  EXPECT_EQ(Capture(1), CaptureOutcome::kCaptured);
  clock_.AdvanceMs(9999);
  EXPECT_EQ(Capture(2), CaptureOutcome::kCaptured) << "the oldest waited 9999 ms: within";
  EXPECT_EQ(store_->Stats().write_backlog_age_ms, 9999u);
  clock_.AdvanceMs(1);
  EXPECT_EQ(Capture(3), CaptureOutcome::kRejectedBacklog);
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.write_backlog_age_ms, 10000u);
  EXPECT_EQ(st.write_backlog_blocks, 2u);
  EXPECT_EQ(st.store_rejected_backlog, 1u);

  backend_->SetPaused(false);
  store_->Flush();
  EXPECT_EQ(store_->Stats().write_backlog_age_ms, 0u);
  EXPECT_EQ(Capture(3), CaptureOutcome::kCaptured);
}

TEST_F(WriteBacklogTest, BoundsSetAtRunTimeTakeAtTheNextCapture) {
  Open();
  backend_->SetPaused(true);
  EXPECT_EQ(Capture(1), CaptureOutcome::kCaptured);
  EXPECT_EQ(Capture(2), CaptureOutcome::kCaptured);
  ASSERT_TRUE(store_->SetWriteBacklogBounds(2 * kBlockBytes, 10000).ok());
  EXPECT_EQ(Capture(3), CaptureOutcome::kRejectedBacklog) << "the new byte bound holds";
  ASSERT_TRUE(store_->SetWriteBacklogBounds(0, 10000).ok());  // 0: store staging again
  EXPECT_EQ(Capture(3), CaptureOutcome::kCaptured);
  clock_.AdvanceMs(500);
  ASSERT_TRUE(store_->SetWriteBacklogBounds(0, 500).ok());
  EXPECT_EQ(Capture(4), CaptureOutcome::kRejectedBacklog) << "the new age bound holds";
  EXPECT_EQ(store_->SetWriteBacklogBounds(0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Capture(4), CaptureOutcome::kRejectedBacklog) << "a refused setting changes nothing";
  EXPECT_EQ(store_->Stats().store_rejected_backlog, 3u);
  backend_->SetPaused(false);
  store_->Flush();
}

TEST_F(WriteBacklogTest, DefaultByteBoundIsStoreStaging) {
  Open();
  backend_->SetPaused(true);
  uint32_t captured = 0;
  for (uint32_t i = 0; i < 16; ++i) captured += Capture(i) == CaptureOutcome::kCaptured;
  EXPECT_EQ(captured, 16u);
  EXPECT_EQ(Capture(16), CaptureOutcome::kRejectedFull);
  // Staging and backlog are full together; staging's refusal comes first (counted as before).
  EXPECT_EQ(store_->Stats().write_backlog_bytes, 16 * kBlockBytes);
  EXPECT_EQ(store_->Stats().store_rejected, 1u);
  EXPECT_EQ(store_->Stats().store_rejected_backlog, 0u);
}

TEST_F(WriteBacklogTest, PoolReadsAndWritesGoThroughTheScheduler) {
  Open();
  const Key key = testing::TestKey(7);
  auto out = store_->Capture(
      ns_, absl::MakeConstSpan(&key, 1), 0, kLayers,
      [](absl::Span<const engine::CopyOp>) { return absl::OkStatus(); }, /*wait_durable=*/true);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ((*out)[0], CaptureOutcome::kDurable);
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.io.reads_posted, 0u);
  EXPECT_GT(st.io.writes_emitted, 0u);
  EXPECT_EQ(st.io.writes_emitted, st.io.writes_posted);
  EXPECT_EQ(st.io.write_bytes, kBlockBytes + 4096) << "the objects and the slot header";
  ASSERT_EQ(store_->LookupAndPin(ns_, absl::MakeConstSpan(&key, 1)), 1u);
  ASSERT_TRUE(store_
                  ->Read(ns_, absl::MakeConstSpan(&key, 1), 0, kLayers,
                         [](const datapath::LayerObjects&) { return absl::OkStatus(); })
                  .ok());
  store_->Unpin(ns_, absl::MakeConstSpan(&key, 1));
  st = store_->Stats();
  EXPECT_EQ(st.io.reads_emitted, 2u * kLayers);
  EXPECT_EQ(st.io.read_bytes, kBlockBytes);
}

TEST_F(WriteBacklogTest, OpenRefusesANonPositiveAge) {
  options_.max_write_backlog_age_ms = 0;
  auto backend = io::MemoryBackend::Create(
      std::vector<uint64_t>(options_.layout.num_files(), options_.layout.file_bytes()));
  ASSERT_TRUE(backend.ok());
  auto store = BlockStore::Open(options_, std::move(backend).value(), &clock_);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("max_write_backlog_age_ms"), std::string::npos);
}

}  // namespace
}  // namespace tutti::store

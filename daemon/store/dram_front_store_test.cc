// The block store with pool.admission "dram_front": a block's first Store keeps it in the DRAM
// front only (kInDram: found, served from DRAM, nothing written or journaled); its second sight
// (a Lookup hit, or another Store while it is kept) writes it to the SSD through the normal write
// path, durable across a restart; blocks evicted from DRAM before then are dropped; a restart
// loses what is only in DRAM and serves nothing wrong.
#include <filesystem>
#include <string>

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
constexpr uint64_t kChunk = uint64_t{kObjects} * kFrame;  // one DRAM-front block

uint8_t ByteOf(const Key& key, uint32_t object, uint32_t i) {
  return static_cast<uint8_t>(key.bytes[0] + object * 3 + i);
}

class DramFrontStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = store::testing::FreshStateDir("dram_front");
    auto layout = pool::PoolLayout::Compute(8ull << 20, 2, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    options_.layout = *layout;
    options_.state_dir = state_dir_;
    options_.store_staging_bytes = 16 * kChunk;
    options_.retrieve_staging_bytes = 16 * kChunk;
    options_.write_batch_blocks = 8;
    options_.admission = "dram_front";
    options_.dram_bytes = 8 * kChunk;
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

  // A Capture of every layer of `keys` (engine block i holds key i's bytes).
  std::vector<CaptureOutcome> Store(const std::vector<Key>& keys, uint32_t begin = 0,
                                    uint32_t end = kLayers) {
    auto gather = [&keys](absl::Span<const engine::CopyOp> ops) {
      for (const engine::CopyOp& op : ops) {
        for (uint32_t i = 0; i < kObjectLen; ++i) op.staging[i] = ByteOf(keys[op.block], op.object, i);
      }
      return absl::OkStatus();
    };
    auto out = store_->Capture(ns_, keys, begin, end, gather, /*wait_durable=*/true);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<CaptureOutcome>{};
  }

  // Lookup (pins), then a Read of every layer checking each byte; returns the blocks served.
  uint32_t LookupAndRead(const std::vector<Key>& keys, bool unpin = true) {
    const uint32_t hits = store_->LookupAndPin(ns_, keys);
    if (hits == 0) return 0;
    const std::vector<Key> hit(keys.begin(), keys.begin() + hits);
    uint32_t served = 0, failed = 0;
    absl::Status s = store_->Read(ns_, hit, 0, kLayers, [&](const datapath::LayerObjects& got) {
      failed += got.failed_items.size();
      for (const engine::CopyOp& op : got.copies) {
        bool same = true;
        for (uint32_t i = 0; i < kObjectLen; ++i) same &= op.staging[i] == ByteOf(hit[op.block], op.object, i);
        EXPECT_TRUE(same) << "block " << op.block << " object " << op.object;
        served += got.layer == kLayers - 1 && op.object % 2 == 0;
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(failed, 0u);
    if (unpin) store_->Unpin(ns_, hit);
    return served;
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

TEST_F(DramFrontStoreTest, FirstSightIsKeptInDramOnlyAndALookupHitPromotesIt) {
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 4);
  store_->Flush();
  const uint64_t journal_before = JournalBytes();
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kInDram);
  store_->Flush();
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.admission, "dram_front");
  EXPECT_EQ(st.blocks_declined, 4u);
  EXPECT_EQ(st.front_kept, 4u);
  EXPECT_EQ(st.front_blocks, 4u);
  EXPECT_EQ(st.blocks_stored, 0u);
  EXPECT_EQ(st.bytes_written, 0u);
  EXPECT_EQ(st.slots_used, 0u);
  EXPECT_EQ(st.store_staging_used, 0u);
  EXPECT_EQ(st.dram_used, 4 * kChunk);
  EXPECT_EQ(JournalBytes(), journal_before);  // nothing journaled

  // The second sight: a Lookup finds them (in DRAM), a Read serves them from DRAM, and they
  // are queued for the SSD.
  std::vector<bool> in_dram;
  ASSERT_EQ(store_->LookupAndPin(ns_, keys, &in_dram), 4u);
  EXPECT_EQ(in_dram, std::vector<bool>(4, true));
  store_->Unpin(ns_, keys);
  store_->Flush();
  st = store_->Stats();
  EXPECT_EQ(st.front_promoted, 4u);
  EXPECT_EQ(st.blocks_stored, 4u);
  EXPECT_EQ(st.slots_used, 4u);
  EXPECT_EQ(st.front_blocks, 0u);  // exclusive: on the SSD, out of DRAM
  EXPECT_GT(JournalBytes(), journal_before);
  EXPECT_EQ(LookupAndRead(keys), 4u);  // now from the SSD, checksums verified
  EXPECT_EQ(store_->Stats().dram_hits, 0u);

  // Durable: a restart keeps them.
  ASSERT_TRUE(Open().ok());
  EXPECT_EQ(LookupAndRead(keys), 4u);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kAlreadyPresent);
}

TEST_F(DramFrontStoreTest, ReadsServeFromDramWhilePinnedAcrossThePromotion) {
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 3);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kInDram);
  EXPECT_EQ(LookupAndRead(keys, /*unpin=*/false), 3u);  // from DRAM; promotion queued
  EXPECT_EQ(store_->Stats().dram_hits, 3u);
  store_->Flush();  // promoted and published while pinned: the pins hold the SSD blocks now
  EXPECT_EQ(store_->Evict(ns_), std::make_pair(uint64_t{0}, uint64_t{3}));
  store_->Unpin(ns_, keys);
  EXPECT_EQ(store_->Evict(ns_), std::make_pair(uint64_t{3}, uint64_t{0}));
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 0u);
}

TEST_F(DramFrontStoreTest, ASecondStoreWhileKeptWritesIt) {
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 3);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kInDram);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.blocks_admitted, 3u);
  EXPECT_EQ(st.front_promoted, 3u);
  EXPECT_EQ(st.front_blocks, 0u);
  EXPECT_EQ(st.blocks_stored, 3u);
  ASSERT_TRUE(Open().ok());
  EXPECT_EQ(LookupAndRead(keys), 3u);
}

TEST_F(DramFrontStoreTest, BlocksEvictedFromDramBeforeASecondSightAreDropped) {
  options_.dram_bytes = 2 * kChunk;  // two blocks kept
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 4);
  for (const Key& k : keys) EXPECT_EQ(Store({k})[0], CaptureOutcome::kInDram);
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.front_kept, 4u);
  EXPECT_EQ(st.front_dropped, 2u);  // the two least recently kept
  EXPECT_EQ(st.front_blocks, 2u);
  EXPECT_EQ(store_->LookupAndPin(ns_, {keys[0]}), 0u);
  EXPECT_EQ(store_->LookupAndPin(ns_, {keys[1]}), 0u);
  // The ghost remembers them: their next Store is a second sight, written.
  EXPECT_EQ(Store({keys[0]})[0], CaptureOutcome::kDurable);
  EXPECT_EQ(LookupAndRead({keys[0]}), 1u);
}

TEST_F(DramFrontStoreTest, ARestartLosesDramOnlyBlocksAndServesNothingWrong) {
  ASSERT_TRUE(Open().ok());
  const auto durable = testing::TestKeys(0, 2);
  const auto dram_only = testing::TestKeys(10, 2);
  Store(durable);
  for (CaptureOutcome o : Store(durable)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  for (CaptureOutcome o : Store(dram_only)) EXPECT_EQ(o, CaptureOutcome::kInDram);
  ASSERT_TRUE(Open().ok());
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.slots_used, 2u);
  EXPECT_EQ(st.front_blocks, 0u);
  EXPECT_EQ(store_->LookupAndPin(ns_, dram_only), 0u);
  EXPECT_EQ(LookupAndRead(durable), 2u);  // every byte checked
  // The ghost lived in memory only: a first sight again.
  for (CaptureOutcome o : Store(dram_only)) EXPECT_EQ(o, CaptureOutcome::kInDram);
}

TEST_F(DramFrontStoreTest, ABlockStoredLayerByLayerIsKeptOnceComplete) {
  ASSERT_TRUE(Open().ok());
  const auto keys = testing::TestKeys(0, 2);
  for (CaptureOutcome o : Store(keys, 0, 2)) EXPECT_EQ(o, CaptureOutcome::kCaptured);
  for (CaptureOutcome o : Store(keys, 2, kLayers)) EXPECT_EQ(o, CaptureOutcome::kInDram);
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.front_kept, 2u);
  EXPECT_EQ(st.store_staging_used, 0u);  // its staging went back
  EXPECT_EQ(LookupAndRead(keys), 2u);     // the bytes, from DRAM
  store_->Flush();
  EXPECT_EQ(store_->Stats().blocks_stored, 2u);
}

TEST_F(DramFrontStoreTest, ARepeatedKeyInOneCallIsKeptOnce) {
  ASSERT_TRUE(Open().ok());
  const Key k = testing::TestKey(7);
  auto out = Store({k, k});
  EXPECT_EQ(out[0], CaptureOutcome::kInDram);
  EXPECT_EQ(out[1], CaptureOutcome::kInDram);
  EXPECT_EQ(store_->Stats().front_kept, 1u);
  EXPECT_EQ(LookupAndRead({k}), 1u);
}

TEST_F(DramFrontStoreTest, OpenRefusesItWithTheDramTierOff) {
  options_.dram_bytes = 0;
  const absl::Status s = Open();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pool.admission"), std::string::npos) << s;
  EXPECT_NE(s.message().find("dram.capacity_bytes"), std::string::npos) << s;
}

}  // namespace
}  // namespace tutti::store

// Where the writer puts the blocks of one store batch: consecutive slots, in batch order, whether
// the slots are free or come from evicting the least recently used blocks.
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/io/memory_backend.h"
#include "daemon/pool/slot_header.h"
#include "daemon/store/block_store.h"
#include "daemon/store/store_test_util.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint32_t kObjects = 2 * kLayers;
constexpr uint32_t kFrame = 4096;

class SlotAllocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = store::testing::FreshStateDir("slots");
    // 2 files of 4 MiB: 8 extents of 12 slots per file and group, 192 slots.
    auto layout = pool::PoolLayout::Compute(8ull << 20, 2, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    ASSERT_EQ(layout->num_slots(), 192u);
    testing::UseTestPool(&options_, *layout, state_dir_, 64, 32);
    disk_ = testing::TestDisk(options_.layout);
    ASSERT_NE(disk_, nullptr);
    auto store = BlockStore::Open(options_, io::MemoryBackend::CreateOn(disk_), &clock_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
    auto ns = store_->RegisterNamespace(testing::TestNamespace(kLayers));
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
  }

  // Stores `keys` in one Capture call (at most 32: staging holds 64 blocks) and waits.
  void Store(const std::vector<Key>& keys) {
    auto out = store_->Capture(
        ns_, keys, 0, kLayers,
        [](absl::Span<const engine::CopyOp> ops) {
          for (const engine::CopyOp& op : ops) op.staging[0] = static_cast<uint8_t>(op.block);
          return absl::OkStatus();
        },
        true);
    ASSERT_TRUE(out.ok()) << out.status();
    for (CaptureOutcome o : *out) ASSERT_EQ(o, CaptureOutcome::kDurable);
  }

  // The key whose header slot `slot` holds, read from the pool (through a backend of its own).
  Key KeyInSlot(uint64_t slot) {
    auto reader = io::MemoryBackend::CreateOn(disk_);
    io::AlignedBuffer page(pool::kSlotHeaderBytes);
    const pool::Location at = options_.layout.HeaderLocation(slot);
    io::IoRequest req{io::Op::kRead,
                      at.file,
                      at.offset,
                      page.data(),
                      static_cast<uint32_t>(pool::kSlotHeaderBytes),
                      0};
    reader->Execute(absl::MakeSpan(&req, 1));
    EXPECT_EQ(req.result, static_cast<int64_t>(pool::kSlotHeaderBytes));
    auto h = pool::DecodeSlotHeader(absl::MakeConstSpan(page.data(), pool::kSlotHeaderBytes));
    EXPECT_TRUE(h.ok()) << "slot " << slot << ": " << h.status();
    return h.ok() ? h->key : Key{};
  }

  std::string state_dir_;
  StoreOptions options_;
  std::shared_ptr<io::MemoryDisk> disk_;
  ManualClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceId ns_ = 0;
};

TEST_F(SlotAllocationTest, ABatchGetsConsecutiveFreeSlotsAfterScatteredReleases) {
  Store(testing::TestKeys(0, 32));
  Store(testing::TestKeys(32, 32));
  EXPECT_EQ(store_->Evict(ns_).first, 64u);  // frees slots 0..63 in the index's hash order
  const std::vector<Key> keys = testing::TestKeys(1000, 24);
  Store(keys);
  for (uint64_t s = 0; s < keys.size(); ++s) {
    EXPECT_EQ(KeyInSlot(s), keys[s]) << "block " << s << " not in slot " << s;
  }
}

TEST_F(SlotAllocationTest, EvictedSlotsAreUsedInOrderAndTheVictimsAreTheLeastRecentlyUsed) {
  for (uint32_t i = 0; i < 192; i += 32) Store(testing::TestKeys(i, 32));  // slot s holds key s
  // Use every block, the last stored first: the least recently used is now the one in slot 191.
  for (uint32_t i = 192; i > 0; --i) {
    const std::vector<Key> one = testing::TestKeys(i - 1, 1);
    ASSERT_EQ(store_->LookupAndPin(ns_, one), 1u);
    store_->Unpin(ns_, one);
  }
  const std::vector<Key> fresh = testing::TestKeys(5000, 8);
  Store(fresh);
  for (uint64_t i = 0; i < fresh.size(); ++i) {
    EXPECT_EQ(KeyInSlot(184 + i), fresh[i]) << "victims' slots 184..191, in batch order";
  }
  const std::vector<Key> kept = testing::TestKeys(0, 184), evicted = testing::TestKeys(184, 8);
  EXPECT_EQ(store_->LookupAndPin(ns_, kept), 184u);
  store_->Unpin(ns_, kept);
  for (const Key& k : evicted) EXPECT_EQ(store_->LookupAndPin(ns_, {k}), 0u);
  EXPECT_EQ(store_->Stats().evictions, 8u);
}

}  // namespace
}  // namespace tutti::store

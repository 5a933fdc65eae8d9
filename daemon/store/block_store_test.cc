#include "daemon/store/block_store.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "daemon/datapath/placing_verifier_fake.h"
#include "daemon/datapath/retrieve_transfer.h"
#include "daemon/io/memory_backend.h"
#include "daemon/store/store_test_util.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint32_t kObjects = 2 * kLayers;
constexpr uint32_t kObjectLen = 2048;  // 16 tokens x 1 head x 64 dim x 2 bytes: half a frame
constexpr uint32_t kFrame = 4096;

tutti::v1::Namespace TestNamespace(const std::string& model = "m") {
  return testing::TestNamespace(kLayers, 1, model);
}

Key K(uint32_t i) { return testing::TestKey(i); }

uint8_t ContentByte(const Key& key, uint32_t object, uint32_t offset) {
  return static_cast<uint8_t>(key.bytes[offset % 16] * 31 + object * 17 + offset / 16);
}

// Engine-side memory for the tests: the bytes each (key, object) must hold.
BlockStore::Gatherer FillFrom(absl::Span<const Key> keys) {
  std::vector<Key> copy(keys.begin(), keys.end());
  return [copy](absl::Span<const engine::CopyOp> ops) {
    for (const engine::CopyOp& op : ops) {
      for (uint32_t i = 0; i < kObjectLen; ++i)
        op.staging[i] = ContentByte(copy[op.block], op.object, i);
    }
    return absl::OkStatus();
  };
}

class BlockStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = store::testing::FreshStateDir("store");
    auto layout = pool::PoolLayout::Compute(capacity_, 2, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    testing::UseTestPool(&options_, *layout, state_dir_);
    disk_ = testing::TestDisk(options_.layout);
    ASSERT_NE(disk_, nullptr);
  }

  void Open() {
    store_.reset();
    backend_ = io::MemoryBackend::CreateOn(disk_).release();
    auto store = BlockStore::Open(options_, std::unique_ptr<io::IoBackend>(backend_), &clock_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
    auto ns = store_->RegisterNamespace(TestNamespace());
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
  }

  // Stores `keys` in calls of at most 32 blocks (staging holds 64).
  std::vector<CaptureOutcome> Store(absl::Span<const Key> keys, bool wait = true) {
    std::vector<CaptureOutcome> all;
    for (size_t i = 0; i < keys.size(); i += 32) {
      auto part = keys.subspan(i, 32);
      auto out = store_->Capture(ns_, part, 0, kLayers, FillFrom(part), wait);
      EXPECT_TRUE(out.ok()) << out.status();
      if (out.ok()) all.insert(all.end(), out->begin(), out->end());
    }
    return all;
  }

  // Reads every layer of `keys` (pinned) and checks each byte. Returns the
  // failed item indices.
  std::vector<uint32_t> ReadAndVerify(absl::Span<const Key> keys) {
    std::vector<uint32_t> failed;
    uint32_t next_layer = 0;
    absl::Status s = store_->Read(ns_, keys, 0, kLayers, [&](const datapath::LayerObjects& got) {
      const uint32_t layer = got.layer;
      const absl::Span<const engine::CopyOp> ops = got.copies;
      const absl::Span<const uint32_t> bad = got.failed_items;
      EXPECT_EQ(layer, next_layer++) << "layers arrive in order";
      failed.insert(failed.end(), bad.begin(), bad.end());
      for (const engine::CopyOp& op : ops) {
        EXPECT_EQ(op.object / 2, layer);
        for (uint32_t i = 0; i < kObjectLen; ++i) {
          if (op.staging[i] != ContentByte(keys[op.block], op.object, i)) {
            ADD_FAILURE() << "item " << op.block << " object " << op.object << " byte " << i;
            return absl::InternalError("mismatch");
          }
        }
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(next_layer, kLayers);
    return failed;
  }

  std::vector<Key> Keys(uint32_t first, uint32_t n) {
    std::vector<Key> keys;
    for (uint32_t i = first; i < first + n; ++i) keys.push_back(K(i));
    return keys;
  }

  uint64_t capacity_ = 8ull << 20;
  std::string state_dir_;
  StoreOptions options_;
  std::shared_ptr<io::MemoryDisk> disk_;
  io::MemoryBackend* backend_ = nullptr;  // owned by store_
  ManualClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceId ns_ = 0;
};

TEST_F(BlockStoreTest, StoredBlocksReadBackByteForByteLayerByLayer) {
  Open();
  auto keys = Keys(0, 20);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 20u);
  EXPECT_TRUE(ReadAndVerify(keys).empty());
  store_->Unpin(ns_, keys);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kAlreadyPresent);
  const StoreStats st = store_->Stats();
  EXPECT_EQ(st.blocks_stored, 20u);
  EXPECT_EQ(st.blocks_retrieved, 20u);
  EXPECT_EQ(st.verify_errors, 0u);
}

// Retrieves into GPU memory with layers staged there (StageReadsOnGpu; host memory stands in for
// the GPU and the fake for the GPU's verifier): every object reaches the engine from its place,
// checked. A verifier that does not place (the GPU's after a CUDA error) serves misses and the
// blocks stay; host-memory Retrieves keep working beside; and going back restores host staging.
TEST_F(BlockStoreTest, RetrievesIntoGpuMemoryStageLayersThroughBounceSlots) {
  options_.read_post_bytes = 2 * kFrame;  // bounce slots of two frames
  options_.max_read_bytes = 2 * kFrame;
  Open();
  auto keys = Keys(0, 12);
  for (CaptureOutcome o : Store(keys)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  const absl::Span<uint8_t> host = store_->retrieve_staging_region();
  std::vector<uint8_t> device_memory(host.size() + 4096);
  uint8_t* device = device_memory.data() +
                    (4096 - reinterpret_cast<uintptr_t>(device_memory.data()) % 4096) % 4096;
  datapath::PlacingVerifierFake placing(store_->cpu_verifier());
  EXPECT_EQ(store_->StageReadsOnGpu(absl::MakeSpan(device, host.size() / 2), &placing, 2).code(),
            absl::StatusCode::kInvalidArgument);  // smaller than the retrieve staging
  const absl::Status staged =
      store_->StageReadsOnGpu(absl::MakeSpan(device, host.size()), &placing, 2);
  ASSERT_TRUE(staged.ok()) << staged;
  EXPECT_NE(store_->reader(true), store_->reader(false));
  auto read = [&](bool into_gpu, int* served, int* bad) {
    EXPECT_EQ(store_->LookupAndPin(ns_, keys), keys.size());
    std::vector<uint32_t> failed;
    absl::Status s = datapath::ReadPrepared(
        datapath::RetrieveRequest{ns_, keys, 0, kLayers, {}}, store_.get(),
        store_->reader(into_gpu), [&](const datapath::LayerObjects& got) {
          failed.insert(failed.end(), got.failed_items.begin(), got.failed_items.end());
          for (const engine::CopyOp& op : got.copies) {
            ++*served;
            if (into_gpu) {
              EXPECT_EQ(op.device_copy, op.staging);
              EXPECT_TRUE(op.staging >= device && op.staging < device + host.size());
            }
            for (uint32_t i = 0; i < kObjectLen; ++i) {
              *bad += op.staging[i] != ContentByte(keys[op.block], op.object, i);
            }
          }
          return absl::OkStatus();
        });
    EXPECT_TRUE(s.ok()) << s;
    store_->Unpin(ns_, keys);
    return failed;
  };
  int served = 0, bad = 0;
  EXPECT_TRUE(read(true, &served, &bad).empty());
  EXPECT_EQ(served, 12 * static_cast<int>(kObjects));
  EXPECT_EQ(bad, 0);
  served = 0;
  EXPECT_TRUE(read(false, &served, &bad).empty());  // into host memory, beside
  EXPECT_EQ(served, 12 * static_cast<int>(kObjects));
  EXPECT_EQ(bad, 0);
  // The CPU's checks place nothing: misses, nothing retired, nothing counted as a bad block.
  store_->SetReadVerifier(nullptr);
  served = 0;
  EXPECT_EQ(read(true, &served, &bad).size(), keys.size());
  EXPECT_EQ(served, 0);
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), keys.size());
  store_->Unpin(ns_, keys);
  EXPECT_EQ(store_->Stats().verify_errors, 0u);
  EXPECT_EQ(store_->Stats().io_errors, 0u);
  ASSERT_TRUE(store_->StageReadsOnGpu({}, nullptr, 0).ok());
  EXPECT_EQ(store_->reader(true), store_->reader(false));
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), keys.size());
  EXPECT_TRUE(ReadAndVerify(keys).empty());
  store_->Unpin(ns_, keys);
  EXPECT_EQ(store_->Stats().blocks_retrieved, 12u * 3);
}

// Lookups and reads are counted per namespace too (StoreStats::namespaces), each in its own.
TEST_F(BlockStoreTest, HitsMissesAndRetrievesAreCountedPerNamespace) {
  Open();
  auto other = store_->RegisterNamespace(TestNamespace("other"));
  ASSERT_TRUE(other.ok()) << other.status();
  auto keys = Keys(0, 6);
  Store(keys);
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 6u);
  EXPECT_TRUE(ReadAndVerify(keys).empty());
  store_->Unpin(ns_, keys);
  EXPECT_EQ(store_->LookupAndPin(ns_, Keys(100, 2)), 0u);
  EXPECT_EQ(store_->LookupAndPin(*other, keys), 0u);
  const StoreStats st = store_->Stats();
  ASSERT_EQ(st.namespaces.size(), 2u);
  for (const NamespaceInfo& n : st.namespaces) {
    const bool mine = n.id == ns_;
    EXPECT_EQ(n.lookup_hits, mine ? 6u : 0u) << n.descriptor.model_id();
    EXPECT_EQ(n.lookup_misses, 1u) << n.descriptor.model_id();
    EXPECT_EQ(n.blocks_retrieved, mine ? 6u : 0u) << n.descriptor.model_id();
    EXPECT_EQ(n.dram_hits, 0u);
  }
  EXPECT_EQ(st.lookup_misses, 2u);
  EXPECT_EQ(st.lookup_hits, 6u);
  EXPECT_EQ(st.lookup_blocks, 6u + 2u + 6u) << "every key asked for, hit or not";
}

TEST_F(BlockStoreTest, LookupCountsLeadingHitsOnly) {
  Open();
  Store(Keys(0, 3));
  std::vector<Key> chain = {K(0), K(1), K(99), K(2)};
  EXPECT_EQ(store_->LookupAndPin(ns_, chain), 2u);
  store_->Unpin(ns_, absl::MakeSpan(chain).subspan(0, 2));
  tutti::v1::Namespace other = TestNamespace("other-model");
  auto other_ns = store_->RegisterNamespace(other);
  ASSERT_TRUE(other_ns.ok());
  EXPECT_NE(*other_ns, ns_);
  EXPECT_EQ(store_->LookupAndPin(*other_ns, chain), 0u) << "keys never cross namespaces";
}

TEST_F(BlockStoreTest, ReadOfUnpinnedBlockIsRefused) {
  Open();
  auto keys = Keys(0, 1);
  Store(keys);
  absl::Status s = store_->Read(ns_, keys, 0, kLayers,
                                [](const datapath::LayerObjects&) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
}

// Capture copies out of, and Read into, the engine blocks the caller names for each key; a count
// that does not match the keys is refused.
TEST_F(BlockStoreTest, EngineCopiesNameTheCallersEngineBlocks) {
  Open();
  auto keys = Keys(0, 2);
  const std::vector<uint32_t> blocks = {11, 5};
  std::set<uint32_t> gathered_from, read_into;
  auto out = store_->Capture(
      ns_, keys, 0, kLayers,
      [&](absl::Span<const engine::CopyOp> ops) {
        for (const engine::CopyOp& op : ops) {
          gathered_from.insert(op.block);
          const Key& key = keys[op.block == blocks[0] ? 0 : 1];
          for (uint32_t i = 0; i < kObjectLen; ++i) op.staging[i] = ContentByte(key, op.object, i);
        }
        return absl::OkStatus();
      },
      /*wait_durable=*/true, 0, absl::ZeroDuration(), blocks);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            (std::vector<CaptureOutcome>{CaptureOutcome::kDurable, CaptureOutcome::kDurable}));
  EXPECT_EQ(gathered_from, (std::set<uint32_t>{5, 11}));
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 2u);
  int bad_bytes = 0;
  absl::Status s = store_->Read(
      ns_, keys, 0, kLayers,
      [&](const datapath::LayerObjects& got) {
        for (const engine::CopyOp& op : got.copies) {
          read_into.insert(op.block);
          const Key& key = keys[op.block == blocks[0] ? 0 : 1];
          for (uint32_t i = 0; i < kObjectLen; ++i) {
            bad_bytes += op.staging[i] != ContentByte(key, op.object, i);
          }
        }
        return absl::OkStatus();
      },
      blocks);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(read_into, (std::set<uint32_t>{5, 11}));
  EXPECT_EQ(bad_bytes, 0);
  const std::vector<uint32_t> one = {3};
  s = store_->Read(
      ns_, keys, 0, kLayers, [](const datapath::LayerObjects&) { return absl::OkStatus(); }, one);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  store_->Unpin(ns_, keys);
  auto refused = store_->Capture(ns_, Keys(2, 2), 0, kLayers, FillFrom(Keys(2, 2)), false, 0,
                                 absl::ZeroDuration(), one);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BlockStoreTest, PartialCaptureBecomesVisibleOnlyWhenEveryLayerIsIn) {
  Open();
  auto keys = Keys(0, 2);
  auto first = store_->Capture(ns_, keys, 0, 2, FillFrom(keys), true);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)[0], CaptureOutcome::kCaptured);
  store_->Flush();
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 0u);
  auto second = store_->Capture(ns_, keys, 2, kLayers, FillFrom(keys), true);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)[1], CaptureOutcome::kDurable);
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 2u);
  EXPECT_TRUE(ReadAndVerify(keys).empty());
}

TEST_F(BlockStoreTest, BadLayerRangesAndOversizedNamespacesAreRejected) {
  Open();
  auto keys = Keys(0, 1);
  EXPECT_EQ(store_->Capture(ns_, keys, 2, 2, FillFrom(keys), false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Capture(ns_, keys, 0, kLayers + 1, FillFrom(keys), false).status().code(),
            absl::StatusCode::kInvalidArgument);
  tutti::v1::Namespace big = TestNamespace();
  big.mutable_layout()->set_num_layers(kLayers + 1);
  EXPECT_EQ(store_->RegisterNamespace(big).status().code(), absl::StatusCode::kFailedPrecondition);
  tutti::v1::Namespace zero = TestNamespace();
  zero.mutable_layout()->set_head_dim(0);
  EXPECT_EQ(store_->RegisterNamespace(zero).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(BlockStoreTest, RestartKeepsEveryCommittedBlock) {
  Open();
  auto keys = Keys(0, 30);
  Store(keys);
  Open();  // clean shutdown (checkpoint) and reopen on the same disk and state
           // dir
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 30u);
  EXPECT_TRUE(ReadAndVerify(keys).empty());
}

// More slots than the checkpoint copies under the store's lock at once (1024 by default), so
// checkpoints are written chunk by chunk: taken every 600 journal records while storing, then at
// shutdown.
class BigBlockStoreTest : public BlockStoreTest {
 protected:
  BigBlockStoreTest() { capacity_ = 96ull << 20; }

  void StoreCrashReopenAndVerify() {
    options_.checkpoint_every = 600;
    Open();
    auto keys = Keys(0, 2400);
    for (const CaptureOutcome& o : Store(keys)) ASSERT_EQ(o, CaptureOutcome::kDurable);
    // A power cut: recovery from the last running checkpoint plus the journal after it.
    disk_->PowerCut();
    store_.reset();
    disk_->Restart();
    Open();
    EXPECT_EQ(store_->LookupAndPin(ns_, keys), keys.size());
    store_->Unpin(ns_, keys);
    Open();  // clean shutdown: one checkpoint holds everything
    EXPECT_EQ(store_->LookupAndPin(ns_, keys), keys.size());
    for (size_t i = 0; i < keys.size(); i += 32) {
      EXPECT_TRUE(ReadAndVerify(absl::MakeConstSpan(keys).subspan(i, 32)).empty()) << i;
    }
  }
};

TEST_F(BigBlockStoreTest, CheckpointsInChunksKeepEveryBlock) { StoreCrashReopenAndVerify(); }

TEST_F(BigBlockStoreTest, CheckpointsUnderOneHoldKeepEveryBlock) {
  options_.checkpoint_chunk_slots = 0;
  StoreCrashReopenAndVerify();
}

TEST_F(BlockStoreTest, PowerCutLosesNoDurableBlockAndServesNoTornOne) {
  Open();
  auto durable = Keys(0, 24);
  Store(durable);
  // Captured but maybe not yet written when the power goes.
  auto in_flight = Keys(100, 24);
  Store(in_flight, /*wait=*/false);
  disk_->PowerCut();
  store_.reset();
  disk_->Restart(io::MemoryDisk::CrashMode::kTear, /*seed=*/7);
  Open();
  EXPECT_EQ(store_->LookupAndPin(ns_, durable), durable.size());
  EXPECT_TRUE(ReadAndVerify(durable).empty());
  for (const Key& k : in_flight) {
    std::vector<Key> one = {k};
    if (store_->LookupAndPin(ns_, one) == 1) {
      EXPECT_TRUE(ReadAndVerify(one).empty()) << "a block that is visible must verify";
    }
  }
}

TEST_F(BlockStoreTest, CorruptObjectIsReportedFailedCountedAndThenAMiss) {
  Open();
  auto keys = Keys(0, 1);
  Store(keys);
  // The first block lands in slot 0; corrupt its layer-1 V object on the media.
  const pool::Location loc = options_.layout.ObjectLocation(0, 3);
  disk_->Corrupt(loc.file, loc.offset + 100, 1);
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 1u);
  std::vector<uint32_t> failed = ReadAndVerify(keys);
  EXPECT_EQ(failed, std::vector<uint32_t>{0});
  store_->Unpin(ns_, keys);
  EXPECT_EQ(store_->Stats().verify_errors, 1u);
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 0u) << "a block that failed verification is a miss";
}

TEST_F(BlockStoreTest, ReadErrorsAndShortReadsFailOnlyTheBlocksHit) {
  Open();
  auto keys = Keys(0, 8);
  Store(keys);
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 8u);
  // One read fails: the blocks whose objects it carried fail (with extents, one read carries one
  // layer's objects of several blocks stored together), every other block is served.
  disk_->FailNext(0, io::Op::kRead, 1, EIO);
  const size_t failed = ReadAndVerify(keys).size();
  EXPECT_GE(failed, 1u);
  EXPECT_LE(failed, keys.size());
  EXPECT_EQ(store_->Stats().io_errors, failed);
  auto others = Keys(100, 8);
  Store(others);
  ASSERT_EQ(store_->LookupAndPin(ns_, others), 8u);
  disk_->ShortenNextReads(1, 1, 0);
  const size_t short_failed = ReadAndVerify(others).size();
  EXPECT_GE(short_failed, 1u);
  EXPECT_LE(short_failed, others.size());
  EXPECT_EQ(store_->Stats().io_errors, failed + short_failed);
}

TEST_F(BlockStoreTest, WriteErrorFailsTheBlockWithoutPublishingIt) {
  Open();
  disk_->FailNext(1, io::Op::kWrite, 1, ENOSPC);
  auto keys = Keys(0, 1);
  EXPECT_EQ(Store(keys)[0], CaptureOutcome::kFailed);
  EXPECT_EQ(store_->LookupAndPin(ns_, keys), 0u);
  EXPECT_EQ(Store(keys)[0], CaptureOutcome::kDurable) << "a later store of the key succeeds";
}

TEST_F(BlockStoreTest, CapacityIsAHardCapEvictingLeastRecentlyUsedButNeverPinned) {
  capacity_ = 4ull << 20;
  SetUp();
  Open();
  const uint64_t slots = options_.layout.num_slots();
  ASSERT_GT(slots, 4u);
  auto first = Keys(0, slots);
  Store(first);
  std::vector<Key> pinned = {first[0]};
  ASSERT_EQ(store_->LookupAndPin(ns_, pinned), 1u);
  auto more = Keys(1000, slots * 2);
  Store(more);
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.slots_used, slots);
  EXPECT_LE(st.slots_used * options_.layout.slot_bytes(), capacity_);
  EXPECT_EQ(store_->LookupAndPin(ns_, absl::MakeSpan(first).subspan(1, 1)), 0u) << "evicted";
  EXPECT_EQ(store_->LookupAndPin(ns_, pinned), 1u) << "pinned blocks stay";
  EXPECT_TRUE(ReadAndVerify(pinned).empty());
  store_->Unpin(ns_, pinned);
  store_->Unpin(ns_, pinned);
  Store(Keys(5000, slots));
  EXPECT_EQ(store_->LookupAndPin(ns_, pinned), 0u) << "released, then evicted";
  Open();  // evictions are journaled: they stay evicted after a restart
  EXPECT_EQ(store_->LookupAndPin(ns_, pinned), 0u);
  EXPECT_EQ(store_->LookupAndPin(ns_, Keys(5000, slots)), slots);
}

TEST_F(BlockStoreTest, FullStagingRejectsTheExcess) {
  options_.store_staging_bytes = 2 * kObjects * kFrame;  // two blocks
  Open();
  backend_->SetPaused(true);  // the writer cannot drain staging
  auto keys = Keys(0, 3);
  auto out = store_->Capture(ns_, keys, 0, kLayers, FillFrom(keys), false);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0], CaptureOutcome::kCaptured);
  EXPECT_EQ((*out)[1], CaptureOutcome::kCaptured);
  EXPECT_EQ((*out)[2], CaptureOutcome::kRejectedFull);
  backend_->SetPaused(false);
  store_->Flush();
  EXPECT_EQ(store_->LookupAndPin(ns_, absl::MakeSpan(keys).subspan(0, 2)), 2u);
  EXPECT_EQ(store_->Stats().store_rejected, 1u);
}

TEST_F(BlockStoreTest, EvictSkipsPinnedBlocks) {
  Open();
  auto keys = Keys(0, 5);
  Store(keys);
  ASSERT_EQ(store_->LookupAndPin(ns_, absl::MakeSpan(keys).subspan(0, 1)), 1u);
  auto [evicted, skipped] = store_->Evict(0);
  EXPECT_EQ(evicted, 4u);
  EXPECT_EQ(skipped, 1u);
  EXPECT_EQ(store_->Stats().slots_used, 1u);
}

TEST_F(BlockStoreTest, DramTierServesHitsAndSsdServesAfterRestart) {
  options_.dram_bytes = 1 << 20;
  Open();  // reads the first slot headers (the index is empty)
  const uint64_t reads_at_open = disk_->counts(0).reads + disk_->counts(1).reads;
  auto keys = Keys(0, 6);
  Store(keys);
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 6u);
  EXPECT_TRUE(ReadAndVerify(keys).empty());
  EXPECT_EQ(store_->Stats().dram_hits, 6u);
  const uint64_t reads_before = disk_->counts(0).reads + disk_->counts(1).reads;
  EXPECT_EQ(reads_before, reads_at_open) << "DRAM hits do not touch the pool";
  Open();
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 6u);
  EXPECT_TRUE(ReadAndVerify(keys).empty());
  EXPECT_EQ(store_->Stats().dram_hits, 0u);
}

// One pool file: a block's K and V of a layer lie in adjacent frames and are read in one I/O.
class OneFileBlockStoreTest : public BlockStoreTest {
 protected:
  void SetUp() override {
    BlockStoreTest::SetUp();
    // One slot per extent group: a slot's objects follow each other (pool format 1's layout).
    auto layout = pool::PoolLayout::Compute(capacity_, 1, kFrame, kObjects, /*extent_slots=*/1);
    ASSERT_TRUE(layout.ok()) << layout.status();
    options_.layout = *layout;
    disk_ = testing::TestDisk(options_.layout);
    ASSERT_NE(disk_, nullptr);
  }
};

TEST_F(OneFileBlockStoreTest, AdjacentObjectsAreReadInOneIoAndCounted) {
  Open();
  auto keys = Keys(0, 20);
  Store(keys);
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 20u);
  EXPECT_TRUE(ReadAndVerify(keys).empty());
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.read_ios, 20u * kLayers);
  EXPECT_EQ(st.read_objects, 20u * kObjects);
  EXPECT_EQ(st.read_merged_ios, 20u * kLayers);
  EXPECT_EQ(st.read_io_bytes, 20u * kObjects * kFrame);
  store_->Unpin(ns_, keys);
  // max_read_bytes of one frame: one I/O per object again.
  options_.max_read_bytes = kFrame;
  Open();
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 20u);
  EXPECT_TRUE(ReadAndVerify(keys).empty());
  st = store_->Stats();
  EXPECT_EQ(st.read_ios, 20u * kObjects);
  EXPECT_EQ(st.read_merged_ios, 0u);
}

// A merged read cut short serves nothing of the block it did not cover; that block is counted,
// reported failed and leaves the index.
TEST_F(OneFileBlockStoreTest, ShortMergedReadFailsTheBlockItDidNotCover) {
  Open();
  auto keys = Keys(0, 4);
  Store(keys);
  ASSERT_EQ(store_->LookupAndPin(ns_, keys), 4u);
  disk_->ShortenNextReads(0, 1, kFrame);  // the first I/O of layer 0 brings K but not V
  std::vector<uint32_t> failed = ReadAndVerify(keys);
  ASSERT_EQ(failed.size(), 1u);
  store_->Unpin(ns_, keys);
  EXPECT_EQ(store_->Stats().io_errors, 1u);
  uint32_t hits = 0;
  for (const Key& k : keys) {
    const uint32_t hit = store_->LookupAndPin(ns_, absl::MakeConstSpan(&k, 1));
    if (hit) store_->Unpin(ns_, absl::MakeConstSpan(&k, 1));
    hits += hit;
    if (k == keys[failed[0]]) EXPECT_EQ(hit, 0u);
  }
  EXPECT_EQ(hits, 3u);
}

TEST_F(BlockStoreTest, MaxReadBytesMustBeAMultipleOf4096) {
  options_.max_read_bytes = 6000;
  auto store = BlockStore::Open(options_, io::MemoryBackend::CreateOn(disk_), &clock_);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("max_read_bytes"), std::string::npos);
}

}  // namespace
}  // namespace tutti::store

namespace tutti::store {
namespace {

TEST_F(BlockStoreTest, LookupSaysWhichHitsAreInTheDramTierAndThePriorsReachTheMeter) {
  options_.dram_bytes = 1 << 20;
  options_.bandwidth.ssd_prior_bytes_per_sec = 3e9;
  options_.bandwidth.dram_prior_bytes_per_sec = 40e9;
  Open();
  EXPECT_EQ(store_->read_bandwidth().BytesPerSecond(datapath::Tier::kSsd), 3e9);
  EXPECT_EQ(store_->read_bandwidth().BytesPerSecond(datapath::Tier::kDram), 40e9);
  auto keys = Keys(0, 3);
  Store(keys);
  std::vector<bool> in_dram = {false};  // replaced, not appended to
  ASSERT_EQ(store_->LookupAndPin(ns_, keys, &in_dram), 3u);
  EXPECT_EQ(in_dram, std::vector<bool>(3, true));
  Open();  // the DRAM tier starts empty
  ASSERT_EQ(store_->LookupAndPin(ns_, keys, &in_dram), 3u);
  EXPECT_EQ(in_dram, std::vector<bool>(3, false));
}

}  // namespace
}  // namespace tutti::store

// Store checksums computed with the gather (BlockStore::SetGatherChecksums, LayerCopier::Gather)
// on a HostDevice (gpu/host_device.h), so CI runs the whole path without a GPU: an engine's blocks
// in "device" memory, gathered by the layer copier into the store's staging with the hash kernel
// (libxxhash on the host device) computing each object's checksum, and the writer putting them in
// the slot headers. Every header written must carry exactly pool::ObjectChecksum of the bytes
// written in its slot, with the sums from the gather or, where the hash failed or was not asked
// for, from the writer; and the blocks must read back.
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "daemon/gpu/cuda_ipc_memory.h"
#include "daemon/gpu/layer_copier.h"
#include "daemon/gpu/testing/kv_layout.h"
#include "daemon/io/memory_backend.h"
#include "daemon/pool/slot_header.h"
#include "daemon/store/block_store.h"
#include "daemon/store/store_test_util.h"
#include "gpu/host_device.h"
#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

using Op = HostDevice::Op;
using store::CaptureOutcome;

constexpr uint32_t kLayers = 4, kParts = 2, kObjects = kLayers * kParts;
constexpr uint32_t kFrame = 4096;
constexpr uint32_t kEngineBlocks = 64;

uint8_t EngineByte(uint32_t block, uint32_t object, uint32_t i) {
  return static_cast<uint8_t>(block * 29 + object * 7 + i * 13 + (i >> 8));
}

class StoreChecksumsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    object_len_ = 16 * 64 * 2 * kv_heads_;
    state_dir_ = store::testing::FreshStateDir("gather_sums");
    auto layout = pool::PoolLayout::Compute(8ull << 20, 2, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    store::testing::UseTestPool(&options_, *layout, state_dir_);
    disk_ = store::testing::TestDisk(options_.layout);
    ASSERT_NE(disk_, nullptr);
    auto s = store::BlockStore::Open(options_, io::MemoryBackend::CreateOn(disk_), &clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(s).value();
    auto ns = store_->RegisterNamespace(store::testing::TestNamespace(kLayers, kv_heads_));
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
    // The engine: separate K and V tensors per layer, in device memory.
    kv_ =
        testing::MakeKvLayout(testing::KvFormat::kSeparateKv, kLayers, kEngineBlocks, object_len_);
    ASSERT_EQ(kv_.layout.placements.size(), kObjects);
    for (uint64_t size : kv_.region_sizes) {
      auto p = device_.Allocate(size, "region");
      ASSERT_TRUE(p.ok());
      regions_.push_back(*p);
      local_.push_back({*p, size});
    }
    for (uint32_t b = 0; b < kEngineBlocks; ++b) {
      for (uint32_t j = 0; j < kObjects; ++j) {
        const engine::ObjectPlacement& pl = kv_.layout.placements[j];
        uint8_t* obj = static_cast<uint8_t*>(regions_[pl.region]) + pl.offset + b * pl.block_stride;
        for (uint32_t i = 0; i < object_len_; ++i) obj[i] = EngineByte(b, j, i);
      }
    }
    // The store's staging, registered as tuttid registers it (cudaHostRegister).
    const absl::Span<uint8_t> staging = store_->staging_region();
    staging_ = staging.data();
    device_.RegisterHost(staging.data(), staging.size());
    const std::vector<StagingRegion> registered = {
        {staging.data(), staging.size(), staging.data()}};
    LayerCopier::Options o;
    o.mode = LayerCopier::Mode::kAuto;  // the default: gathers by the copy engines
    o.gpu_staging_bytes = 8ull << 20;
    auto copier = LayerCopier::Create(o, &device_, registered);
    ASSERT_TRUE(copier.ok()) << copier.status();
    copier_ = std::move(copier).value();
    auto memory =
        CudaIpcMemory::WrapLocal(kv_.layout, local_, copier_->staging_regions(), &device_);
    ASSERT_TRUE(memory.ok()) << memory.status();
    memory_ = std::move(memory).value();
  }
  void TearDown() override {
    store_.reset();  // writes what is queued
    memory_.reset();
    copier_.reset();
    for (void* p : regions_) device_.Free(p);
    device_.UnregisterHost(staging_);
    std::filesystem::remove_all(state_dir_);
  }

  // Captures layers [begin, end) of keys first .. first + n - 1 from engine blocks
  // engine_stride_ * i + 1.
  std::vector<CaptureOutcome> Capture(uint32_t first, uint32_t n, uint32_t begin = 0,
                                      uint32_t end = kLayers, bool wait = true) {
    const std::vector<Key> keys = store::testing::TestKeys(first, n);
    std::vector<uint32_t> blocks;
    for (uint32_t i = first; i < first + n; ++i) blocks.push_back(EngineBlock(i));
    auto gather = [this](absl::Span<const engine::CopyOp> ops) {
      return copier_->Gather(memory_.get(), ops);
    };
    auto out =
        store_->Capture(ns_, keys, begin, end, gather, wait, 0, absl::ZeroDuration(), blocks);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<CaptureOutcome>();
  }
  uint32_t EngineBlock(uint32_t key) const { return (engine_stride_ * key + 1) % kEngineBlocks; }

  // Every slot header in the pool: each must carry, per object, pool::ObjectChecksum of the bytes
  // in its frame, and those bytes must be the engine block's. Returns how many blocks it checked.
  uint32_t CheckHeaders(uint32_t keys, bool check_content = true) {
    uint32_t found = 0;
    for (uint64_t slot = 0; slot < options_.layout.num_slots(); ++slot) {
      const pool::Location hl = options_.layout.HeaderLocation(slot);
      const std::string page = disk_->Peek(hl.file, hl.offset, pool::kSlotHeaderBytes);
      auto h = pool::DecodeSlotHeader(
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(page.data()), page.size()));
      if (!h.ok()) continue;
      uint32_t key = keys;
      for (uint32_t k = 0; k < keys; ++k) {
        if (store::testing::TestKey(k) == h->key) key = k;
      }
      EXPECT_LT(key, keys) << "slot " << slot << ": a block of another key";
      if (key == keys) continue;
      ++found;
      EXPECT_EQ(h->ns, ns_);
      EXPECT_EQ(h->object_len, object_len_);
      EXPECT_EQ(h->checksums.size(), kObjects);
      if (h->checksums.size() != kObjects) continue;
      for (uint32_t j = 0; j < kObjects; ++j) {
        const pool::Location ol = options_.layout.ObjectLocation(slot, j);
        const std::string bytes = disk_->Peek(ol.file, ol.offset, object_len_);
        EXPECT_EQ(h->checksums[j],
                  pool::ObjectChecksum(ns_, h->key, h->epoch, j, bytes.data(), object_len_))
            << "slot " << slot << " object " << j;
        for (uint32_t i = 0; check_content && i < object_len_; ++i) {
          if (static_cast<uint8_t>(bytes[i]) != EngineByte(EngineBlock(key), j, i)) {
            ADD_FAILURE() << "slot " << slot << " object " << j << " byte " << i;
            break;
          }
        }
      }
    }
    return found;
  }

  // Reads keys 0 .. n - 1 back (every object verified against the index's checksums).
  void ExpectServed(uint32_t n) {
    const std::vector<Key> keys = store::testing::TestKeys(0, n);
    ASSERT_EQ(store_->LookupAndPin(ns_, keys), n);
    uint64_t objects = 0;
    absl::Status s = store_->Read(ns_, keys, 0, kLayers, [&](const datapath::LayerObjects& got) {
      EXPECT_TRUE(got.failed_items.empty()) << "layer " << got.layer;
      for (const engine::CopyOp& op : got.copies) {
        ++objects;
        for (uint32_t i = 0; i < object_len_; ++i) {
          if (op.staging[i] != EngineByte(EngineBlock(op.block), op.object, i)) {
            return absl::InternalError(absl::StrCat("key ", op.block, " object ", op.object));
          }
        }
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(objects, uint64_t{n} * kObjects);
    store_->Unpin(ns_, keys);
  }

  // Set before SetUp (a derived fixture's constructor): the namespace's KV heads, and so each
  // object's bytes (store::testing::TestNamespace: 16 tokens x 64 x 2 bytes a head), 2 KiB by
  // default, half a 4 KiB frame.
  uint32_t kv_heads_ = 1;
  uint32_t object_len_ = 0;     // SetUp: from kv_heads_
  uint32_t engine_stride_ = 2;  // engine blocks 1, 3, 5, ...: no two objects adjacent there
  std::string state_dir_;
  store::StoreOptions options_;
  std::shared_ptr<io::MemoryDisk> disk_;
  ManualClock clock_;
  HostDevice device_;
  std::unique_ptr<store::BlockStore> store_;
  NamespaceId ns_ = 0;
  testing::KvLayout kv_;
  std::vector<void*> regions_;
  std::vector<LocalRegion> local_;
  void* staging_ = nullptr;
  std::unique_ptr<LayerCopier> copier_;
  std::unique_ptr<CudaIpcMemory> memory_;
};

// Objects that fill their 4 KiB frames, as a Llama-shaped model's 32 KiB objects do.
class StoreChecksumsFullFramesTest : public StoreChecksumsTest {
 protected:
  StoreChecksumsFullFramesTest() { kv_heads_ = 2; }
};

// Consecutive engine blocks: object j of neighbouring blocks lies side by side in the engine and
// lands in adjacent staging frames (a run's interleaved frames), so the copy engines get runs of
// several objects (gpu/copy_runs.h); every byte must still land in its own slot and read back.
TEST_F(StoreChecksumsFullFramesTest, GatherOfConsecutiveBlocksGoesInRunsAndLandsByteForByte) {
  engine_stride_ = 1;
  store_->SetGatherChecksums(true);
  for (CaptureOutcome o : Capture(0, 16)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  EXPECT_EQ(device_.copy_engine_objects(), 16u * kObjects);
  EXPECT_LT(device_.copy_engine_runs(), device_.copy_engine_objects() / 2)
      << "neighbouring blocks' objects were copied one by one";
  EXPECT_EQ(CheckHeaders(16), 16u);
  ExpectServed(16);
}

TEST_F(StoreChecksumsTest, HeadersCarryTheGathersChecksumsOfTheBytesWritten) {
  store_->SetGatherChecksums(true);
  for (CaptureOutcome o : Capture(0, 12)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  // A block captured in two calls of two layers each: both calls' sums are used.
  for (CaptureOutcome o : Capture(12, 4, 0, 2, false)) EXPECT_EQ(o, CaptureOutcome::kCaptured);
  for (CaptureOutcome o : Capture(12, 4, 2, kLayers)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  store::StoreStats st = store_->Stats();
  EXPECT_EQ(st.write_objects_summed_at_gather, 16u * kObjects);
  EXPECT_EQ(st.write_objects_summed_by_writer, 0u) << "the writer computed none";
  EXPECT_EQ(device_.count(Op::kLaunchHash), 3u);
  EXPECT_EQ(CheckHeaders(16), 16u);
  ExpectServed(16);
}

TEST_F(StoreChecksumsTest, AFailedHashFallsBackToTheWritersChecksums) {
  store_->SetGatherChecksums(true);
  device_.FailOp(Op::kLaunchHash, 0, absl::InternalError("cudaErrorLaunchFailure (injected)"));
  for (CaptureOutcome o : Capture(0, 8)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  store::StoreStats st = store_->Stats();
  EXPECT_EQ(st.write_objects_summed_at_gather, 0u);
  EXPECT_EQ(st.write_objects_summed_by_writer, 8u * kObjects);
  EXPECT_EQ(copier_->counters().sum_failures, 1u);
  // The next call's hash runs again.
  for (CaptureOutcome o : Capture(8, 8)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  st = store_->Stats();
  EXPECT_EQ(st.write_objects_summed_at_gather, 8u * kObjects);
  EXPECT_EQ(st.write_objects_summed_by_writer, 8u * kObjects);
  EXPECT_EQ(CheckHeaders(16), 16u);
  ExpectServed(16);
}

// Two copies into one block at once (here a key twice in one call, from two engine blocks): which
// lands last is not known to the store, so the writer computes that block's checksums from its
// staging, and the header matches whichever bytes were written.
TEST_F(StoreChecksumsTest, ABlockCopiedTwiceAtOnceIsChecksummedByTheWriter) {
  store_->SetGatherChecksums(true);
  const std::vector<Key> keys = {store::testing::TestKey(0), store::testing::TestKey(0),
                                 store::testing::TestKey(1)};
  const std::vector<uint32_t> blocks = {EngineBlock(0), EngineBlock(5), EngineBlock(1)};
  auto gather = [this](absl::Span<const engine::CopyOp> ops) {
    return copier_->Gather(memory_.get(), ops);
  };
  auto out = store_->Capture(ns_, keys, 0, kLayers, gather, true, 0, absl::ZeroDuration(), blocks);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[2], CaptureOutcome::kDurable);
  store::StoreStats st = store_->Stats();
  EXPECT_EQ(st.write_objects_summed_at_gather, kObjects) << "key 1's";
  EXPECT_EQ(st.write_objects_summed_by_writer, kObjects) << "key 0's";
  EXPECT_EQ(CheckHeaders(2, /*check_content=*/false), 2u);
  const std::vector<Key> both = store::testing::TestKeys(0, 2);
  ASSERT_EQ(store_->LookupAndPin(ns_, both), 2u);
  absl::Status s = store_->Read(ns_, both, 0, kLayers, [&](const datapath::LayerObjects& got) {
    EXPECT_TRUE(got.failed_items.empty()) << "layer " << got.layer;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  store_->Unpin(ns_, both);
}

TEST_F(StoreChecksumsTest, OffTheWriterComputesEveryChecksum) {
  for (CaptureOutcome o : Capture(0, 8)) EXPECT_EQ(o, CaptureOutcome::kDurable);
  store::StoreStats st = store_->Stats();
  EXPECT_EQ(st.write_objects_summed_at_gather, 0u);
  EXPECT_EQ(st.write_objects_summed_by_writer, 8u * kObjects);
  EXPECT_EQ(device_.count(Op::kLaunchHash), 0u) << "no sum was asked for";
  EXPECT_EQ(CheckHeaders(8), 8u);
  ExpectServed(8);
}

}  // namespace
}  // namespace tutti::gpu

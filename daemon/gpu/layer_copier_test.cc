#include "daemon/gpu/layer_copier.h"

#include <cuda_runtime.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "daemon/gpu/testing/kv_layout.h"
#include "gpu/pinned.h"
#include "gpu/testing/test_util.h"
#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

using testing::KvFormat;

constexpr uint8_t kPoison = 0x5a;

// The engine's regions of `kv` in device memory, every byte kPoison.
void AllocatePoisoned(const testing::KvLayout& kv, std::vector<void*>* regions,
                      std::vector<LocalRegion>* local) {
  for (uint64_t size : kv.region_sizes) {
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, size), cudaSuccess);
    ASSERT_EQ(cudaMemset(p, kPoison, size), cudaSuccess);
    regions->push_back(p);
    local->push_back({p, size});
  }
}

struct Case {
  LayerCopier::Mode mode;
  bool registered;  // staging in registered (pinned) memory, or heap memory like the DRAM tier
  uint64_t gpu_bytes;
  uint32_t bounce_threads = 4;
  // Staging laid out as the DRAM tier holds blocks: one chunk per block (all its layers' objects),
  // chunks at a constant distance with a hole after every seventh, so strided groups form and
  // break. Otherwise the objects follow each other with a 4 KiB gap after every third.
  bool chunked = false;
  uint64_t round_bytes = 0;
  bool strided = true;
  bool overlap = false;  // both calls LayerCopier::Wait::kPrevious, then Drain
  // kAuto: 0, every timed scatter kernel counts as slow, so the call after one goes by
  // copy engine.
  double auto_slow = 4;
  // Every other op carries a device copy of its object (CopyOp::device_copy, as a GPU verifier's
  // mirror leaves it) while its host staging is overwritten: the engine must get the device copy.
  bool device_copies = false;
};

class LayerCopierTest : public ::testing::TestWithParam<Case> {};

// Scatters one layer of `used` random blocks and checks every engine byte: copied objects equal
// their staging, everything else still poisoned, and the ready word written after.
TEST_P(LayerCopierTest, ScattersLayerExactlyAndSignals) {
  TUTTI_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  constexpr uint32_t kLayers = 3, kBlocks = 96, kUsed = 40, kObj = 64 * 1024, kLayer = 1;
  const testing::KvLayout kv = testing::MakeKvLayout(KvFormat::kFusedKv, kLayers, kBlocks, kObj);
  auto io = IoStream::Create({0, 8, 0});
  ASSERT_TRUE(io.ok()) << io.status();

  std::vector<void*> regions;
  std::vector<LocalRegion> local;
  AllocatePoisoned(kv, &regions, &local);
  if (HasFatalFailure()) return;
  // Staging with a 4 KiB gap after every third object, so runs break and merge.
  const uint64_t chunk = uint64_t{kLayers} * 2 * kObj;
  const uint64_t staging_bytes =
      c.chunked ? (kUsed + kUsed / 7 + 1) * chunk : uint64_t{kUsed} * 2 * (kObj + 4096);
  std::unique_ptr<PinnedRegion> pinned;
  std::vector<uint8_t> heap;
  uint8_t* base = nullptr;
  if (c.registered) {
    auto p = PinnedRegion::Allocate(staging_bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    pinned = std::move(*p);
    base = pinned->host();
  } else {
    heap.resize(staging_bytes + 16);
    base = heap.data() + (16 - reinterpret_cast<uintptr_t>(heap.data()) % 16) % 16;
  }
  std::vector<engine::CopyOp> ops;
  uint8_t* next = base;
  const std::vector<uint32_t> blocks = testing::RandomBlocks(7, kUsed, kBlocks);
  for (uint32_t i = 0; i < kUsed; ++i) {
    for (uint32_t p = 0; p < 2; ++p) {
      const uint32_t obj = kLayer * 2 + p;
      if (c.chunked) next = base + (i + i / 7) * chunk + uint64_t{obj} * kObj;
      testing::FillObject(7, blocks[i], obj, next, kObj);
      ops.push_back({blocks[i], obj, next});
      next += kObj + ((i * 2 + p) % 3 == 2 ? 4096 : 0);
    }
  }
  std::vector<std::vector<uint8_t>> originals;
  for (const engine::CopyOp& op : ops) originals.emplace_back(op.staging, op.staging + kObj);
  uint8_t* device_copies = nullptr;
  if (c.device_copies) {
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device_copies), ops.size() * kObj),
              cudaSuccess);
    for (size_t i = 0; i < ops.size(); i += 2) {
      uint8_t* d = device_copies + i * kObj;
      ASSERT_EQ(cudaMemcpy(d, ops[i].staging, kObj, cudaMemcpyHostToDevice), cudaSuccess);
      std::memset(ops[i].staging, 0xee, kObj);  // the host bytes must not be what lands
      ops[i].device_copy = d;
    }
  }
  std::vector<StagingRegion> reg;
  if (pinned) reg.push_back(pinned->staging());
  LayerCopier::Options options{c.mode, c.gpu_bytes, c.bounce_threads, c.round_bytes, c.strided};
  options.auto_slow_factor = c.auto_slow;
  auto copier = LayerCopier::Create(options, io->get(), reg);
  ASSERT_TRUE(copier.ok()) << copier.status();
  auto mem = CudaIpcMemory::WrapLocal(kv.layout, local, (*copier)->staging_regions(), io->get());
  ASSERT_TRUE(mem.ok()) << mem.status();
  auto words_array = ReadyWordArray::Create(0, kLayers + 1);
  ASSERT_TRUE(words_array.ok()) << words_array.status();
  auto words = ReadyWords::WrapLocal((*words_array)->word(0), kLayers + 1, io->get());
  ASSERT_TRUE(words.ok()) << words.status();

  // Twice, so every slot is used again (its words and bounce buffer recycled).
  const auto wait = c.overlap ? LayerCopier::Wait::kPrevious : LayerCopier::Wait::kLanded;
  ASSERT_TRUE((*copier)->ScatterLayer(mem->get(), ops, words->get(), kLayer, 76, wait).ok());
  ASSERT_TRUE((*copier)->ScatterLayer(mem->get(), ops, words->get(), kLayer, 77, wait).ok());
  ASSERT_TRUE((*copier)->Drain().ok());
  EXPECT_EQ((*copier)->counters().layers, 2u);
  if (c.mode == LayerCopier::Mode::kCopyEngine) {
    EXPECT_EQ((*copier)->counters().copy_engine_layers, 2u);
  }
  if (c.mode == LayerCopier::Mode::kAuto) {
    EXPECT_GT((*copier)->idle_kernel_us(1 << 20), 0.0);
    // The first call's kernel is timed; the second call reads it (overlapped: only if it has run).
    if (c.auto_slow >= 1) {
      EXPECT_EQ((*copier)->counters().copy_engine_layers, 0u);
    } else if (!c.overlap) {
      EXPECT_EQ((*copier)->counters().copy_engine_layers, 1u);
    }
  }
  uint32_t word = 0;
  ASSERT_EQ(cudaMemcpy(&word, (*words_array)->word(kLayer), 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(word, 77u);

  // Expected layer-1 region content.
  std::vector<uint8_t> expect(kv.region_sizes[kLayer], kPoison);
  for (size_t i = 0; i < ops.size(); ++i) {
    const engine::ObjectPlacement& pl = kv.layout.placements[ops[i].object];
    std::memcpy(expect.data() + pl.offset + uint64_t{ops[i].block} * pl.block_stride,
                originals[i].data(), kObj);
  }
  for (uint32_t r = 0; r < kLayers; ++r) {
    std::vector<uint8_t> got(kv.region_sizes[r]);
    ASSERT_EQ(cudaMemcpy(got.data(), regions[r], got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    if (r == kLayer) {
      EXPECT_TRUE(got == expect) << "layer " << r << " differs";
    } else {
      EXPECT_EQ(std::count(got.begin(), got.end(), kPoison), static_cast<long>(got.size()))
          << "layer " << r << " was touched";
    }
  }
  mem->reset();
  for (void* p : regions) cudaFree(p);
  cudaFree(device_copies);
}

INSTANTIATE_TEST_SUITE_P(Modes, LayerCopierTest,
                         ::testing::Values(Case{LayerCopier::Mode::kStaged, true, 128ull << 20},
                                           // 2 MiB slots: 5.3 MiB of objects take three rounds.
                                           Case{LayerCopier::Mode::kStaged, true, 8ull << 20},
                                           Case{LayerCopier::Mode::kStaged, false, 8ull << 20, 4},
                                           Case{LayerCopier::Mode::kStaged, false, 8ull << 20, 1},
                                           Case{LayerCopier::Mode::kStaged, false, 8ull << 20, 0},
                                           Case{LayerCopier::Mode::kMapped, true, 8ull << 20},
                                           // DRAM-tier chunks: 2D copies in 1 MiB rounds, and
                                           // the same with one copy per run.
                                           Case{LayerCopier::Mode::kStaged, true, 8ull << 20, 4,
                                                true, 1ull << 20, true},
                                           Case{LayerCopier::Mode::kStaged, true, 8ull << 20, 4,
                                                true, 1ull << 20, false},
                                           Case{LayerCopier::Mode::kStaged, true, 128ull << 20, 4,
                                                true, 0, true},
                                           Case{LayerCopier::Mode::kStaged, true, 8ull << 20, 4,
                                                true, 1ull << 20, true, true},
                                           Case{LayerCopier::Mode::kMapped, false, 128ull << 20},
                                           Case{LayerCopier::Mode::kCopyEngine, true, 8ull << 20},
                                           Case{LayerCopier::Mode::kCopyEngine, false, 8ull << 20},
                                           // kAuto at speed stays staged; "slow" switches.
                                           Case{LayerCopier::Mode::kAuto, true, 8ull << 20},
                                           Case{LayerCopier::Mode::kAuto, true, 8ull << 20, 4,
                                                false, 0, true, false, 0},
                                           Case{LayerCopier::Mode::kAuto, true, 8ull << 20, 4,
                                                true, 1ull << 20, true, true, 0},
                                           // Device copies beside host staging, in each way.
                                           Case{LayerCopier::Mode::kStaged, true, 8ull << 20, 4,
                                                false, 0, true, true, 4, true},
                                           Case{LayerCopier::Mode::kStaged, false, 8ull << 20, 4,
                                                false, 0, true, false, 4, true},
                                           Case{LayerCopier::Mode::kCopyEngine, true, 8ull << 20,
                                                4, false, 0, true, false, 4, true},
                                           Case{LayerCopier::Mode::kAuto, true, 8ull << 20, 4,
                                                false, 0, true, true, 4, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(LayerCopier::ModeName(info.param.mode)) +
                                  (info.param.registered ? "_pinned" : "_heap") + "_" +
                                  std::to_string(info.param.gpu_bytes >> 20) + "MiB_bounce" +
                                  std::to_string(info.param.bounce_threads) +
                                  (info.param.chunked ? "_chunked" : "") +
                                  (info.param.round_bytes > 0
                                       ? "_round" + std::to_string(info.param.round_bytes >> 10) + "k"
                                       : "") +
                                  (info.param.strided ? "" : "_unstrided") +
                                  (info.param.overlap ? "_overlap" : "") +
                                  (info.param.auto_slow < 1 ? "_slow" : "") +
                                  (info.param.device_copies ? "_devcopies" : "");
                         });

// The engine's regions of `kv` in device memory: object `obj` of every block b filled with
// testing::FillObject(9, b, obj), the rest kPoison.
void AllocateFilled(const testing::KvLayout& kv, std::vector<void*>* regions,
                    std::vector<LocalRegion>* local) {
  const uint32_t num_blocks = kv.layout.num_blocks, len = kv.layout.object_len;
  for (uint32_t r = 0; r < kv.region_sizes.size(); ++r) {
    std::vector<uint8_t> image(kv.region_sizes[r], kPoison);
    for (uint32_t obj = 0; obj < kv.layout.placements.size(); ++obj) {
      const engine::ObjectPlacement& pl = kv.layout.placements[obj];
      if (pl.region != r) continue;
      for (uint32_t b = 0; b < num_blocks; ++b) {
        testing::FillObject(9, b, obj, image.data() + pl.offset + uint64_t{b} * pl.block_stride,
                            len);
      }
    }
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, image.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(p, image.data(), image.size(), cudaMemcpyHostToDevice), cudaSuccess);
    regions->push_back(p);
    local->push_back({p, image.size()});
  }
}

struct GatherCase {
  LayerCopier::Mode mode;
  uint64_t expect_copy_engine_gathers;
  // The first kUsed blocks in order, object j of consecutive blocks side by side in staging (as
  // a store's interleaved frames hold them): the copy engines' copies go in runs
  // (gpu/copy_runs.h), each inside one engine region (one cudaMalloc a layer here, and those may
  // lie side by side). Otherwise random blocks, each block's objects one after another.
  bool consecutive = false;
};

class LayerCopierGatherTest : public ::testing::TestWithParam<GatherCase> {};

// Gathers every layer of `used` blocks into registered staging, twice, and checks every staged
// byte each time, and which way each went.
TEST_P(LayerCopierGatherTest, GathersExactly) {
  TUTTI_SKIP_WITHOUT_GPU();
  const GatherCase c = GetParam();
  constexpr uint32_t kLayers = 3, kBlocks = 96, kUsed = 40, kObj = 64 * 1024;
  const testing::KvLayout kv = testing::MakeKvLayout(KvFormat::kFusedKv, kLayers, kBlocks, kObj);
  auto io = IoStream::Create({0, 8, 0});
  ASSERT_TRUE(io.ok()) << io.status();
  std::vector<void*> regions;
  std::vector<LocalRegion> local;
  AllocateFilled(kv, &regions, &local);
  std::vector<uint32_t> blocks = testing::RandomBlocks(5, kUsed, kBlocks);
  if (c.consecutive) {
    for (uint32_t i = 0; i < kUsed; ++i) blocks[i] = i;
  }
  auto pinned = PinnedRegion::Allocate(uint64_t{kUsed} * kLayers * 2 * kObj);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  std::vector<engine::CopyOp> ops;  // block by block, as a store gives them
  for (uint32_t i = 0; i < kUsed; ++i) {
    for (uint32_t obj = 0; obj < kLayers * 2; ++obj) {
      const uint64_t frame =
          c.consecutive ? uint64_t{obj} * kUsed + i : uint64_t{i} * kLayers * 2 + obj;
      ops.push_back({blocks[i], obj, (*pinned)->host() + frame * kObj});
    }
  }
  auto copier = LayerCopier::Create({c.mode, 8ull << 20}, io->get(), {(*pinned)->staging()});
  ASSERT_TRUE(copier.ok()) << copier.status();
  auto mem = CudaIpcMemory::WrapLocal(kv.layout, local, (*copier)->staging_regions(), io->get());
  ASSERT_TRUE(mem.ok()) << mem.status();
  std::vector<uint8_t> want(kObj);
  // The second round asks for every object's checksum too (the hash kernel after the copies).
  std::vector<engine::ObjectSum> sums(ops.size());
  for (int round = 0; round < 2; ++round) {
    std::memset((*pinned)->host(), 0, uint64_t{kUsed} * kLayers * 2 * kObj);
    for (size_t i = 0; round == 1 && i < ops.size(); ++i) {
      sums[i].seed = 0x1234567 * (i + 1);
      ops[i].sum = &sums[i];
    }
    ASSERT_TRUE((*copier)->Gather(mem->get(), ops).ok()) << "round " << round;
    uint32_t wrong = 0, wrong_sums = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const engine::CopyOp& op = ops[i];
      testing::FillObject(9, op.block, op.object, want.data(), kObj);
      if (std::memcmp(op.staging, want.data(), kObj) != 0) ++wrong;
      if (round == 1 && (!sums[i].done ||
                         sums[i].value != XXH3_64bits_withSeed(want.data(), kObj, sums[i].seed))) {
        ++wrong_sums;
      }
    }
    EXPECT_EQ(wrong, 0u) << "round " << round;
    EXPECT_EQ(wrong_sums, 0u) << "round " << round;
  }
  EXPECT_EQ((*copier)->counters().gathers, 2u);
  EXPECT_EQ((*copier)->counters().copy_engine_gathers, c.expect_copy_engine_gathers);
  EXPECT_EQ((*copier)->counters().summed_objects, ops.size());
  EXPECT_EQ((*copier)->counters().sum_failures, 0u);
  mem->reset();
  for (void* p : regions) cudaFree(p);
}

INSTANTIATE_TEST_SUITE_P(Modes, LayerCopierGatherTest,
                         ::testing::Values(GatherCase{LayerCopier::Mode::kStaged, 0},
                                           GatherCase{LayerCopier::Mode::kMapped, 0},
                                           GatherCase{LayerCopier::Mode::kCopyEngine, 2},
                                           GatherCase{LayerCopier::Mode::kAuto, 2},
                                           GatherCase{LayerCopier::Mode::kCopyEngine, 2, true},
                                           GatherCase{LayerCopier::Mode::kStaged, 0, true}),
                         [](const ::testing::TestParamInfo<GatherCase>& info) {
                           return std::string(LayerCopier::ModeName(info.param.mode)) +
                                  (info.param.consecutive ? "_consecutive" : "");
                         });

// Issue 9: after an error with copies already enqueued, ScatterLayer returned while the copy
// stream and the I/O stream could still read the layer's host staging, which the store then gave
// back to its pool (and reused for other reads). An error must return only once both streams are
// past those copies. Each case fails after enqueueing a 48 MiB layer; right after the error the
// I/O stream (which waits on every slot's copy) must be idle, and the engine must hold the bytes
// the staging had at the call even though the staging is overwritten at once.
struct ErrorCase {
  const char* name;
  LayerCopier::Mode mode;
  LayerCopier::Wait wait;
  bool bad_word;     // fail at the ready word, after every copy is enqueued
  bool slots_known;  // false: the engine memory does not know the GPU staging slots, so the first
                     // round's scatter fails after its copy into the slot is enqueued
};

class LayerCopierErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(LayerCopierErrorTest, ErrorReturnsOnlyOnceQueuedCopiesHaveReadTheStaging) {
  TUTTI_SKIP_WITHOUT_GPU();
  const ErrorCase c = GetParam();
  constexpr uint32_t kLayers = 2, kBlocks = 96, kObj = 256 * 1024, kLayer = 1;
  const testing::KvLayout kv = testing::MakeKvLayout(KvFormat::kFusedKv, kLayers, kBlocks, kObj);
  auto io = IoStream::Create({0, 8, 0});
  ASSERT_TRUE(io.ok()) << io.status();
  std::vector<void*> regions;
  std::vector<LocalRegion> local;
  AllocatePoisoned(kv, &regions, &local);
  if (HasFatalFailure()) return;
  const uint64_t staging_bytes = uint64_t{kBlocks} * 2 * kObj;
  auto pinned = PinnedRegion::Allocate(staging_bytes);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  std::vector<engine::CopyOp> ops;
  uint8_t* next = (*pinned)->host();
  for (uint32_t b : testing::RandomBlocks(3, kBlocks, kBlocks)) {
    for (uint32_t p = 0; p < 2; ++p, next += kObj) {
      testing::FillObject(3, b, kLayer * 2 + p, next, kObj);
      ops.push_back({b, kLayer * 2 + p, next});
    }
  }
  auto copier = LayerCopier::Create({c.mode, 128ull << 20, 0}, io->get(), {(*pinned)->staging()});
  ASSERT_TRUE(copier.ok()) << copier.status();
  std::vector<StagingRegion> known = (*copier)->staging_regions();
  if (!c.slots_known) known.pop_back();  // the GPU staging buffer comes last
  auto mem = CudaIpcMemory::WrapLocal(kv.layout, local, known, io->get());
  ASSERT_TRUE(mem.ok()) << mem.status();
  auto words_array = ReadyWordArray::Create(0, kLayers);
  ASSERT_TRUE(words_array.ok()) << words_array.status();
  auto words = ReadyWords::WrapLocal((*words_array)->word(0), kLayers, io->get());
  ASSERT_TRUE(words.ok()) << words.status();

  const uint32_t word = c.bad_word ? kLayers + 5 : kLayer;
  absl::Status s = (*copier)->ScatterLayer(mem->get(), ops, words->get(), word, 9, c.wait);
  const cudaError_t busy = cudaStreamQuery((*io)->stream());  // at once, before anything else
  std::memset((*pinned)->host(), 0xee, staging_bytes);  // the store reuses the staging
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(busy, cudaSuccess) << "ScatterLayer returned an error with copies still queued: "
                               << cudaGetErrorName(busy);
  ASSERT_TRUE((*copier)->Drain().ok());
  if (c.slots_known) {  // every copy ran, from the staging as it was during the call
    std::vector<uint8_t> got(kv.region_sizes[kLayer]), want(kObj);
    ASSERT_EQ(cudaMemcpy(got.data(), regions[kLayer], got.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    uint32_t wrong = 0;
    for (const engine::CopyOp& op : ops) {
      const engine::ObjectPlacement& pl = kv.layout.placements[op.object];
      testing::FillObject(3, op.block, op.object, want.data(), kObj);
      wrong += std::memcmp(got.data() + pl.offset + uint64_t{op.block} * pl.block_stride,
                           want.data(), kObj) != 0;
    }
    EXPECT_EQ(wrong, 0u) << "objects copied from staging overwritten after the error returned";
  }
  mem->reset();
  for (void* p : regions) cudaFree(p);
}

INSTANTIATE_TEST_SUITE_P(
    ErrorPaths, LayerCopierErrorTest,
    ::testing::Values(
        ErrorCase{"staged_bad_word", LayerCopier::Mode::kStaged, LayerCopier::Wait::kLanded, true,
                  true},
        ErrorCase{"staged_bad_word_overlapped", LayerCopier::Mode::kStaged,
                  LayerCopier::Wait::kPrevious, true, true},
        ErrorCase{"copy_engine_bad_word", LayerCopier::Mode::kCopyEngine,
                  LayerCopier::Wait::kLanded, true, true},
        ErrorCase{"staged_scatter_fails_after_copy_in", LayerCopier::Mode::kStaged,
                  LayerCopier::Wait::kLanded, false, false}),
    [](const ::testing::TestParamInfo<ErrorCase>& info) { return std::string(info.param.name); });

// Runs without a GPU: the names gpu.scatter takes (config/config.cc checks the same four).
TEST(LayerCopierModeTest, NamesRoundTrip) {
  for (auto m : {LayerCopier::Mode::kStaged, LayerCopier::Mode::kMapped,
                 LayerCopier::Mode::kCopyEngine, LayerCopier::Mode::kAuto}) {
    EXPECT_EQ(LayerCopier::ModeFromName(LayerCopier::ModeName(m)), m);
  }
  EXPECT_EQ(LayerCopier::ModeName(LayerCopier::Mode::kCopyEngine), "copy_engine");
  EXPECT_FALSE(LayerCopier::ModeFromName("dma").has_value());
}

TEST(LayerCopierCreateTest, RejectsObjectsLargerThanTheBuffer) {
  TUTTI_SKIP_WITHOUT_GPU();
  auto io = IoStream::Create({0, 8, 0});
  ASSERT_TRUE(io.ok()) << io.status();
  const testing::KvLayout kv = testing::MakeKvLayout(KvFormat::kMla, 1, 1, 4ull << 20);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, kv.region_sizes[0]), cudaSuccess);
  auto copier = LayerCopier::Create({LayerCopier::Mode::kStaged, 8ull << 20}, io->get(), {});
  ASSERT_TRUE(copier.ok()) << copier.status();
  auto mem = CudaIpcMemory::WrapLocal(kv.layout, {LocalRegion{p, kv.region_sizes[0]}},
                                      (*copier)->staging_regions(), io->get());
  ASSERT_TRUE(mem.ok()) << mem.status();
  std::vector<uint8_t> src(4ull << 20);
  engine::CopyOp op{0, 0, src.data()};
  absl::Status s = (*copier)->ScatterLayer(mem->get(), {op}, nullptr, 0, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  mem->reset();
  cudaFree(p);
}

}  // namespace
}  // namespace tutti::gpu

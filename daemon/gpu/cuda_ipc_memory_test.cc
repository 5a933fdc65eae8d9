#include "daemon/gpu/cuda_ipc_memory.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "daemon/gpu/testing/kv_layout.h"
#include "gpu/pinned.h"
#include "gpu/testing/test_util.h"
#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

using testing::KvFormat;

constexpr uint8_t kPoison = 0xa5;

// Device allocations of the given sizes, poisoned, freed at the end of the test.
class DeviceRegions {
 public:
  explicit DeviceRegions(const std::vector<uint64_t>& sizes) : sizes_(sizes) {
    for (uint64_t size : sizes) {
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, size), cudaSuccess);
      EXPECT_EQ(cudaMemset(p, kPoison, size), cudaSuccess);
      ptrs_.push_back(p);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~DeviceRegions() {
    for (void* p : ptrs_) cudaFree(p);
  }
  std::vector<LocalRegion> local() const {
    std::vector<LocalRegion> out;
    for (size_t i = 0; i < ptrs_.size(); ++i) out.push_back({ptrs_[i], sizes_[i]});
    return out;
  }
  std::vector<uint8_t> Read(size_t i) const {
    std::vector<uint8_t> host(sizes_[i]);
    EXPECT_EQ(cudaMemcpy(host.data(), ptrs_[i], sizes_[i], cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  std::vector<uint64_t> sizes_;
  std::vector<void*> ptrs_;
};

struct Fixture {
  testing::KvLayout kv;
  std::unique_ptr<IoStream> io;
  std::unique_ptr<DeviceRegions> regions;
  std::unique_ptr<PinnedRegion> staging;
  std::unique_ptr<CudaIpcMemory> mem;
  std::vector<engine::CopyOp> ops;
};

// A layout of `format` with `used` random blocks out of `num_blocks`, one op per object of each,
// staging filled with content derived from `seed`.
void MakeFixture(KvFormat format, uint32_t layers, uint32_t num_blocks, uint32_t object_len,
                 uint32_t used, uint64_t seed, Fixture* f) {
  f->kv = testing::MakeKvLayout(format, layers, num_blocks, object_len);
  auto io = IoStream::Create({0, 16, 0});
  ASSERT_TRUE(io.ok()) << io.status();
  f->io = std::move(*io);
  f->regions = std::make_unique<DeviceRegions>(f->kv.region_sizes);
  const uint32_t objects = f->kv.layout.placements.size();
  auto staging = PinnedRegion::Allocate(uint64_t{used} * objects * object_len);
  ASSERT_TRUE(staging.ok()) << staging.status();
  f->staging = std::move(*staging);
  uint8_t* next = f->staging->host();
  for (uint32_t b : testing::RandomBlocks(seed, used, num_blocks)) {
    for (uint32_t j = 0; j < objects; ++j) {
      testing::FillObject(seed, b, j, next, object_len);
      f->ops.push_back({b, j, next});
      next += object_len;
    }
  }
  auto mem = CudaIpcMemory::WrapLocal(f->kv.layout, f->regions->local(), {f->staging->staging()},
                                      f->io.get());
  ASSERT_TRUE(mem.ok()) << mem.status();
  f->mem = std::move(*mem);
}

// Every object of every block holds its expected content if an op wrote it, else the poison.
void ExpectEngineMemory(const Fixture& f, uint64_t seed) {
  const EngineLayout& layout = f.kv.layout;
  absl::flat_hash_set<uint32_t> written;
  for (const engine::CopyOp& op : f.ops) written.insert(op.block);
  std::vector<uint8_t> want(layout.object_len);
  std::vector<uint8_t> poison(layout.object_len, kPoison);
  size_t mismatches = 0;
  for (size_t r = 0; r < f.kv.region_sizes.size(); ++r) {
    std::vector<uint8_t> host = f.regions->Read(r);
    for (uint32_t j = 0; j < layout.placements.size(); ++j) {
      const engine::ObjectPlacement& p = layout.placements[j];
      if (p.region != r) continue;
      for (uint32_t b = 0; b < layout.num_blocks; ++b) {
        const uint8_t* got = host.data() + p.offset + b * p.block_stride;
        if (written.contains(b)) testing::FillObject(seed, b, j, want.data(), layout.object_len);
        const uint8_t* expect = written.contains(b) ? want.data() : poison.data();
        if (std::memcmp(got, expect, layout.object_len) != 0 && ++mismatches <= 5) {
          ADD_FAILURE() << "block " << b << " object " << j
                        << (written.contains(b) ? "" : " (untouched)");
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

class FormatTest : public ::testing::TestWithParam<KvFormat> {};

TEST_P(FormatTest, ScatterThenGatherIsByteExactOnRandomBlocks) {
  TUTTI_SKIP_WITHOUT_GPU();
  const KvFormat format = GetParam();
  // MLA: 16 tokens x 576 latent x bf16; K/V: 16 tokens x 4 heads x 128 x bf16.
  const uint32_t object_len = format == KvFormat::kMla ? 18432 : 16384;
  Fixture f;
  MakeFixture(format, 4, 96, object_len, 37, 1234 + static_cast<int>(format), &f);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(f.mem->Scatter(f.ops).ok());
  ExpectEngineMemory(f, 1234 + static_cast<int>(format));

  std::vector<uint8_t> sent(f.staging->host(), f.staging->host() + f.staging->size());
  std::memset(f.staging->host(), 0, f.staging->size());
  ASSERT_TRUE(f.mem->Gather(f.ops).ok());
  EXPECT_EQ(std::memcmp(sent.data(), f.staging->host(), sent.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, FormatTest, ::testing::ValuesIn(testing::kAllFormats),
                         [](const auto& info) { return testing::FormatName(info.param); });

TEST(CudaIpcMemoryTest, ManyObjectsTakeSeveralLaunches) {
  TUTTI_SKIP_WITHOUT_GPU();
  Fixture f;  // 2 layers x 2 parts x 1500 blocks = 6000 ops > 2 x kMaxDescsPerLaunch
  MakeFixture(KvFormat::kFusedKv, 2, 1600, 4096, 1500, 99, &f);
  if (HasFatalFailure()) return;
  ASSERT_GT(f.ops.size(), 2 * kMaxDescsPerLaunch);
  ASSERT_TRUE(f.mem->EnqueueScatter(f.ops).ok());
  ASSERT_TRUE(f.mem->Synchronize().ok());
  ExpectEngineMemory(f, 99);
}

TEST(CudaIpcMemoryTest, RegisteredCallerMemoryWorksAsStaging) {
  TUTTI_SKIP_WITHOUT_GPU();
  testing::KvLayout kv = testing::MakeKvLayout(KvFormat::kMla, 1, 8, 4096);
  auto io = IoStream::Create({0, 8, 0});
  ASSERT_TRUE(io.ok()) << io.status();
  DeviceRegions regions(kv.region_sizes);
  void* host = std::aligned_alloc(4096, 8 * 4096);
  for (uint32_t b = 0; b < 8; ++b) {
    testing::FillObject(5, b, 0, static_cast<uint8_t*>(host) + b * 4096, 4096);
  }
  {
    auto pinned = PinnedRegion::Register(host, 8 * 4096);
    ASSERT_TRUE(pinned.ok()) << pinned.status();
    auto mem =
        CudaIpcMemory::WrapLocal(kv.layout, regions.local(), {(*pinned)->staging()}, io->get());
    ASSERT_TRUE(mem.ok()) << mem.status();
    std::vector<engine::CopyOp> ops;
    for (uint32_t b = 0; b < 8; ++b)
      ops.push_back({7 - b, 0, static_cast<uint8_t*>(host) + b * 4096});
    ASSERT_TRUE((*mem)->Scatter(ops).ok());
  }
  std::vector<uint8_t> got = regions.Read(0);
  std::vector<uint8_t> want(4096);
  for (uint32_t b = 0; b < 8; ++b) {
    testing::FillObject(5, 7 - b, 0, want.data(), 4096);
    EXPECT_EQ(std::memcmp(got.data() + b * 4096, want.data(), 4096), 0) << b;
  }
  std::free(host);
}

TEST(CudaIpcMemoryTest, BadOpsAreRejectedAndNothingIsWritten) {
  TUTTI_SKIP_WITHOUT_GPU();
  Fixture f;
  MakeFixture(KvFormat::kSeparateKv, 2, 16, 4096, 4, 7, &f);
  if (HasFatalFailure()) return;
  std::vector<engine::CopyOp> bad = f.ops;
  bad.back().block = 16;
  EXPECT_EQ(f.mem->Scatter(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = f.ops;
  uint8_t outside alignas(16)[4096];
  bad.back().staging = outside;
  EXPECT_EQ(f.mem->Scatter(bad).code(), absl::StatusCode::kInvalidArgument);
  f.ops.clear();  // nothing may have been written
  ExpectEngineMemory(f, 7);
}

TEST(CudaIpcMemoryTest, OpenRejectsBadRegionsBeforeOpening) {
  TUTTI_SKIP_WITHOUT_GPU();
  auto io = IoStream::Create({0, 8, 0});
  ASSERT_TRUE(io.ok()) << io.status();
  testing::KvLayout kv = testing::MakeKvLayout(KvFormat::kMla, 1, 8, 4096);
  DeviceRegions regions(kv.region_sizes);
  void* dev = regions.local()[0].device_ptr;
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, dev), cudaSuccess);
  auto pinned = PinnedRegion::Allocate(4096);
  ASSERT_TRUE(pinned.ok());
  const std::vector<StagingRegion> staging = {(*pinned)->staging()};

  IpcRegion good{std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)),
                 kv.region_sizes[0], Probe()->uuid_text};
  IpcRegion r = good;
  r.handle.pop_back();
  EXPECT_EQ(CudaIpcMemory::Open(kv.layout, {r}, staging, io->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  r = good;
  r.gpu_uuid = "GPU-00000000-0000-0000-0000-000000000000";
  auto wrong_gpu = CudaIpcMemory::Open(kv.layout, {r}, staging, io->get());
  EXPECT_EQ(wrong_gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(wrong_gpu.status().message(), "this daemon serves"));
  r = good;
  r.size_bytes -= 4096;  // the layout no longer fits the declared size
  EXPECT_EQ(CudaIpcMemory::Open(kv.layout, {r}, staging, io->get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // CUDA refuses to open a handle in the process that exported it; whatever it answers, Open
  // reports it without crashing (logged for docs/gpu.md).
  auto own = CudaIpcMemory::Open(kv.layout, {good}, staging, io->get());
  std::printf("opening an own handle: %s\n", own.status().ToString().c_str());
}

}  // namespace
}  // namespace tutti::gpu

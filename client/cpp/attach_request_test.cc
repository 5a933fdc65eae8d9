// AttachRequest building: option checks, host objects placed in their shm regions, and device
// objects grouped by the allocation that holds them (one IPC handle per allocation).
#include "client/cpp/attach_request.h"

#include <unistd.h>

#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::client::internal {
namespace {

KvLayout SmallLayout() {
  KvLayout l;
  l.num_layers = 2;
  l.kv_heads = 2;
  l.head_dim = 64;
  l.dtype_bytes = 2;
  l.block_tokens = 16;  // 4 KiB objects
  l.format = KvFormat::kFused;
  return l;
}

// vLLM-style fused layout in one buffer: per layer [2, blocks, object].
AttachOptions FusedOptions(uint8_t* base, uint32_t num_blocks) {
  AttachOptions o;
  o.ns.model_id = "m";
  o.ns.layout = SmallLayout();
  o.num_blocks = num_blocks;
  const uint64_t obj = o.ns.layout.object_bytes();
  for (uint32_t l = 0; l < 2; ++l) {
    for (uint32_t p = 0; p < 2; ++p) {
      o.objects.push_back({base + (l * 2 + p) * num_blocks * obj, obj});
    }
  }
  return o;
}

TEST(AttachRequestTest, HostPlacementsAreOffsetsInTheRegion) {
  std::vector<uint8_t> mem(4 * 8 * 4096);
  AttachOptions o = FusedOptions(mem.data(), 8);
  o.host_regions.push_back({"/tutti-x", mem.data(), mem.size()});
  auto req = BuildHostAttach(o);
  ASSERT_TRUE(req.ok()) << req.status();
  ASSERT_EQ(req->regions_size(), 1);
  EXPECT_EQ(req->regions(0).host_shm().name(), "/tutti-x");
  EXPECT_EQ(req->regions(0).host_shm().size_bytes(), mem.size());
  ASSERT_EQ(req->placements_size(), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(req->placements(i).region(), 0u);
    EXPECT_EQ(req->placements(i).offset(), uint64_t(i) * 8 * 4096);
    EXPECT_EQ(req->placements(i).block_stride(), 4096u);
  }
  EXPECT_EQ(req->num_blocks(), 8u);
  EXPECT_EQ(req->namespace_().layout().format(), tutti::v1::KV_FORMAT_FUSED);
  EXPECT_EQ(req->namespace_().hash_scheme(), kChainHashScheme);
  EXPECT_EQ(req->engine_pid(), static_cast<uint32_t>(getpid()));
  EXPECT_FALSE(req->has_ready_words());
  EXPECT_EQ(req->namespace_secret(), "");
  o.namespace_secret = std::string(16, 's');
  EXPECT_EQ(BuildHostAttach(o)->namespace_secret(), o.namespace_secret);
}

TEST(AttachRequestTest, HostObjectsMayLieInDifferentRegions) {
  std::vector<uint8_t> a(2 * 8 * 4096), b(2 * 8 * 4096);
  AttachOptions o = FusedOptions(a.data(), 8);
  o.objects[2].base = b.data();
  o.objects[3].base = b.data() + 8 * 4096;
  o.host_regions = {{"/a", a.data(), a.size()}, {"/b", b.data(), b.size()}};
  auto req = BuildHostAttach(o);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->placements(1).region(), 0u);
  EXPECT_EQ(req->placements(2).region(), 1u);
  EXPECT_EQ(req->placements(3).offset(), 8u * 4096);
}

TEST(AttachRequestTest, HostObjectPastItsRegionIsRefused) {
  std::vector<uint8_t> mem(4 * 8 * 4096);
  AttachOptions o = FusedOptions(mem.data(), 8);
  o.host_regions.push_back(
      {"/x", mem.data(), mem.size() - 1});  // last block of object 3 sticks out
  auto req = BuildHostAttach(o);
  ASSERT_FALSE(req.ok());
  EXPECT_EQ(req.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(req.status().message().find("objects[3]"), std::string::npos) << req.status();
}

TEST(AttachRequestTest, BadOptionsNameTheField) {
  std::vector<uint8_t> mem(4 * 8 * 4096);
  AttachOptions o = FusedOptions(mem.data(), 8);
  o.host_regions.push_back({"/x", mem.data(), mem.size()});
  {
    AttachOptions bad = o;
    bad.ns.layout.head_dim = 0;
    EXPECT_NE(CheckOptions(bad).message().find("head_dim"), std::string::npos);
  }
  {
    AttachOptions bad = o;
    bad.objects.pop_back();
    EXPECT_NE(CheckOptions(bad).message().find("3 entries"), std::string::npos);
  }
  {
    AttachOptions bad = o;
    bad.objects[1].block_stride = 100;
    EXPECT_NE(CheckOptions(bad).message().find("objects[1]"), std::string::npos);
  }
  {
    AttachOptions bad = o;
    bad.host_regions.clear();
    EXPECT_EQ(BuildHostAttach(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(CheckOptions(o).ok());
}

// Device memory as a map of fake allocations; handles name the allocation.
class FakeDevice : public Device {
 public:
  void AddAllocation(uintptr_t base, uint64_t size) { allocs_[base] = size; }
  int exports = 0;

  absl::StatusOr<Allocation> AllocationOf(const void* ptr) override {
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    auto it = allocs_.upper_bound(p);
    if (it == allocs_.begin()) return absl::InvalidArgumentError("not device memory");
    --it;
    if (p >= it->first + it->second) return absl::InvalidArgumentError("not device memory");
    return Allocation{it->first, it->second};
  }
  absl::StatusOr<tutti::v1::CudaIpcRegion> Export(const Allocation& a) override {
    ++exports;
    tutti::v1::CudaIpcRegion r;
    r.set_ipc_handle(std::string(64, static_cast<char>('a' + exports)));
    r.set_size_bytes(a.size);
    r.set_gpu_uuid("GPU-fake");
    return r;
  }
  absl::StatusOr<std::unique_ptr<ReadyWords>> CreateReadyWords(uint32_t) override {
    return absl::UnimplementedError("not here");
  }
  absl::Status SynchronizeStream(void*) override { return absl::OkStatus(); }

 private:
  std::map<uintptr_t, uint64_t> allocs_;
};

class FakeWords : public ReadyWords {
 public:
  uint32_t count() const override { return 3; }
  absl::StatusOr<tutti::v1::CudaIpcRegion> Export() const override {
    tutti::v1::CudaIpcRegion r;
    r.set_ipc_handle(std::string(64, 'w'));
    r.set_size_bytes(12);
    r.set_gpu_uuid("GPU-fake");
    return r;
  }
  absl::Status EnqueueWait(void*, uint32_t, uint32_t) override { return absl::OkStatus(); }
  absl::Status ForceRelease(uint32_t) override { return absl::OkStatus(); }
};

TEST(AttachRequestTest, CudaObjectsAreGroupedByAllocation) {
  // Two "allocations": layer 0 in the first, layer 1 in the second (as separate torch tensors).
  const uintptr_t a = 0x7f0000000000, b = 0x7f0001000000;
  const uint64_t layer_bytes = 2 * 8 * 4096;
  FakeDevice dev;
  dev.AddAllocation(a, 2 << 20);
  dev.AddAllocation(b, 2 << 20);
  AttachOptions o = FusedOptions(reinterpret_cast<uint8_t*>(a), 8);
  o.mode = MemoryMode::kCuda;
  o.objects[2].base = reinterpret_cast<void*>(b + 4096);  // not at the allocation's start
  o.objects[3].base = reinterpret_cast<void*>(b + 4096 + layer_bytes / 2);
  FakeWords words;
  auto req = BuildCudaAttach(o, dev, words);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(dev.exports, 2);
  ASSERT_EQ(req->regions_size(), 2);
  EXPECT_EQ(req->regions(0).cuda_ipc().size_bytes(), 2u << 20);
  EXPECT_EQ(req->placements(0).region(), 0u);
  EXPECT_EQ(req->placements(1).region(), 0u);
  EXPECT_EQ(req->placements(1).offset(), layer_bytes / 2);
  EXPECT_EQ(req->placements(2).region(), 1u);
  EXPECT_EQ(req->placements(2).offset(), 4096u);
  EXPECT_EQ(req->placements(3).offset(), 4096u + layer_bytes / 2);
  EXPECT_EQ(req->ready_words().count(), 3u);
  EXPECT_EQ(req->ready_words().region().ipc_handle(), std::string(64, 'w'));
  EXPECT_EQ(req->engine_pid(), static_cast<uint32_t>(getpid()));
}

TEST(AttachRequestTest, CudaObjectRunningPastItsAllocationIsRefused) {
  const uintptr_t a = 0x7f0000000000;
  FakeDevice dev;
  dev.AddAllocation(a, 4 * 8 * 4096 - 1);
  AttachOptions o = FusedOptions(reinterpret_cast<uint8_t*>(a), 8);
  o.mode = MemoryMode::kCuda;
  FakeWords words;
  auto req = BuildCudaAttach(o, dev, words);
  ASSERT_FALSE(req.ok());
  EXPECT_NE(req.status().message().find("objects[3]"), std::string::npos) << req.status();

  AttachOptions host_ptr = FusedOptions(reinterpret_cast<uint8_t*>(0x1000), 8);
  EXPECT_EQ(BuildCudaAttach(host_ptr, dev, words).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti::client::internal

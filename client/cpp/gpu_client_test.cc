// The C++ client library in cuda mode against the real tuttid in GPU mode (tagged "gpu"; skips
// without a GPU): device memory attached through IPC handles the library makes; store; retrieve
// into other blocks while the engine's stream waits per layer (a copy of layer l enqueued after
// WaitLayer(l) sees the landed data); tuttid killed mid-retrieve: the stream moves on
// (ForceRelease) and the blocks are reported failed; re-attach after the restart.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gpu/probe.h"
#include "gtest/gtest.h"
#include "tests/common/daemon_launch.h"
#include "tests/e2e/tuttid_fixture.h"
#include "tutti/client.h"

namespace tutti::client {
namespace {

#define SKIP_WITHOUT_GPU()                                                \
  do {                                                                    \
    auto probe = ::tutti::gpu::Probe(0);                                  \
    if (!probe.ok()) GTEST_SKIP() << "no usable GPU: " << probe.status(); \
  } while (0)

constexpr uint32_t kLayers = 8;
constexpr uint32_t kBlocks = 256;
constexpr uint64_t kObject = 16 * 8 * 128 * 2;  // bf16: 32 KiB

KvLayout Layout() { return {kLayers, 8, 128, 2, 16, KvFormat::kFused}; }

// Byte b of object (layer, part) of a block stored as `key`: a function of all four.
uint8_t Pattern(const BlockKey& key, uint32_t layer, uint32_t part, uint64_t b) {
  return static_cast<uint8_t>(key[b % 16] * 31 + layer * 7 + part * 3 + b / 16);
}

class GpuClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    // The release helper ForceRelease starts (the runfile under Bazel; the bundle's run.sh sets
    // the variable itself).
    if (getenv("TUTTI_RELEASE_HELPER") == nullptr) {
      const std::string helper = tutti::testing::RunfilePath("gpu/tutti-release");
      if (access(helper.c_str(), X_OK) == 0) setenv("TUTTI_RELEASE_HELPER", helper.c_str(), 1);
    }
    e2e::FixtureConfig config;
    config.object_bytes = kObject;
    config.max_objects = 2 * kLayers;
    config.capacity_bytes = 1ull << 30;
    config.extra = "gpu { mode: \"cuda\" }";
    auto daemon = e2e::TuttidFixture::Create(config);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    ASSERT_TRUE(daemon_->Start().ok()) << daemon_->LogTail();
    bytes_ = uint64_t{kLayers} * 2 * kBlocks * kObject;
    ASSERT_EQ(cudaMalloc(&kv_, bytes_), cudaSuccess);
    ASSERT_EQ(cudaMemset(kv_, 0, bytes_), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    host_.resize(bytes_);
  }
  void TearDown() override {
    client_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (kv_ != nullptr) cudaFree(kv_);
  }
  uint64_t Offset(uint32_t block, uint32_t layer, uint32_t part) const {
    return ((uint64_t{layer} * 2 + part) * kBlocks + block) * kObject;
  }
  void Attach() {
    AttachOptions o;
    o.socket_path = daemon_->socket();
    o.engine_id = "gpu_client_test";
    o.ns.model_id = "gpu-client-test";
    o.ns.layout = Layout();
    o.num_blocks = kBlocks;
    o.mode = MemoryMode::kCuda;
    o.cuda_device = 0;
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t p = 0; p < 2; ++p) {
        o.objects.push_back({static_cast<uint8_t*>(kv_) + Offset(0, l, p), kObject});
      }
    }
    auto c = Client::Attach(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString() << "\n" << daemon_->LogTail();
    client_ = std::move(*c);
  }
  void Fill(uint32_t block, const BlockKey& key) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t p = 0; p < 2; ++p) {
        uint8_t* h = host_.data() + Offset(block, l, p);
        for (uint64_t b = 0; b < kObject; ++b) h[b] = Pattern(key, l, p, b);
        ASSERT_EQ(cudaMemcpy(static_cast<uint8_t*>(kv_) + Offset(block, l, p), h, kObject,
                             cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
    }
  }
  // Enqueues copies of layer `layer` of `blocks` back to host_ on stream_.
  void EnqueueReadBack(const std::vector<uint32_t>& blocks, uint32_t layer) {
    for (uint32_t b : blocks) {
      for (uint32_t p = 0; p < 2; ++p) {
        ASSERT_EQ(cudaMemcpyAsync(host_.data() + Offset(b, layer, p),
                                  static_cast<uint8_t*>(kv_) + Offset(b, layer, p), kObject,
                                  cudaMemcpyDeviceToHost, stream_),
                  cudaSuccess);
      }
    }
  }
  uint64_t Mismatches(uint32_t block, const BlockKey& key, uint32_t layer) const {
    uint64_t bad = 0;
    for (uint32_t p = 0; p < 2; ++p) {
      const uint8_t* h = host_.data() + Offset(block, layer, p);
      for (uint64_t b = 0; b < kObject; ++b) bad += h[b] != Pattern(key, layer, p, b);
    }
    return bad;
  }
  std::vector<BlockKey> Keys(int seed, size_t n) {
    std::vector<int32_t> tokens(16 * n);
    std::iota(tokens.begin(), tokens.end(), seed * 100000);
    return ChainKeys(tokens.data(), tokens.size(), 16);
  }
  void StoreAll(const std::vector<BlockKey>& keys) {
    for (size_t i = 0; i < keys.size(); ++i) Fill(static_cast<uint32_t>(i), keys[i]);
    std::vector<uint32_t> blocks(keys.size());
    std::iota(blocks.begin(), blocks.end(), 0);
    StoreOptions so;
    so.wait_durable = true;
    so.cuda_stream = stream_;
    auto out = client_->Store(keys, blocks, so);
    ASSERT_TRUE(out.ok()) << out.status().ToString() << "\n" << daemon_->LogTail();
    for (StoreOutcome o : *out) ASSERT_EQ(o, StoreOutcome::kDurable);
  }

  std::unique_ptr<e2e::TuttidFixture> daemon_;
  void* kv_ = nullptr;
  uint64_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<uint8_t> host_;
  std::unique_ptr<Client> client_;
};

TEST_F(GpuClientTest, RetrieveWithStreamWaitsPerLayer) {
  Attach();
  EXPECT_EQ(client_->info().mode, MemoryMode::kCuda);
  const auto keys = Keys(1, 100);
  StoreAll(keys);
  auto lease = client_->Lookup(keys);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_EQ(lease->hits, keys.size());
  std::vector<uint32_t> blocks(keys.size());
  std::iota(blocks.begin(), blocks.end(), 128);
  auto r = client_->Retrieve(*lease, keys, blocks);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE((*r)->WaitLayer(l, stream_).ok());
    EnqueueReadBack(blocks, l);  // runs only once layer l has landed
  }
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const RetrieveOutcome& out = (*r)->Wait();
  EXPECT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_TRUE(out.failed.empty());
  for (size_t i = 0; i < keys.size(); ++i) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      ASSERT_EQ(Mismatches(blocks[i], keys[i], l), 0u) << "block " << i << " layer " << l;
    }
  }
}

TEST_F(GpuClientTest, TuttidKilledMidRetrieveReleasesTheStream) {
  Attach();
  const auto keys = Keys(2, 120);
  StoreAll(keys);
  ASSERT_TRUE(daemon_->Stop().ok());  // and back: the client re-attaches in cuda mode
  ASSERT_TRUE(daemon_->Start().ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!(client_->info().attached && client_->generation() >= 2) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GE(client_->generation(), 2u);
  auto lease = client_->Lookup(keys);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_EQ(lease->hits, keys.size());
  std::vector<uint32_t> blocks(keys.size());
  std::iota(blocks.begin(), blocks.end(), 130);
  auto r = client_->Retrieve(*lease, keys, blocks);
  ASSERT_TRUE(r.ok());
  for (uint32_t l = 0; l < kLayers; ++l) ASSERT_TRUE((*r)->WaitLayer(l, stream_).ok());
  daemon_->Kill();
  const RetrieveOutcome& out = (*r)->Wait();
  // The stream is not left waiting: it drains within seconds whatever happened.
  const absl::Time sync_deadline = absl::Now() + absl::Seconds(10);
  cudaError_t q = cudaErrorNotReady;
  while ((q = cudaStreamQuery(stream_)) == cudaErrorNotReady && absl::Now() < sync_deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(q, cudaSuccess) << "the engine's stream still waits";
  std::printf("killed mid-retrieve: %u layers landed, status %s, %zu failed\n", out.layers_done,
              out.status.ToString().c_str(), out.failed.size());
  if (!out.status.ok()) {
    EXPECT_EQ(out.failed.size(), keys.size());
  }
}

}  // namespace
}  // namespace tutti::client

// The C++ client library against the real tuttid in host mode: store, lookup, layer-by-layer
// retrieve into other engine blocks (each layer verified as soon as its wait returns), release;
// tuttid restarted (the client re-attaches by itself and the cache is still there); tuttid killed
// in the middle of a retrieve (every wait returns, the blocks are reported failed, nothing hangs).
#include "tutti/client.h"

#include <algorithm>
#include <numeric>
#include <thread>

#include "absl/time/clock.h"
#include "client/hostengine/content.h"
#include "client/hostengine/kv_shape.h"
#include "gtest/gtest.h"
#include "tests/e2e/tuttid_fixture.h"

namespace tutti::client {
namespace {

using e2e::FixtureConfig;
using e2e::TuttidFixture;
using hostengine::KvShape;

// 8 layers x 8 KV heads x 128 dims x 4 bytes (float32) x 16 tokens: 64 KiB objects, 1 MiB blocks.
KvShape Shape() {
  KvShape s;
  s.layers = 8;
  s.kv_heads = 8;
  s.head_dim = 128;
  s.dtype_bytes = 4;
  s.block_tokens = 16;
  s.format = tutti::v1::KV_FORMAT_FUSED;
  return s;
}

Key ToKey(const BlockKey& k) {
  Key out;
  std::copy(k.begin(), k.end(), out.bytes.begin());
  return out;
}

// A host-mode engine: its KV cache in shared memory, laid out as KvShape says.
struct Engine {
  KvShape shape;
  uint32_t num_blocks = 0;
  std::unique_ptr<SharedMemory> shm;

  static Engine Make(const KvShape& shape, uint32_t num_blocks) {
    Engine e{shape, num_blocks, nullptr};
    auto shm = SharedMemory::Create("tutti-cpp-test", shape.region_bytes(num_blocks));
    EXPECT_TRUE(shm.ok()) << shm.status().ToString();
    e.shm = std::move(*shm);
    return e;
  }
  AttachOptions Options(const std::string& socket) const {
    AttachOptions o;
    o.socket_path = socket;
    o.engine_id = "client_test";
    o.ns.model_id = "client-test-model";
    o.ns.layout = {shape.layers,      shape.kv_heads,     shape.head_dim,
                   shape.dtype_bytes, shape.block_tokens, KvFormat::kFused};
    o.num_blocks = num_blocks;
    for (uint32_t l = 0; l < shape.layers; ++l) {
      for (uint32_t p = 0; p < shape.parts(); ++p) {
        o.objects.push_back({Object(0, l, p), shape.object_len()});
      }
    }
    o.host_regions.push_back(RegionOf(*shm));
    return o;
  }
  uint8_t* Object(uint32_t block, uint32_t layer, uint32_t part) const {
    return shm->data() + shape.ObjectOffset(num_blocks, block, layer, part);
  }
  void Fill(uint32_t block, const BlockKey& key) {
    for (uint32_t l = 0; l < shape.layers; ++l) {
      for (uint32_t p = 0; p < shape.parts(); ++p) {
        hostengine::FillObject(ToKey(key), l, p, {Object(block, l, p), shape.object_len()});
      }
    }
  }
  void Zero(uint32_t block) {
    for (uint32_t l = 0; l < shape.layers; ++l) {
      for (uint32_t p = 0; p < shape.parts(); ++p) {
        std::fill_n(Object(block, l, p), shape.object_len(), 0);
      }
    }
  }
  // Bytes of layer `layer` of `block` that differ from `key`'s content.
  uint64_t Mismatches(uint32_t block, const BlockKey& key, uint32_t layer) const {
    uint64_t bad = 0;
    for (uint32_t p = 0; p < shape.parts(); ++p) {
      bad += hostengine::CountObjectMismatches(ToKey(key), layer, p,
                                               {Object(block, layer, p), shape.object_len()});
    }
    return bad;
  }
};

std::vector<BlockKey> Keys(int seed, size_t blocks) {
  std::vector<int32_t> tokens(blocks * 16);
  std::iota(tokens.begin(), tokens.end(), seed * 100000);
  return ChainKeys(tokens.data(), tokens.size(), 16);
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FixtureConfig config;
    config.session_ttl_ms = session_ttl_ms_;
    auto daemon = TuttidFixture::Create(config);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    Start();
  }
  void Start() {
    absl::Status s = daemon_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  std::unique_ptr<Client> Attach(const Engine& e) {
    auto c = Client::Attach(e.Options(daemon_->socket()));
    EXPECT_TRUE(c.ok()) << c.status().ToString() << "\n" << daemon_->LogTail();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Stores keys[i] from engine block i (filled first), durably, in batches of 32.
  void StoreAll(Client& c, Engine& e, const std::vector<BlockKey>& keys) {
    for (size_t begin = 0; begin < keys.size(); begin += 32) {
      const size_t end = std::min(keys.size(), begin + 32);
      std::vector<BlockKey> batch(keys.begin() + begin, keys.begin() + end);
      std::vector<uint32_t> blocks(batch.size());
      for (size_t i = 0; i < batch.size(); ++i) {
        blocks[i] = static_cast<uint32_t>(i);
        e.Fill(blocks[i], batch[i]);
      }
      StoreOptions so;
      so.wait_durable = true;
      auto out = c.Store(batch, blocks, so);
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      for (StoreOutcome o : *out) ASSERT_EQ(o, StoreOutcome::kDurable);
    }
  }
  // Looks up and retrieves `keys` into engine blocks [first, first + n) (zeroed first), checking
  // each layer as soon as its wait returns.
  void RetrieveAndVerify(Client& c, Engine& e, const std::vector<BlockKey>& keys, uint32_t first) {
    auto lease = c.Lookup(keys);
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    ASSERT_EQ(lease->hits, keys.size());
    std::vector<uint32_t> blocks(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      blocks[i] = first + static_cast<uint32_t>(i);
      e.Zero(blocks[i]);
    }
    auto r = c.Retrieve(*lease, keys, blocks);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (uint32_t l = 0; l < e.shape.layers; ++l) {
      ASSERT_TRUE((*r)->WaitLayer(l).ok());
      for (size_t i = 0; i < keys.size(); ++i) {
        ASSERT_EQ(e.Mismatches(blocks[i], keys[i], l), 0u) << "block " << i << " layer " << l;
      }
    }
    const RetrieveOutcome& out = (*r)->Wait();
    EXPECT_TRUE(out.status.ok()) << out.status.ToString();
    EXPECT_TRUE(out.failed.empty());
    EXPECT_EQ(out.layers_done, e.shape.layers);
  }
  // Waits until the client is attached with generation `generation`.
  bool AwaitGeneration(Client& c, uint64_t generation, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      const SessionInfo info = c.info();
      if (info.attached && info.generation >= generation) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  uint32_t session_ttl_ms_ = 2000;
  std::unique_ptr<TuttidFixture> daemon_;
};

// tuttid's default session TTL: a KeepAlive every 7.5 s.
class DefaultTtlClientTest : public ClientTest {
 protected:
  DefaultTtlClientTest() { session_ttl_ms_ = 30000; }
};

// An engine that makes no call while tuttid restarts is attached again about a second after it is
// back (the client watches the connection), not at its next KeepAlive 7.5 s after attaching.
TEST_F(DefaultTtlClientTest, IdleClientReattachesSoonAfterARestart) {
  Engine e = Engine::Make(Shape(), 8);
  auto c = Attach(e);
  ASSERT_NE(c, nullptr);
  const absl::Time attached = absl::Now();
  ASSERT_TRUE(daemon_->Stop().ok());
  Start();
  const absl::Time restarted = absl::Now();
  ASSERT_LT(restarted - attached, absl::Milliseconds(3500)) << "restart too slow to tell";
  ASSERT_TRUE(AwaitGeneration(*c, 2, absl::Seconds(20))) << daemon_->LogTail();
  EXPECT_LT(absl::Now() - restarted, absl::Milliseconds(3500));  // 7.5 s - 3.5 s without the watch
  auto lease = c->Lookup(Keys(9, 2));  // the new session answers
  EXPECT_TRUE(lease.ok()) << lease.status().ToString();
}

TEST_F(ClientTest, StoreLookupRetrieveLayerByLayer) {
  Engine e = Engine::Make(Shape(), 96);
  auto c = Attach(e);
  ASSERT_NE(c, nullptr);
  const SessionInfo info = c->info();
  EXPECT_TRUE(info.attached);
  EXPECT_EQ(info.generation, 1u);
  EXPECT_EQ(info.object_bytes, 64u << 10);
  EXPECT_EQ(info.mode, MemoryMode::kHost);

  const auto keys = Keys(1, 40);
  StoreAll(*c, e, keys);
  RetrieveAndVerify(*c, e, keys, 48);

  // Stored before: nothing copied. A longer chain: only the stored prefix hits.
  auto again = c->Store({keys[0]}, {0});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0], StoreOutcome::kAlreadyPresent);
  auto longer = Keys(1, 50);
  auto lease = c->Lookup(longer);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->hits, 40u);
  EXPECT_TRUE(c->Release(*lease).ok());
  auto other = c->Lookup(Keys(2, 3));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->hits, 0u);
  EXPECT_EQ(other->id, 0u);
}

TEST_F(ClientTest, LoadOrRecomputeAdviceAndComputeReports) {
  Engine e = Engine::Make(Shape(), 16);
  auto c = Attach(e);
  ASSERT_NE(c, nullptr);
  const auto keys = Keys(4, 8);
  StoreAll(*c, e, keys);
  const uint32_t prompt = 8 * 16 + 5;
  auto plain = c->Lookup(keys, prompt);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->load_blocks, 8u) << "no compute reported yet: load every hit";
  EXPECT_EQ(plain->decision_id, 0u);
  ASSERT_TRUE(c->Release(*plain).ok());

  auto bad = c->ReportCompute({{16, 16, 0.0, 0}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("samples[0].layer_ms"), std::string::npos);
  auto good = c->ReportCompute({{128, 128, 1.0, 0.5}, {64, 64, 0.5, 0.5}, {32, 32, 0.25, 0.5}});
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_FALSE(good->decision_found);

  auto lease = c->Lookup(keys, prompt);
  ASSERT_TRUE(lease.ok());
  ASSERT_NE(lease->decision_id, 0u);
  EXPECT_LE(lease->load_blocks, lease->hits);
  EXPECT_LE(lease->predicted_ttft_ms, lease->predicted_recompute_ms);
  EXPECT_LE(lease->predicted_ttft_ms, lease->predicted_load_all_ms);
  EXPECT_GT(lease->predicted_ttft_ms, 0.5) << "at least the overhead";
  if (lease->load_blocks > 0) {
    std::vector<BlockKey> head(keys.begin(), keys.begin() + lease->load_blocks);
    std::vector<uint32_t> blocks(head.size());
    std::iota(blocks.begin(), blocks.end(), 8);
    auto r = c->Retrieve(*lease, head, blocks);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE((*r)->Wait().status.ok());
  } else {
    ASSERT_TRUE(c->Release(*lease).ok());
  }
  auto measured = c->ReportCompute({}, lease->decision_id, lease->predicted_ttft_ms * 1.1);
  ASSERT_TRUE(measured.ok()) << measured.status().ToString();
  EXPECT_TRUE(measured->decision_found);
  EXPECT_NEAR(measured->prediction_error, 0.1 / 1.1, 1e-9);
}

TEST_F(ClientTest, PartialLayerRangeAndBadCalls) {
  Engine e = Engine::Make(Shape(), 16);
  auto c = Attach(e);
  ASSERT_NE(c, nullptr);
  const auto keys = Keys(3, 4);
  StoreAll(*c, e, keys);
  auto lease = c->Lookup(keys);
  ASSERT_TRUE(lease.ok());
  for (uint32_t b = 8; b < 12; ++b) e.Zero(b);
  auto r = c->Retrieve(*lease, keys, {8, 9, 10, 11}, 2, 5);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->WaitLayer(1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*r)->WaitLayer(4).ok());
  EXPECT_TRUE((*r)->Wait().status.ok());
  for (uint32_t l = 0; l < 8; ++l) {
    const bool copied = l >= 2 && l < 5;
    EXPECT_EQ(e.Mismatches(8, keys[0], l) == 0, copied) << "layer " << l;
  }
  EXPECT_EQ(c->Retrieve(*lease, keys, {1, 2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Retrieve(*lease, keys, {1, 2, 3, 4}, 0, 9).status().code(),
            StatusCode::kInvalidArgument);
  // The lease ended with the first Retrieve: tuttid refuses, and every wait still returns.
  auto stale = c->Retrieve(*lease, keys, {1, 2, 3, 4});
  ASSERT_TRUE(stale.ok());
  EXPECT_EQ((*stale)->WaitLayer(7).code(), StatusCode::kAborted);
  EXPECT_EQ((*stale)->Wait().failed.size(), 4u);
  EXPECT_EQ((*stale)->Wait().status.code(), StatusCode::kNotFound);
}

TEST_F(ClientTest, ReattachesAfterTuttidRestartsAndTheCacheIsStillThere) {
  Engine e = Engine::Make(Shape(), 64);
  auto c = Attach(e);
  ASSERT_NE(c, nullptr);
  const auto keys = Keys(4, 20);
  StoreAll(*c, e, keys);
  auto old_lease = c->Lookup(keys);
  ASSERT_TRUE(old_lease.ok());

  absl::Status stopped = daemon_->Stop();
  ASSERT_TRUE(stopped.ok()) << stopped;
  // While tuttid is down: calls fail fast with UNAVAILABLE (an engine's miss), never hang.
  auto down = c->Lookup(keys);
  EXPECT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), StatusCode::kUnavailable) << down.status().ToString();

  Start();
  ASSERT_TRUE(AwaitGeneration(*c, 2, absl::Seconds(20))) << daemon_->LogTail();
  EXPECT_EQ(c->Retrieve(*old_lease, keys, std::vector<uint32_t>(20, 0)).status().code(),
            StatusCode::kUnavailable);  // a lease of the old session
  EXPECT_TRUE(c->Release(*old_lease).ok());
  RetrieveAndVerify(*c, e, keys, 32);
}

TEST_F(ClientTest, TuttidKilledMidRetrieveReleasesEveryWaitAndFailsTheBlocks) {
  Engine e = Engine::Make(Shape(), 224);
  auto c = Attach(e);
  ASSERT_NE(c, nullptr);
  const auto keys = Keys(5, 96);  // 96 MiB, read back from the pool files with O_DIRECT
  StoreAll(*c, e, keys);
  auto lease = c->Lookup(keys);
  ASSERT_TRUE(lease.ok());
  ASSERT_EQ(lease->hits, keys.size());
  std::vector<uint32_t> blocks(keys.size());
  std::iota(blocks.begin(), blocks.end(), 128);
  auto r = c->Retrieve(*lease, keys, blocks);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE((*r)->WaitLayer(0).ok());
  daemon_->Kill();
  uint32_t landed = 0;
  for (uint32_t l = 0; l < 8; ++l) {
    Status s = (*r)->WaitLayer(l);  // returns (landed or ABORTED); never hangs
    if (s.ok()) ++landed;
  }
  const RetrieveOutcome& out = (*r)->Wait();
  EXPECT_EQ(out.layers_done, landed);
  if (out.status.ok()) {
    // The whole transfer won the race with SIGKILL.
    EXPECT_EQ(landed, 8u);
    EXPECT_TRUE(out.failed.empty());
  } else {
    EXPECT_LT(landed, 8u);
    EXPECT_EQ(out.failed.size(), keys.size());
  }
  for (uint32_t l = 0; l < landed; ++l) {
    EXPECT_EQ(e.Mismatches(blocks[0], keys[0], l), 0u) << "layer " << l << " landed";
  }
  std::printf("killed after %u of 8 layers: %s\n", landed, out.status.ToString().c_str());

  // Back again after kill -9: the durable blocks are all there.
  Start();
  ASSERT_TRUE(AwaitGeneration(*c, 2, absl::Seconds(20))) << daemon_->LogTail();
  RetrieveAndVerify(*c, e, std::vector<BlockKey>(keys.begin(), keys.begin() + 32), 160);
}

TEST_F(ClientTest, AttachErrorsSayWhat) {
  Engine e = Engine::Make(Shape(), 4);
  AttachOptions o = e.Options("/tmp/tutti-no-such-dir/tuttid.sock");
  auto c = Client::Attach(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("cannot reach tuttid"), std::string::npos);

  AttachOptions outside = e.Options(daemon_->socket());
  outside.host_regions[0].size /= 2;
  EXPECT_EQ(Client::Attach(outside).status().code(), StatusCode::kInvalidArgument);

  AttachOptions too_big = e.Options(daemon_->socket());  // objects larger than the pool's
  too_big.ns.layout.block_tokens = 32;
  for (auto& t : too_big.objects) t.block_stride *= 2;
  too_big.num_blocks = 2;
  auto refused = Client::Attach(too_big);
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition)
      << refused.status().ToString();

  AttachOptions cuda = e.Options(daemon_->socket());
  cuda.mode = MemoryMode::kCuda;
  auto no_gpu = Client::Attach(cuda);  // host memory is not device memory, GPU or not
  EXPECT_FALSE(no_gpu.ok());
}

TEST_F(ClientTest, DetachIsIdempotentAndEndsTheSession) {
  Engine e = Engine::Make(Shape(), 4);
  auto c = Attach(e);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->Detach().ok());
  EXPECT_TRUE(c->Detach().ok());
  EXPECT_FALSE(c->info().attached);
  EXPECT_EQ(c->Lookup(Keys(6, 1)).status().code(), StatusCode::kFailedPrecondition);
  // The session is gone on tuttid's side too: a new engine may attach and the old one's calls
  // stay refused.
  auto c2 = Attach(e);
  ASSERT_NE(c2, nullptr);
  EXPECT_TRUE(c2->Lookup(Keys(6, 1)).ok());
  EXPECT_EQ(c->Store({Keys(6, 1)[0]}, {0}).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tutti::client

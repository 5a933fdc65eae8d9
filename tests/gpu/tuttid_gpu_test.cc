// Two processes, the real tuttid in GPU mode and engines using gpu/ and the gRPC stubs: blocks
// stored then retrieved byte for byte for each KV format while the engine's stream waits per
// layer on the ready words; an engine killed mid-retrieve while another keeps retrieving
// correctly; tuttid killed mid-retrieve while the engine's stream waits, released by the engine.
//
// Skips without a GPU. Re-executes itself as a second engine process (--engine_child).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gpu/testing/test_util.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_engine.h"
#include "tests/gpu/tuttid_runner.h"
#include "tutti/v1/admin.grpc.pb.h"

namespace tutti::gputest {
namespace {

constexpr char kChildFlag[] = "--engine_child";
constexpr uint64_t kSeed = 0x7e57;

// A 4 GiB pool of 2 MiB slots (about 2040): two engines of one uid each pin 256 blocks at once,
// within one user's share of the pins (limits.max_pinned_pool_share_per_user, half the slots)
// and everyone's (three quarters).
std::string DaemonConfig(const std::string& scatter, uint64_t dram_bytes,
                         const std::string& verifier = "auto") {
  return absl::StrCat(
      "datapath { verifier: \"", verifier, "\" }\n",
      "pool { capacity_bytes: 4294967296 object_bytes: 32768 max_objects: 64 }\n"
      "io { backend: \"uring\" queue_depth: 64 }\n"
      "dram { capacity_bytes: ",
      dram_bytes, " }\n",
      "limits { max_blocks_per_call: 512 store_staging_bytes: 268435456 "
      "retrieve_staging_bytes: 268435456 max_store_staging_bytes_per_session: 268435456 }\n"
      "gpu { mode: \"cuda\" io_sm_count: 16 scatter: \"",
      scatter, "\" }\n");
}

// `n` distinct indices in [0, range), shuffled.
std::vector<uint32_t> Pick(uint32_t n, uint32_t range, uint64_t seed) {
  std::vector<uint32_t> all(range);
  for (uint32_t i = 0; i < range; ++i) all[i] = i;
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(n);
  return all;
}

std::vector<uint32_t> Iota(uint32_t n, uint32_t first = 0) {
  std::vector<uint32_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

// Stores blocks[i] under key ids[i], 64 at a time (store staging holds 128 of these blocks).
bool StoreAll(GpuEngine& e, const std::vector<uint32_t>& blocks, const std::vector<uint32_t>& ids) {
  for (size_t i = 0; i < blocks.size(); i += 64) {
    const size_t n = std::min<size_t>(64, blocks.size() - i);
    auto outcomes = e.Store(std::vector<uint32_t>(blocks.begin() + i, blocks.begin() + i + n),
                            std::vector<uint32_t>(ids.begin() + i, ids.begin() + i + n),
                            /*wait_durable=*/true);
    if (!outcomes.ok()) return false;
    for (auto o : *outcomes) {
      if (o != tutti::v1::STORE_DURABLE) return false;
    }
  }
  return true;
}

// Stores `keys` from random engine blocks, poisons the engine, retrieves them into other random
// blocks while the engine's stream waits per layer and checks each layer right after its wait.
void RoundTrip(GpuEngine& e, uint32_t keys, uint64_t seed) {
  const EngineShape& s = e.shape();
  const std::vector<uint32_t> ids = Iota(keys);
  const std::vector<uint32_t> from = Pick(keys, s.num_blocks, seed);
  ASSERT_TRUE(e.Fill(from, ids, kSeed).ok());
  auto outcomes = e.Store(from, ids, /*wait_durable=*/true);
  ASSERT_TRUE(outcomes.ok()) << outcomes.status();
  for (auto o : *outcomes) ASSERT_EQ(o, tutti::v1::STORE_DURABLE);
  ASSERT_TRUE(e.Poison(0xa5).ok());
  auto hits = e.Lookup(ids);
  ASSERT_TRUE(hits.ok()) << hits.status();
  ASSERT_EQ(hits->first, keys);
  const std::vector<uint32_t> to = Pick(keys, s.num_blocks, seed + 1);
  const uint32_t ticket = e.NextTicket();
  ASSERT_TRUE(e.EnqueueLayerWaits(ticket, to, ids, kSeed).ok());
  RetrieveResult r = e.Retrieve(hits->second, to, ids, ticket);
  ASSERT_TRUE(r.rpc.ok()) << r.rpc.error_message();
  ASSERT_TRUE(e.WaitStream(absl::Seconds(10)));
  EXPECT_EQ(r.layers_reported, Iota(s.layers));
  EXPECT_TRUE(r.failed.empty());
  auto mismatches = e.Mismatches();
  ASSERT_TRUE(mismatches.ok());
  for (uint32_t l = 0; l < s.layers; ++l) EXPECT_EQ((*mismatches)[l], 0u) << "layer " << l;
}

struct DaemonCase {
  std::string scatter;
  bool dram;
  // "auto" (the GPU's checks, whose mirror of the retrieve staging the copier places from) or
  // "cpu".
  std::string verifier = "auto";
};

class RoundTripTest : public ::testing::TestWithParam<DaemonCase> {};

TEST_P(RoundTripTest, EachFormatByteExactWhileTheStreamWaitsPerLayer) {
  TUTTI_SKIP_WITHOUT_GPU();
  const DaemonCase c = GetParam();
  auto daemon =
      TuttidRunner::Start(DaemonConfig(c.scatter, c.dram ? 256ull << 20 : 0, c.verifier));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  for (auto format :
       {tutti::v1::KV_FORMAT_FUSED, tutti::v1::KV_FORMAT_SEPARATE, tutti::v1::KV_FORMAT_MLA}) {
    SCOPED_TRACE(FormatName(format));
    EngineShape shape;
    shape.format = format;
    shape.layers = 4;
    shape.num_blocks = 96;
    shape.model_id = absl::StrCat("roundtrip-", FormatName(format));
    if (format == tutti::v1::KV_FORMAT_MLA) {  // 18 KiB latents: not a 4 KiB multiple
      shape.kv_heads = 1;
      shape.head_dim = 576;
    }
    auto engine = GpuEngine::Create(shape, (*daemon)->socket(), shape.model_id);
    ASSERT_TRUE(engine.ok()) << engine.status() << "\n" << (*daemon)->LogTail();
    RoundTrip(**engine, 40, 11 + static_cast<int>(format));
  }
  // Three formats x 4 layers retrieved; tuttictl stats' counts follow the copier.
  auto admin = tutti::v1::Admin::NewStub(UnixChannel((*daemon)->socket() + ".admin"));
  grpc::ClientContext ctx;
  tutti::v1::StatsResponse stats;
  ASSERT_TRUE(admin->Stats(&ctx, {}, &stats).ok());
  EXPECT_GE(stats.gpu_layers(), 12u);
  EXPECT_GE(stats.gpu_gathers(), 3u);  // each format's blocks were stored
  if (c.scatter == "copy_engine") {
    EXPECT_EQ(stats.gpu_layers_copy_engine(), stats.gpu_layers());
  } else if (c.scatter != "auto") {
    EXPECT_EQ(stats.gpu_layers_copy_engine(), 0u);
  }
  // Stores gather by the copy engines in copy_engine and auto, by the kernel otherwise.
  EXPECT_EQ(stats.gpu_gathers_copy_engine(),
            c.scatter == "copy_engine" || c.scatter == "auto" ? stats.gpu_gathers() : 0u);
  EXPECT_EQ(*(*daemon)->Stop(), 0) << (*daemon)->LogTail();
}

INSTANTIATE_TEST_SUITE_P(Daemons, RoundTripTest,
                         ::testing::Values(DaemonCase{"staged", true}, DaemonCase{"staged", false},
                                           DaemonCase{"mapped", true}, DaemonCase{"mapped", false},
                                           DaemonCase{"copy_engine", true},
                                           DaemonCase{"copy_engine", false},
                                           DaemonCase{"auto", true}, DaemonCase{"auto", false},
                                           DaemonCase{"staged", false, "cpu"},
                                           DaemonCase{"copy_engine", false, "cpu"},
                                           DaemonCase{"auto", true, "cpu"}),
                         [](const ::testing::TestParamInfo<DaemonCase>& i) {
                           return i.param.scatter + (i.param.dram ? "_dram" : "_ssd") +
                                  (i.param.verifier == "cpu" ? "_cpuchecks" : "");
                         });

// Llama-3-8B-shaped layers (32 x 32 KiB K and V), 256 blocks: 512 MiB a retrieve.
EngineShape BigShape(const std::string& model) {
  EngineShape s;
  s.layers = 32;
  s.num_blocks = 320;
  s.model_id = model;
  return s;
}

// The child engine: stores its blocks, says "stored", then retrieves over and over, saying
// "retrieving" before each call, until killed.
int ChildMain(const std::string& socket) {
  auto e = GpuEngine::Create(BigShape("victim"), socket, "victim");
  if (!e.ok()) {
    std::fprintf(stderr, "child: %s\n", e.status().ToString().c_str());
    return 2;
  }
  const std::vector<uint32_t> ids = Iota(256);
  if (!(*e)->Fill(ids, ids, kSeed).ok() || !StoreAll(**e, ids, ids)) return 3;
  std::printf("stored\n");
  std::fflush(stdout);
  for (;;) {
    auto hits = (*e)->Lookup(ids);
    if (!hits.ok()) return 4;
    const uint32_t ticket = (*e)->NextTicket();
    if (!(*e)->EnqueueLayerWaits(ticket, ids, ids, std::nullopt).ok()) return 5;
    std::printf("retrieving\n");
    std::fflush(stdout);
    (*e)->Retrieve(hits->second, ids, ids, ticket);
    (*e)->WaitStream(absl::Seconds(10));
  }
}

uint32_t CountSessions(TuttidRunner& d) {
  grpc::ClientContext ctx;
  tutti::v1::SessionsResponse resp;
  if (!d.admin().Sessions(&ctx, tutti::v1::SessionsRequest(), &resp).ok()) return 999;
  return resp.sessions_size();
}

TEST(EngineDeathTest, KilledMidRetrieveWhileAnotherEngineKeepsRetrieving) {
  TUTTI_SKIP_WITHOUT_GPU();
  auto daemon = TuttidRunner::Start(DaemonConfig("staged", 0));  // SSD tier: slow retrieves
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto survivor = GpuEngine::Create(BigShape("survivor"), (*daemon)->socket(), "survivor");
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  GpuEngine& b = **survivor;
  const std::vector<uint32_t> ids = Iota(64);
  ASSERT_TRUE(b.Fill(ids, ids, kSeed).ok());
  ASSERT_TRUE(StoreAll(b, ids, ids));

  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t child = fork();
  if (child == 0) {
    dup2(out[1], 1);
    execl("/proc/self/exe", "/proc/self/exe", kChildFlag, (*daemon)->socket().c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  FILE* from_child = fdopen(out[0], "r");
  char line[64];
  ASSERT_NE(fgets(line, sizeof(line), from_child), nullptr);
  ASSERT_STREQ(line, "stored\n");
  ASSERT_EQ(CountSessions(**daemon), 2u);

  // Kill the child 30-80 ms into its third retrieve, from another thread, while the survivor
  // retrieves here.
  std::atomic<bool> killed{false};
  absl::Time kill_time;
  std::thread killer([&] {
    for (int n = 0; n < 3 && fgets(line, sizeof(line), from_child) != nullptr;) {
      n += std::strcmp(line, "retrieving\n") == 0;
    }
    absl::SleepFor(absl::Milliseconds(30 + std::random_device()() % 50));
    kill_time = absl::Now();
    kill(child, SIGKILL);
    killed = true;
  });
  int rounds = 0, after_kill = 0;
  const std::vector<uint32_t> to = Pick(64, 320, 5);
  while (after_kill < 3 && rounds < 200) {
    ASSERT_TRUE(b.Poison(0xa5).ok());
    auto hits = b.Lookup(ids);
    ASSERT_TRUE(hits.ok()) << hits.status();
    const uint32_t ticket = b.NextTicket();
    ASSERT_TRUE(b.EnqueueLayerWaits(ticket, to, ids, kSeed).ok());
    const bool was_killed = killed.load();
    RetrieveResult r = b.Retrieve(hits->second, to, ids, ticket);
    ASSERT_TRUE(r.rpc.ok()) << r.rpc.error_message();
    ASSERT_TRUE(b.WaitStream(absl::Seconds(10)));
    EXPECT_TRUE(r.failed.empty());
    auto mm = b.Mismatches();
    ASSERT_TRUE(mm.ok());
    for (uint32_t l = 0; l < 32; ++l)
      ASSERT_EQ((*mm)[l], 0u) << "round " << rounds << " layer " << l;
    ++rounds;
    after_kill += was_killed;
  }
  killer.join();
  waitpid(child, nullptr, 0);
  fclose(from_child);
  // The dead engine's session ends at once (pidfd), not after its 30 s keep-alive timeout.
  absl::Duration gone_after = absl::InfiniteDuration();
  for (int i = 0; i < 200; ++i) {
    if (CountSessions(**daemon) == 1) {
      gone_after = absl::Now() - kill_time;
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_LT(gone_after, absl::Seconds(1)) << (*daemon)->LogTail();
  std::printf(
      "survivor: %d correct retrieves (%d after the kill); victim's session gone %s after "
      "SIGKILL\n",
      rounds, after_kill, absl::FormatDuration(gone_after).c_str());
  EXPECT_NE((*daemon)->LogTail(20000).find("exited; its mappings are closed"), std::string::npos);
  survivor->reset();
  EXPECT_EQ(*(*daemon)->Stop(), 0) << (*daemon)->LogTail();
}

TEST(DaemonDeathTest, KilledMidRetrieveTheEngineReleasesItsStream) {
  TUTTI_SKIP_WITHOUT_GPU();
  auto daemon = TuttidRunner::Start(DaemonConfig("staged", 0));
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto engine = GpuEngine::Create(BigShape("orphan"), (*daemon)->socket(), "orphan");
  ASSERT_TRUE(engine.ok()) << engine.status();
  GpuEngine& e = **engine;
  const std::vector<uint32_t> ids = Iota(256);
  ASSERT_TRUE(e.Fill(ids, ids, kSeed).ok());
  ASSERT_TRUE(StoreAll(e, ids, ids));
  ASSERT_TRUE(e.Poison(0xa5).ok());
  auto hits = e.Lookup(ids);
  ASSERT_TRUE(hits.ok());
  const std::vector<uint32_t> to = Pick(256, 320, 9);
  const uint32_t ticket = e.NextTicket();
  ASSERT_TRUE(e.EnqueueLayerWaits(ticket, to, ids, kSeed).ok());
  RetrieveResult r = e.Retrieve(hits->second, to, ids, ticket, [&](uint32_t layer) {
    if (layer == 0) (*daemon)->Kill();
  });
  EXPECT_FALSE(r.rpc.ok());
  ASSERT_FALSE(r.layers_reported.empty());
  ASSERT_LT(r.layers_reported.size(), 32u);
  // The engine's stream waits on a word the dead daemon will never write...
  EXPECT_FALSE(e.WaitStream(absl::Milliseconds(300)));
  // ...until the engine releases it, as the client library does when the daemon is gone; every
  // block of the layers not reported is then a failure to recompute.
  ASSERT_TRUE(e.words().ForceRelease(ticket).ok());
  ASSERT_TRUE(e.WaitStream(absl::Seconds(5)));
  auto mm = e.Mismatches();
  ASSERT_TRUE(mm.ok());
  for (uint32_t layer : r.layers_reported) EXPECT_EQ((*mm)[layer], 0u) << "layer " << layer;
  const uint32_t failed_layers = 32 - static_cast<uint32_t>(r.layers_reported.size());
  std::printf("daemon killed after layer 0: %zu layers landed, %u layers x 256 blocks failed\n",
              r.layers_reported.size(), failed_layers);
  // The engine's own context still works.
  EXPECT_TRUE(e.Poison(0).ok());
}

}  // namespace
}  // namespace tutti::gputest

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], tutti::gputest::kChildFlag) == 0) {
    return tutti::gputest::ChildMain(argv[2]);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

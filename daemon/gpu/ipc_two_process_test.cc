// Two processes, as in production: this test is the engine (it owns the KV memory and the ready
// words, and its stream waits per layer); it re-executes itself as the daemon (--daemon_child),
// which opens the engine's IPC handles, scatters random blocks layer by layer from pinned staging
// on its I/O stream, signals each layer's ready word, and gathers the blocks back (the Store path).
// In "die" mode the daemon signals layer 0 only, keeps a kernel writing the engine's memory and
// is SIGKILLed: the engine releases its own waiting stream and its context stays healthy.
#include <cuda_runtime.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/gpu/cuda_ipc_memory.h"
#include "daemon/gpu/testing/kv_layout.h"
#include "gpu/cuda_status.h"
#include "gpu/pinned.h"
#include "gpu/ready_words.h"
#include "gpu/testing/busy_kernel.h"
#include "gpu/testing/test_util.h"
#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

using testing::KvFormat;

constexpr uint8_t kPoison = 0x5a;
constexpr uint32_t kLayers = 4;
constexpr uint32_t kBlocks = 64;
constexpr uint32_t kUsed = 21;
constexpr uint32_t kTicket = 41;
constexpr char kChildFlag[] = "--daemon_child";

uint32_t ObjectLen(KvFormat f) { return f == KvFormat::kMla ? 18432 : 16384; }

// What the engine tells the daemon: argv after the flag.
struct ChildArgs {
  bool die = false;
  int format = 0;
  uint64_t seed = 0;
  std::string uuid;
  std::string words_hex;
  std::vector<std::string> region_hex;
};

std::vector<std::string> ToArgv(const ChildArgs& a) {
  std::vector<std::string> v = {
      kChildFlag, a.die ? "die" : "full", absl::StrCat(a.format), absl::StrCat(a.seed), a.uuid,
      a.words_hex};
  v.insert(v.end(), a.region_hex.begin(), a.region_hex.end());
  return v;
}

// ---- the daemon side (child process) ----

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "daemon child: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 2;
}

// Layer 0 lands and is signalled; then a kernel keeps writing layer 1's region, the parent hears
// "1" on stdout, and kills this process while the kernel runs.
int DieMidRetrieve(CudaIpcMemory& mem, ReadyWords& words, IoStream& io,
                   const std::vector<engine::CopyOp>& layer0) {
  if (absl::Status s = mem.EnqueueScatter(layer0); !s.ok()) return Fail("scatter", s);
  if (absl::Status s = words.Signal(0, kTicket); !s.ok()) return Fail("signal", s);
  if (absl::Status s = io.Synchronize(); !s.ok()) return Fail("sync", s);
  // Region of object 2 (layer 1): the whole K half of layer 1's fused tensor.
  cudaError_t e =
      testing::LaunchWriteFor(mem.region_base(1), kBlocks * ObjectLen(KvFormat::kFusedKv),
                              uint64_t{10} * 1000 * 1000 * 1000, io.ctas(), io.stream());
  if (e != cudaSuccess) return Fail("busy kernel", CudaStatus(e, "launch"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (write(1, "1", 1) != 1) return 3;
  pause();
  return 0;
}

int ChildMain(int argc, char** argv) {
  ChildArgs a;
  // argv: flag, mode, format, seed, uuid, words handle, region handles...
  if (argc < 7 || !absl::SimpleAtoi(argv[3], &a.format) || !absl::SimpleAtoi(argv[4], &a.seed)) {
    return Fail("usage", absl::InvalidArgumentError("bad arguments"));
  }
  const KvFormat format = static_cast<KvFormat>(a.format);
  const uint32_t obj = ObjectLen(format);
  testing::KvLayout kv = testing::MakeKvLayout(format, kLayers, kBlocks, obj);
  auto io = IoStream::Create({0, 16, 0});
  if (!io.ok()) return Fail("I/O stream", io.status());
  std::vector<IpcRegion> regions;
  a.die = std::strcmp(argv[2], "die") == 0;
  for (int i = 7; i < argc; ++i) {
    regions.push_back({*testing::FromHex(argv[i]), kv.region_sizes[i - 7], argv[5]});
  }
  const uint32_t objects = kv.layout.placements.size();
  auto staging = PinnedRegion::Allocate(2ull * kUsed * objects * obj);
  if (!staging.ok()) return Fail("staging", staging.status());
  auto mem = CudaIpcMemory::Open(kv.layout, regions, {(*staging)->staging()}, io->get());
  if (!mem.ok()) return Fail("open KV regions", mem.status());
  auto words =
      ReadyWords::Open({*testing::FromHex(argv[6]), 4 * kLayers, argv[5]}, 0, kLayers, io->get());
  if (!words.ok()) return Fail("open ready words", words.status());

  // ops[l]: layer l's objects of the random blocks; staging's first half holds their content.
  std::vector<std::vector<engine::CopyOp>> ops(kLayers);
  uint8_t* next = (*staging)->host();
  for (uint32_t b : testing::RandomBlocks(a.seed, kUsed, kBlocks)) {
    for (uint32_t j = 0; j < objects; ++j) {
      testing::FillObject(a.seed, b, j, next, obj);
      ops[j / kv.parts].push_back({b, j, next});
      next += obj;
    }
  }
  if (a.die) return DieMidRetrieve(**mem, **words, **io, ops[0]);
  // Late on purpose: an engine stream that did not wait would read the poison.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (uint32_t l = 0; l < kLayers; ++l) {
    if (absl::Status s = (*mem)->EnqueueScatter(ops[l]); !s.ok()) return Fail("scatter", s);
    if (absl::Status s = (*words)->Signal(l, kTicket); !s.ok()) return Fail("signal", s);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (absl::Status s = (*mem)->Synchronize(); !s.ok()) return Fail("sync", s);

  // Store path: gather every object back into the second half and compare.
  const size_t half = (*staging)->size() / 2;
  std::memset((*staging)->host() + half, 0, half);
  std::vector<engine::CopyOp> back;
  for (const auto& layer : ops) {
    for (engine::CopyOp op : layer) {
      op.staging += half;
      back.push_back(op);
    }
  }
  if (absl::Status s = (*mem)->Gather(back); !s.ok()) return Fail("gather", s);
  if (std::memcmp((*staging)->host(), (*staging)->host() + half, half) != 0) {
    return Fail("gather", absl::DataLossError("gathered bytes differ from the scattered ones"));
  }
  return 0;
}

// ---- the engine side (the test) ----

class TwoProcessTest : public ::testing::TestWithParam<KvFormat> {};

// Forks and re-executes this binary with `args`; the child's stdout goes to `stdout_fd` if >= 0.
pid_t Spawn(const std::vector<std::string>& args, int stdout_fd = -1) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  if (stdout_fd >= 0) dup2(stdout_fd, 1);
  std::vector<char*> argv = {const_cast<char*>("/proc/self/exe")};
  for (const std::string& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  _exit(127);
}

TEST_P(TwoProcessTest, DaemonScattersIntoEngineBlocksWhileEngineStreamWaitsPerLayer) {
  TUTTI_SKIP_WITHOUT_GPU();
  const KvFormat format = GetParam();
  const uint32_t obj = ObjectLen(format);
  const uint64_t seed = 77 + static_cast<int>(format);
  testing::KvLayout kv = testing::MakeKvLayout(format, kLayers, kBlocks, obj);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);

  ChildArgs args{false, static_cast<int>(format), seed, Probe()->uuid_text, "", {}};
  std::vector<void*> regions;
  std::vector<uint8_t*> readback;
  for (uint64_t size : kv.region_sizes) {
    void* p = nullptr;
    // At least 2 MiB, so each region is an allocation of its own (what an IPC handle exports).
    ASSERT_EQ(cudaMalloc(&p, std::max<uint64_t>(size, 2 << 20)), cudaSuccess);
    ASSERT_EQ(cudaMemset(p, kPoison, size), cudaSuccess);
    regions.push_back(p);
    cudaIpcMemHandle_t h;
    ASSERT_EQ(cudaIpcGetMemHandle(&h, p), cudaSuccess);
    args.region_hex.push_back(testing::ToHex({reinterpret_cast<const char*>(&h), sizeof(h)}));
    void* host = nullptr;
    ASSERT_EQ(cudaHostAlloc(&host, size, cudaHostAllocDefault), cudaSuccess);
    readback.push_back(static_cast<uint8_t*>(host));
  }
  auto words = ReadyWordArray::Create(0, kLayers);
  ASSERT_TRUE(words.ok()) << words.status();
  auto exported = (*words)->ExportIpc();
  ASSERT_TRUE(exported.ok()) << exported.status();
  args.words_hex = testing::ToHex(exported->handle);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // The engine's stream: before "computing" layer l it waits for word l, then reads the layer's
  // regions (a stand-in for attention reading the KV).
  cudaStream_t engine;
  ASSERT_EQ(cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking), cudaSuccess);
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(WaitLayer(engine, (*words)->word(l), kTicket).ok());
    absl::flat_hash_set<uint32_t> layer_regions;
    for (uint32_t p = 0; p < kv.parts; ++p) {
      layer_regions.insert(kv.layout.placements[l * kv.parts + p].region);
    }
    for (uint32_t r : layer_regions) {
      ASSERT_EQ(cudaMemcpyAsync(readback[r], regions[r], kv.region_sizes[r], cudaMemcpyDeviceToHost,
                                engine),
                cudaSuccess);
    }
  }
  EXPECT_EQ(cudaStreamQuery(engine), cudaErrorNotReady);  // nothing signalled yet

  const pid_t child = Spawn(ToArgv(args));
  ASSERT_GT(child, 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "daemon child status " << wstatus;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  cudaError_t e;
  while ((e = cudaStreamQuery(engine)) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (e == cudaErrorNotReady) {
    ADD_FAILURE() << "engine stream still waiting after the daemon exited; releasing it";
    ASSERT_TRUE((*words)->ForceRelease(kTicket).ok());
  }
  ASSERT_EQ(cudaStreamSynchronize(engine), cudaSuccess);

  // Every object of the daemon's blocks has its content; every other block is still poison.
  absl::flat_hash_set<uint32_t> used;
  for (uint32_t b : testing::RandomBlocks(seed, kUsed, kBlocks)) used.insert(b);
  std::vector<uint8_t> want(obj);
  size_t bad = 0;
  for (uint32_t j = 0; j < kv.layout.placements.size(); ++j) {
    const engine::ObjectPlacement& p = kv.layout.placements[j];
    for (uint32_t b = 0; b < kBlocks; ++b) {
      if (used.contains(b)) {
        testing::FillObject(seed, b, j, want.data(), obj);
      } else {
        std::memset(want.data(), kPoison, obj);
      }
      const uint8_t* got = readback[p.region] + p.offset + b * p.block_stride;
      if (std::memcmp(got, want.data(), obj) != 0 && ++bad <= 5) {
        ADD_FAILURE() << "object " << j << " block " << b
                      << (used.contains(b) ? "" : " (untouched)");
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  cudaStreamDestroy(engine);
  for (void* p : regions) cudaFree(p);
  for (uint8_t* h : readback) cudaFreeHost(h);
}

// The engine's side of a daemon crash: layer 0 arrived, the daemon died with a kernel writing the
// engine's memory. The engine's stream must not hang (the client releases the words), layer 0's
// data must be intact, and the engine's CUDA context must stay usable.
TEST(DaemonDeathTest, EngineReleasesItsStreamAndKeepsWorkingWhenTheDaemonIsKilled) {
  TUTTI_SKIP_WITHOUT_GPU();
  const KvFormat format = KvFormat::kFusedKv;
  const uint32_t obj = ObjectLen(format);
  const uint64_t seed = 4242;
  testing::KvLayout kv = testing::MakeKvLayout(format, kLayers, kBlocks, obj);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ChildArgs args{true, static_cast<int>(format), seed, Probe()->uuid_text, "", {}};
  std::vector<void*> regions;
  for (uint64_t size : kv.region_sizes) {
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, std::max<uint64_t>(size, 2 << 20)), cudaSuccess);
    ASSERT_EQ(cudaMemset(p, kPoison, size), cudaSuccess);
    regions.push_back(p);
    cudaIpcMemHandle_t h;
    ASSERT_EQ(cudaIpcGetMemHandle(&h, p), cudaSuccess);
    args.region_hex.push_back(testing::ToHex({reinterpret_cast<const char*>(&h), sizeof(h)}));
  }
  auto words = ReadyWordArray::Create(0, kLayers);
  ASSERT_TRUE(words.ok()) << words.status();
  args.words_hex = testing::ToHex((*words)->ExportIpc()->handle);
  std::vector<uint8_t> layer0(kv.region_sizes[0]);
  void* layer0_pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&layer0_pinned, layer0.size(), cudaHostAllocDefault), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStream_t engine;
  ASSERT_EQ(cudaStreamCreateWithFlags(&engine, cudaStreamNonBlocking), cudaSuccess);
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_TRUE(WaitLayer(engine, (*words)->word(l), kTicket).ok());
    if (l == 0) {
      ASSERT_EQ(
          cudaMemcpyAsync(layer0_pinned, regions[0], layer0.size(), cudaMemcpyDeviceToHost, engine),
          cudaSuccess);
    }
  }

  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t child = Spawn(ToArgv(args), pipefd[1]);
  close(pipefd[1]);
  pollfd pfd = {pipefd[0], POLLIN, 0};
  char byte = 0;
  const bool told = poll(&pfd, 1, 30000) == 1 && read(pipefd[0], &byte, 1) == 1;
  close(pipefd[0]);
  kill(child, SIGKILL);  // mid-retrieve, its kernel still writing layer 1
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  if (!told) {
    ASSERT_TRUE((*words)->ForceRelease(kTicket).ok());
    cudaStreamSynchronize(engine);
    FAIL() << "the daemon child never reached its kill point (status " << wstatus << ")";
  }

  // Layers 1..3 were never signalled: the stream waits until the client releases the words.
  EXPECT_EQ(cudaStreamQuery(engine), cudaErrorNotReady);
  ASSERT_TRUE((*words)->ForceRelease(kTicket).ok());
  EXPECT_EQ(cudaStreamSynchronize(engine), cudaSuccess);

  std::memcpy(layer0.data(), layer0_pinned, layer0.size());
  absl::flat_hash_set<uint32_t> used;
  for (uint32_t b : testing::RandomBlocks(seed, kUsed, kBlocks)) used.insert(b);
  std::vector<uint8_t> want(obj);
  size_t bad = 0;
  for (uint32_t j = 0; j < kv.parts; ++j) {
    const engine::ObjectPlacement& p = kv.layout.placements[j];
    for (uint32_t b = 0; b < kBlocks; ++b) {
      if (used.contains(b)) {
        testing::FillObject(seed, b, j, want.data(), obj);
      } else {
        std::memset(want.data(), kPoison, obj);
      }
      bad += std::memcmp(layer0.data() + p.offset + b * p.block_stride, want.data(), obj) != 0;
    }
  }
  EXPECT_EQ(bad, 0u) << "layer 0 objects wrong";

  // The engine's context is healthy: memory operations and a sync succeed.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaMemset(regions[1], 0, kv.region_sizes[1]), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStreamDestroy(engine);
  cudaFreeHost(layer0_pinned);
  for (void* p : regions) cudaFree(p);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, TwoProcessTest, ::testing::ValuesIn(testing::kAllFormats),
                         [](const auto& info) { return testing::FormatName(info.param); });

}  // namespace
}  // namespace tutti::gpu

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], tutti::gpu::kChildFlag) == 0) {
    return tutti::gpu::ChildMain(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

// How much compute an "engine" process loses while the daemon retrieves at full speed on the same
// GPU, with the daemon's kernels on a green context of --sms SMs (0: an ordinary stream, all SMs).
//
// This process is the daemon. It measures its scatter bandwidth alone, then starts the engine
// (a child running compute-bound kernels on every SM, about 2 ms each, back to back, noting when
// each finished), lets it run alone, scatters continuously for --overlap_s, and lets it run alone
// again. Engine throughput (kernels per second) alone vs during the overlap gives the loss; the
// daemon's bandwidth during the overlap vs alone gives its own cost. Run it with and without MPS
// (nvidia-cuda-mps-control) to compare. JSON lines to --out; --label names the set-up.
#include <cuda_runtime.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/jsonl.h"
#include "common/status_macros.h"
#include "daemon/gpu/cuda_ipc_memory.h"
#include "daemon/gpu/layer_copier.h"
#include "daemon/gpu/testing/kv_layout.h"
#include "gpu/cuda_status.h"
#include "gpu/pinned.h"
#include "gpu/probe.h"
#include "gpu/testing/busy_kernel.h"
#include "gpu/testing/test_util.h"

ABSL_FLAG(bool, engine, false, "internal: run as the engine child");
ABSL_FLAG(double, engine_s, 4.5, "engine child: seconds to run");
ABSL_FLAG(uint32_t, sms, 16, "daemon I/O-domain SMs (0: ordinary stream on all SMs)");
ABSL_FLAG(uint32_t, ctas, 32, "daemon copy CTAs");
ABSL_FLAG(int32_t, mps_priority, -1,
          "daemon's CUDA_MPS_CLIENT_PRIORITY (0 normal, 1 below normal; -1: leave unset); the "
          "engine child never gets it");
ABSL_FLAG(uint32_t, round_kib, 0, "staged: bytes per copy-then-scatter round, KiB (0: a slot)");
ABSL_FLAG(std::string, path, "mapped",
          "daemon copy path: \"mapped\" (scatter kernel over mapped pinned staging, one launch "
          "per pass) or \"staged\" (gpu::LayerCopier as tuttid: copy engine into GPU staging, "
          "then a device-to-device scatter, a layer at a time) or \"copy_engine\" (LayerCopier "
          "moving every object by the copy engines, no SMs)");
ABSL_FLAG(std::string, direction, "retrieve",
          "what the daemon does: \"retrieve\" (scatter layers into the engine's blocks) or "
          "\"store\" (gather them out, LayerCopier::Gather, one call per layer)");
ABSL_FLAG(double, overlap_s, 1.5, "seconds of scatter while the engine computes");
ABSL_FLAG(std::string, label, "no_mps", "set-up name for the results (no_mps, mps)");
ABSL_FLAG(std::string, out, "", "JSON lines file to append results to");
ABSL_FLAG(std::string, machine, "", "machine name for the results");

namespace tutti::bench {
namespace {

using gpu::CudaStatus;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- engine child: back-to-back compute kernels; prints "ready", then one end time per kernel.

int EngineMain() {
  auto dev = gpu::Probe(0);
  if (!dev.ok()) return 2;
  cudaStream_t s;
  float* sink = nullptr;
  cudaEvent_t a, b;
  if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreate(&s) != cudaSuccess ||
      cudaMalloc(&sink, 4) != cudaSuccess || cudaEventCreate(&a) != cudaSuccess ||
      cudaEventCreate(&b) != cudaSuccess) {
    return 3;
  }
  const uint32_t ctas = dev->sm_count * 8;
  // Calibrate to about 2 ms a kernel.
  uint32_t iters = 1 << 14;
  float ms = 0;
  for (int i = 0; i < 2; ++i) {
    cudaEventRecord(a, s);
    gpu::testing::LaunchCompute(sink, iters, ctas, s);
    cudaEventRecord(b, s);
    if (cudaEventSynchronize(b) != cudaSuccess) return 4;
    cudaEventElapsedTime(&ms, a, b);
    iters = static_cast<uint32_t>(iters * 2.0 / std::max(ms, 0.01f));
  }
  std::vector<int64_t> ends;
  std::printf("ready %u\n", iters);
  std::fflush(stdout);
  const int64_t stop = NowNs() + static_cast<int64_t>(absl::GetFlag(FLAGS_engine_s) * 1e9);
  while (NowNs() < stop) {
    if (gpu::testing::LaunchCompute(sink, iters, ctas, s) != cudaSuccess) return 5;
    if (cudaStreamSynchronize(s) != cudaSuccess) return 6;
    ends.push_back(NowNs());
  }
  for (int64_t t : ends) std::printf("%lld\n", static_cast<long long>(t));
  return 0;
}

// ---- daemon ----

using Record = Result;

// Runs `pass` (all layers once) over and over until `until_ns`; returns GB/s.
absl::StatusOr<double> ScatterUntil(const std::function<absl::Status()>& pass,
                                    uint64_t bytes_per_pass, int64_t until_ns) {
  const int64_t start = NowNs();
  uint64_t bytes = 0;
  while (NowNs() < until_ns) {
    RETURN_IF_ERROR(pass());
    bytes += bytes_per_pass;
  }
  return bytes / static_cast<double>(NowNs() - start);
}

double Rate(const std::vector<int64_t>& ends, int64_t from, int64_t to) {
  size_t n = 0;
  for (int64_t t : ends) n += t >= from && t < to;
  return n / ((to - from) * 1e-9);
}

absl::Status Run(std::vector<Record>* out) {
  const int32_t priority = absl::GetFlag(FLAGS_mps_priority);
  if (priority >= 0) {  // before the first CUDA call, which connects to MPS
    setenv("CUDA_MPS_CLIENT_PRIORITY", absl::StrCat(priority).c_str(), 1);
  }
  const uint32_t sms = absl::GetFlag(FLAGS_sms);
  ASSIGN_OR_RETURN(auto io, gpu::IoStream::Create({0, sms, absl::GetFlag(FLAGS_ctas)}));
  std::printf("daemon I/O stream: %s, %u CTAs\n", io->description().c_str(), io->ctas());
  // 8 layers x 2048 random blocks x 2 x 32 KiB = 1 GiB per pass.
  constexpr uint32_t kLayers = 8, kBlocks = 2048, kEngineBlocks = 8192, kObj = 32768;
  gpu::testing::KvLayout kv =
      gpu::testing::MakeKvLayout(gpu::testing::KvFormat::kFusedKv, kLayers, kEngineBlocks, kObj);
  std::vector<gpu::LocalRegion> local;
  for (uint64_t size : kv.region_sizes) {
    void* p = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, size), "cudaMalloc"));
    local.push_back({p, size});
  }
  const uint64_t pass_bytes = uint64_t{kLayers} * kBlocks * 2 * kObj;
  ASSIGN_OR_RETURN(auto staging, gpu::PinnedRegion::Allocate(pass_bytes));
  std::memset(staging->host(), 0x3c, pass_bytes);
  std::vector<engine::CopyOp> ops;
  uint8_t* next = staging->host();
  // Layer-major staging, as the store's read frames hold a layer.
  const std::vector<uint32_t> blocks = gpu::testing::RandomBlocks(1, kBlocks, kEngineBlocks);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t b : blocks) {
      for (uint32_t p = 0; p < 2; ++p, next += kObj) ops.push_back({b, l * 2 + p, next});
    }
  }
  const std::string path = absl::GetFlag(FLAGS_path);
  const std::optional<gpu::LayerCopier::Mode> mode = gpu::LayerCopier::ModeFromName(path);
  if (!mode.has_value()) return absl::InvalidArgumentError("--path: " + path);
  const bool staged = *mode != gpu::LayerCopier::Mode::kMapped;  // through a LayerCopier
  const uint64_t round_bytes = uint64_t{absl::GetFlag(FLAGS_round_kib)} << 10;
  ASSIGN_OR_RETURN(auto copier,
                   gpu::LayerCopier::Create({*mode, pass_bytes / kLayers,
                                             /*bounce_threads=*/4, round_bytes},
                                            io.get(), {staging->staging()}));
  ASSIGN_OR_RETURN(auto mem, gpu::CudaIpcMemory::WrapLocal(kv.layout, local,
                                                           copier->staging_regions(), io.get()));
  std::vector<std::vector<engine::CopyOp>> layer_ops(kLayers);
  for (const engine::CopyOp& op : ops) layer_ops[op.object / 2].push_back(op);
  const bool store = absl::GetFlag(FLAGS_direction) == "store";
  if (!store && absl::GetFlag(FLAGS_direction) != "retrieve") {
    return absl::InvalidArgumentError("--direction: retrieve or store");
  }
  std::function<absl::Status()> pass = [&]() -> absl::Status {
    if (store) {
      for (const auto& lops : layer_ops) RETURN_IF_ERROR(copier->Gather(mem.get(), lops));
      return absl::OkStatus();
    }
    if (!staged) {
      RETURN_IF_ERROR(mem->EnqueueScatter(ops));
      return mem->Synchronize();
    }
    for (const auto& lops : layer_ops) {
      RETURN_IF_ERROR(copier->ScatterLayer(mem.get(), lops, nullptr, 0, 0));
    }
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(double alone_gbps, ScatterUntil(pass, pass_bytes, NowNs() + 500000000));

  int pipefd[2];
  if (pipe(pipefd) != 0) return absl::InternalError("pipe");
  const pid_t child = fork();
  if (child == 0) {
    unsetenv("CUDA_MPS_CLIENT_PRIORITY");
    dup2(pipefd[1], 1);
    char* argv[] = {const_cast<char*>("/proc/self/exe"), const_cast<char*>("--engine"), nullptr};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(pipefd[1]);
  FILE* from_engine = fdopen(pipefd[0], "r");
  char line[64];
  if (fgets(line, sizeof(line), from_engine) == nullptr || std::strncmp(line, "ready", 5) != 0) {
    return absl::InternalError("engine did not start");
  }
  const int64_t t0 = NowNs();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const int64_t t1 = NowNs();
  const int64_t overlap_ns = static_cast<int64_t>(absl::GetFlag(FLAGS_overlap_s) * 1e9);
  ASSIGN_OR_RETURN(double during_gbps, ScatterUntil(pass, pass_bytes, t1 + overlap_ns));
  const int64_t t2 = NowNs();
  std::vector<int64_t> ends;
  while (fgets(line, sizeof(line), from_engine) != nullptr) {
    int64_t t;
    if (absl::SimpleAtoi(line, &t)) ends.push_back(t);
  }
  fclose(from_engine);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return absl::InternalError(absl::StrCat("engine child status ", wstatus));
  }
  const double before = Rate(ends, t0 + 100000000, t1);
  const double during = Rate(ends, t1 + 50000000, t2);
  const double after = Rate(ends, t2 + 100000000, t2 + 1000000000);
  const double alone = (before + after) / 2;
  const std::string tag =
      absl::StrCat(absl::GetFlag(FLAGS_label), store ? ".store." : ".", absl::GetFlag(FLAGS_path), ".",
                   sms == 0 ? "all_sms" : absl::StrCat("sms", sms),
                   io->is_green() || sms == 0 ? "" : "_not_green", "_ctas", io->ctas(),
                   path != "copy_engine" && round_bytes > 0 ? absl::StrCat("_round", round_bytes >> 10, "k")
                                                        : "",
                   priority >= 0 ? absl::StrCat("_prio", priority) : "");
  out->push_back({tag + ".engine_kernels_per_s_during_retrieve", during, "1/s",
                  tag + ".engine_kernels_per_s_alone", alone});
  out->push_back({tag + ".engine_throughput_loss", 100.0 * (1 - during / alone), "%", "", 0});
  const std::string copy = store ? ".daemon_gather" : ".daemon_scatter";
  out->push_back({tag + copy + "_during_engine", during_gbps, "GB/s", tag + copy + "_alone",
                  alone_gbps});
  const tutti::gpu::LayerCopier::Counters c = copier->counters();
  std::printf("engine kernels/s: before %.1f, during %.1f, after %.1f; copy-engine layers %llu, "
              "gathers %llu; auto rounds timed %llu, slow %llu (%llu uncorrected)\n",
              before, during, after, static_cast<unsigned long long>(c.copy_engine_layers),
              static_cast<unsigned long long>(c.copy_engine_gathers),
              static_cast<unsigned long long>(c.timed_rounds),
              static_cast<unsigned long long>(c.slow_rounds),
              static_cast<unsigned long long>(c.slow_rounds_uncorrected));
  return absl::OkStatus();
}

void Report(const std::vector<Record>& records, const std::string& command) {
  const std::string date = tutti::bench::UtcNow();
  std::ofstream out;
  if (!absl::GetFlag(FLAGS_out).empty()) out.open(absl::GetFlag(FLAGS_out), std::ios::app);
  for (const Record& r : records) {
    const bool base = !r.baseline_name.empty();
    const double ratio = base ? r.value / r.baseline_value : 0;
    std::printf("%-62s %10.2f %-5s %s\n", r.metric.c_str(), r.value, r.unit.c_str(),
                base ? absl::StrCat("vs ", r.baseline_value, " (ratio ", ratio, ")").c_str() : "");
    if (!out.is_open()) continue;
    out << JsonLine("gpu_interference", r, absl::GetFlag(FLAGS_machine), date, command) << "\n";
  }
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  const std::string command = tutti::bench::CommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_engine)) return tutti::bench::EngineMain();
  alarm(60);
  std::vector<tutti::bench::Record> records;
  absl::Status s = tutti::bench::Run(&records);
  tutti::bench::Report(records, command);
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_interference: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

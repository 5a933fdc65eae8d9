// GPU copy paths for layer-wise Retrieve and Store, Llama-3-8B shaped, in one run:
//   (a) contiguous pinned host -> GPU cudaMemcpyAsync of the same bytes (the baseline), and GPU ->
//       pinned host for the Store direction;
//   (b) the scatter kernel reading mapped pinned staging, writing random paged engine blocks, on
//       I/O streams of several SM counts (green contexts);
//   (c) the naive path: one cudaMemcpyAsync per object;
//   (d) layer 0 ready and all layers ready, through ready words, layer by layer vs one piece;
//   (e) the gather kernel (Store): random engine blocks -> pinned staging.
// Times are taken with events on an observer stream that waits for a word the measured stream
// writes when done, so no event is recorded on a green-context stream. Medians over --reps.
// Writes JSON lines (bench/results format) to --out and a table to stdout. Never asserts on time.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/jsonl.h"
#include "common/status_macros.h"
#include "daemon/gpu/cuda_ipc_memory.h"
#include "daemon/gpu/testing/kv_layout.h"
#include "gpu/cuda_status.h"
#include "gpu/driver_api.h"
#include "gpu/pinned.h"
#include "gpu/probe.h"
#include "gpu/ready_words.h"
#include "gpu/testing/test_util.h"

ABSL_FLAG(uint32_t, blocks, 2048, "engine blocks per retrieve (random, distinct)");
ABSL_FLAG(uint32_t, engine_blocks, 8192, "blocks in each engine layer tensor");
ABSL_FLAG(uint32_t, layers, 32, "layers");
ABSL_FLAG(uint32_t, object_kib, 32, "object size: 16 tokens x 8 heads x 128 x bf16 = 32 KiB");
ABSL_FLAG(std::string, sms, "8,16,16:16,16:64,32,0",
          "scatter sweep: I/O-domain SM counts, each optionally :CTAs (default 2 per SM); 0 = "
          "an ordinary stream on all SMs");
ABSL_FLAG(uint32_t, main_sms, 16, "SM count for the gather and pipelining figures");
ABSL_FLAG(int, reps, 5, "repetitions per figure (median reported)");
ABSL_FLAG(std::string, out, "", "JSON lines file to append results to");
ABSL_FLAG(std::string, machine, "", "machine name for the results (default: the GPU's name)");
ABSL_FLAG(uint64_t, seed, 1, "content and block-choice seed");

namespace tutti::bench {
namespace {

using gpu::CudaStatus;


// Times work on any stream from an observer stream (see the file comment).
class Observer {
 public:
  static absl::StatusOr<std::unique_ptr<Observer>> Create() {
    auto o = std::unique_ptr<Observer>(new Observer());
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamCreateWithFlags(&o->stream_, cudaStreamNonBlocking), "stream"));
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&o->done_, 4), "cudaMalloc"));
    RETURN_IF_ERROR(CudaStatus(cudaMemset(o->done_, 0, 4), "cudaMemset"));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&o->start_), "event"));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&o->end_), "event"));
    return o;
  }
  cudaStream_t stream() const { return stream_; }
  absl::Status Start() { return CudaStatus(cudaEventRecord(start_, stream_), "record start"); }
  // `worker` signals when it reaches this point; the observer records the end then.
  absl::Status Stop(cudaStream_t worker) {
    ASSIGN_OR_RETURN(const gpu::DriverApi* api, gpu::GetDriverApi());
    ++ticket_;
    RETURN_IF_ERROR(
        gpu::CuStatus(api->StreamWriteValue32(reinterpret_cast<CUstream>(worker),
                                              reinterpret_cast<CUdeviceptr>(done_), ticket_, 0),
                      "write done"));
    RETURN_IF_ERROR(gpu::WaitLayer(stream_, done_, ticket_));
    return CudaStatus(cudaEventRecord(end_, stream_), "record end");
  }
  // Milliseconds from Start to `event` (default: the end), once the observer is done.
  absl::StatusOr<double> ElapsedMs(cudaEvent_t event = nullptr) {
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "observer sync"));
    float ms = 0;
    RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, start_, event ? event : end_), "elapsed"));
    return ms;
  }

 private:
  Observer() = default;
  cudaStream_t stream_ = nullptr;
  uint32_t* done_ = nullptr;
  uint32_t ticket_ = 0;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs `once` --reps times after one warm-up; returns the median of what it returns.
absl::StatusOr<double> MedianOf(const std::function<absl::StatusOr<double>()>& once) {
  RETURN_IF_ERROR(once().status());
  std::vector<double> v;
  for (int i = 0; i < absl::GetFlag(FLAGS_reps); ++i) {
    ASSIGN_OR_RETURN(double x, once());
    v.push_back(x);
  }
  return Median(v);
}

struct Setup {
  uint32_t layers, blocks, obj;
  uint64_t bytes;  // layers * blocks * 2 * obj
  gpu::testing::KvLayout kv;
  std::vector<void*> regions;
  std::unique_ptr<gpu::PinnedRegion> staging;
  uint8_t* contiguous = nullptr;                 // device buffer of `bytes`
  std::vector<std::vector<engine::CopyOp>> ops;  // per layer
  std::vector<engine::CopyOp> all_ops;
};

absl::Status Prepare(Setup* s) {
  s->layers = absl::GetFlag(FLAGS_layers);
  s->blocks = absl::GetFlag(FLAGS_blocks);
  s->obj = absl::GetFlag(FLAGS_object_kib) * 1024;
  const uint32_t engine_blocks = absl::GetFlag(FLAGS_engine_blocks);
  s->kv = gpu::testing::MakeKvLayout(gpu::testing::KvFormat::kFusedKv, s->layers, engine_blocks,
                                     s->obj);
  s->bytes = uint64_t{s->layers} * s->blocks * 2 * s->obj;
  for (uint64_t size : s->kv.region_sizes) {
    void* p = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, size), "cudaMalloc(engine KV)"));
    s->regions.push_back(p);
  }
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&s->contiguous, s->bytes), "cudaMalloc(contiguous)"));
  ASSIGN_OR_RETURN(s->staging, gpu::PinnedRegion::Allocate(s->bytes));
  // Staging is layer-major, so each layer's objects are contiguous (as the SSD reads land).
  const std::vector<uint32_t> chosen =
      gpu::testing::RandomBlocks(absl::GetFlag(FLAGS_seed), s->blocks, engine_blocks);
  s->ops.resize(s->layers);
  uint8_t* next = s->staging->host();
  for (uint32_t l = 0; l < s->layers; ++l) {
    for (uint32_t b : chosen) {
      for (uint32_t p = 0; p < 2; ++p) {
        s->ops[l].push_back({b, l * 2 + p, next});
        next += s->obj;
      }
    }
    s->all_ops.insert(s->all_ops.end(), s->ops[l].begin(), s->ops[l].end());
  }
  // Random content, filled by 16 threads.
  std::vector<std::thread> fill;
  const size_t n = s->all_ops.size();
  for (size_t t = 0; t < 16; ++t) {
    fill.emplace_back([s, t, n] {
      for (size_t i = t; i < n; i += 16) {
        const engine::CopyOp& op = s->all_ops[i];
        gpu::testing::FillObject(absl::GetFlag(FLAGS_seed), op.block, op.object, op.staging,
                                 s->obj);
      }
    });
  }
  for (auto& t : fill) t.join();
  return absl::OkStatus();
}

// Bytes of `op`'s engine object, read back.
absl::StatusOr<size_t> Verify(const Setup& s, size_t samples) {
  std::vector<uint8_t> got(s.obj), want(s.obj);
  size_t bad = 0;
  for (size_t k = 0; k < samples; ++k) {
    const engine::CopyOp& op = s.all_ops[(k * 7919) % s.all_ops.size()];
    const engine::ObjectPlacement& p = s.kv.layout.placements[op.object];
    const uint8_t* src =
        static_cast<uint8_t*>(s.regions[p.region]) + p.offset + op.block * p.block_stride;
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(got.data(), src, s.obj, cudaMemcpyDeviceToHost), "verify"));
    gpu::testing::FillObject(absl::GetFlag(FLAGS_seed), op.block, op.object, want.data(), s.obj);
    bad += std::memcmp(got.data(), want.data(), s.obj) != 0;
  }
  return bad;
}

double GBps(uint64_t bytes, double ms) { return bytes / (ms * 1e6); }

absl::Status Run(std::vector<Result>* results) {
  ASSIGN_OR_RETURN(gpu::DeviceInfo dev, gpu::Probe(0));
  Setup s;
  RETURN_IF_ERROR(Prepare(&s));
  ASSIGN_OR_RETURN(auto obs, Observer::Create());
  cudaStream_t plain;
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&plain, cudaStreamNonBlocking), "stream"));
  const uint64_t layer_bytes = s.bytes / s.layers;

  // (a) contiguous copies, one per layer.
  auto contiguous = [&](cudaMemcpyKind kind) -> absl::StatusOr<double> {
    RETURN_IF_ERROR(obs->Start());
    for (uint32_t l = 0; l < s.layers; ++l) {
      uint8_t* host = s.staging->host() + l * layer_bytes;
      uint8_t* dev_ptr = s.contiguous + l * layer_bytes;
      RETURN_IF_ERROR(CudaStatus(kind == cudaMemcpyHostToDevice
                                     ? cudaMemcpyAsync(dev_ptr, host, layer_bytes, kind, plain)
                                     : cudaMemcpyAsync(host, dev_ptr, layer_bytes, kind, plain),
                                 "cudaMemcpyAsync"));
    }
    RETURN_IF_ERROR(obs->Stop(plain));
    return obs->ElapsedMs();
  };
  ASSIGN_OR_RETURN(double h2d_ms, MedianOf([&] { return contiguous(cudaMemcpyHostToDevice); }));
  const double h2d = GBps(s.bytes, h2d_ms);
  results->push_back({"pinned_to_gpu_contiguous", h2d, "GB/s", "", 0});

  // (b) the scatter kernel, per SM count.
  std::vector<gpu::LocalRegion> local;
  for (size_t i = 0; i < s.regions.size(); ++i)
    local.push_back({s.regions[i], s.kv.region_sizes[i]});
  std::unique_ptr<gpu::IoStream> main_io;
  std::unique_ptr<gpu::CudaIpcMemory> main_mem;
  for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_sms), ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
    uint32_t sms = 0, ctas = 0;
    if (!absl::SimpleAtoi(parts[0], &sms) ||
        (parts.size() > 1 && !absl::SimpleAtoi(parts[1], &ctas))) {
      return absl::InvalidArgumentError("--sms");
    }
    ASSIGN_OR_RETURN(auto io, gpu::IoStream::Create({0, sms, ctas}));
    ASSIGN_OR_RETURN(auto mem, gpu::CudaIpcMemory::WrapLocal(s.kv.layout, local,
                                                             {s.staging->staging()}, io.get()));
    std::printf("I/O stream for %u SMs: %s, %u CTAs\n", sms, io->description().c_str(), io->ctas());
    ASSIGN_OR_RETURN(double ms, MedianOf([&]() -> absl::StatusOr<double> {
                       RETURN_IF_ERROR(obs->Start());
                       for (uint32_t l = 0; l < s.layers; ++l)
                         RETURN_IF_ERROR(mem->EnqueueScatter(s.ops[l]));
                       RETURN_IF_ERROR(obs->Stop(io->stream()));
                       return obs->ElapsedMs();
                     }));
    const std::string domain =
        sms == 0 ? "all_sms" : absl::StrCat("sms", sms, io->is_green() ? "" : "_not_green");
    results->push_back({absl::StrCat("scatter_random_blocks_", domain, "_ctas", io->ctas()),
                        GBps(s.bytes, ms), "GB/s", "pinned_to_gpu_contiguous", h2d});
    if (sms == absl::GetFlag(FLAGS_main_sms) && main_mem == nullptr) {
      main_io = std::move(io);
      main_mem = std::move(mem);
    }
  }
  if (main_mem == nullptr) return absl::InvalidArgumentError("--main_sms must be one of --sms");
  ASSIGN_OR_RETURN(size_t bad, Verify(s, 2048));
  results->push_back(
      {"scatter_verify_mismatches_of_2048_sampled", static_cast<double>(bad), "objects", "", 0});

  // (c) naive: one cudaMemcpyAsync per object, on an ordinary stream.
  ASSIGN_OR_RETURN(double naive_ms, MedianOf([&]() -> absl::StatusOr<double> {
                     RETURN_IF_ERROR(obs->Start());
                     for (const engine::CopyOp& op : s.all_ops) {
                       const engine::ObjectPlacement& p = s.kv.layout.placements[op.object];
                       uint8_t* dst = static_cast<uint8_t*>(s.regions[p.region]) + p.offset +
                                      op.block * p.block_stride;
                       RETURN_IF_ERROR(CudaStatus(
                           cudaMemcpyAsync(dst, op.staging, s.obj, cudaMemcpyHostToDevice, plain),
                           "cudaMemcpyAsync"));
                     }
                     RETURN_IF_ERROR(obs->Stop(plain));
                     return obs->ElapsedMs();
                   }));
  results->push_back(
      {"memcpy_per_object", GBps(s.bytes, naive_ms), "GB/s", "pinned_to_gpu_contiguous", h2d});

  // (d) pipelining through ready words, observed from an "engine" stream.
  ASSIGN_OR_RETURN(auto words, gpu::ReadyWordArray::Create(0, s.layers));
  ASSIGN_OR_RETURN(auto signals,
                   gpu::ReadyWords::WrapLocal(words->word(0), s.layers, main_io.get()));
  std::vector<cudaEvent_t> ready(s.layers);
  for (auto& e : ready) RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&e), "event"));
  uint32_t ticket = 0;
  auto pipeline = [&](bool layerwise, bool want_first) -> absl::StatusOr<double> {
    ++ticket;
    RETURN_IF_ERROR(obs->Start());
    for (uint32_t l = 0; l < s.layers; ++l) {
      RETURN_IF_ERROR(gpu::WaitLayer(obs->stream(), words->word(l), ticket));
      RETURN_IF_ERROR(CudaStatus(cudaEventRecord(ready[l], obs->stream()), "record"));
    }
    if (layerwise) {
      for (uint32_t l = 0; l < s.layers; ++l) {
        RETURN_IF_ERROR(main_mem->EnqueueScatter(s.ops[l]));
        RETURN_IF_ERROR(signals->Signal(l, ticket));
      }
    } else {
      RETURN_IF_ERROR(main_mem->EnqueueScatter(s.all_ops));
      for (uint32_t l = 0; l < s.layers; ++l) RETURN_IF_ERROR(signals->Signal(l, ticket));
    }
    return obs->ElapsedMs(want_first ? ready[0] : ready[s.layers - 1]);
  };
  ASSIGN_OR_RETURN(double lw_first, MedianOf([&] { return pipeline(true, true); }));
  ASSIGN_OR_RETURN(double lw_all, MedianOf([&] { return pipeline(true, false); }));
  ASSIGN_OR_RETURN(double one_first, MedianOf([&] { return pipeline(false, true); }));
  ASSIGN_OR_RETURN(double one_all, MedianOf([&] { return pipeline(false, false); }));
  results->push_back(
      {"layerwise_layer0_ready", lw_first, "ms", "one_piece_layer0_ready", one_first});
  results->push_back(
      {"layerwise_all_layers_ready", lw_all, "ms", "one_piece_all_layers_ready", one_all});

  // (e) Store direction: contiguous GPU -> pinned, and the gather kernel.
  ASSIGN_OR_RETURN(double d2h_ms, MedianOf([&] { return contiguous(cudaMemcpyDeviceToHost); }));
  const double d2h = GBps(s.bytes, d2h_ms);
  results->push_back({"gpu_to_pinned_contiguous", d2h, "GB/s", "", 0});
  ASSIGN_OR_RETURN(double gather_ms, MedianOf([&]() -> absl::StatusOr<double> {
                     RETURN_IF_ERROR(obs->Start());
                     for (uint32_t l = 0; l < s.layers; ++l)
                       RETURN_IF_ERROR(main_mem->EnqueueGather(s.ops[l]));
                     RETURN_IF_ERROR(obs->Stop(main_io->stream()));
                     return obs->ElapsedMs();
                   }));
  results->push_back(
      {absl::StrCat("gather_random_blocks_sms", main_io->sm_count(), "_ctas", main_io->ctas()),
       GBps(s.bytes, gather_ms), "GB/s", "gpu_to_pinned_contiguous", d2h});
  return absl::OkStatus();
}

void Report(const std::vector<Result>& results, const std::string& command) {
  std::string machine = absl::GetFlag(FLAGS_machine);
  if (machine.empty()) {
    auto dev = gpu::Probe(0);
    int driver = 0;
    cudaDriverGetVersion(&driver);
    machine = absl::StrCat(dev.ok() ? dev->name : "?", ", ", dev.ok() ? dev->sm_count : 0,
                           " SMs, CUDA driver ", driver);
  }
  const std::string date = tutti::bench::UtcNow();
  std::ofstream out;
  if (!absl::GetFlag(FLAGS_out).empty()) out.open(absl::GetFlag(FLAGS_out), std::ios::app);
  std::printf("\n%-44s %12s %-6s %28s %8s\n", "metric", "value", "unit", "baseline", "ratio");
  for (const Result& r : results) {
    const bool has_base = !r.baseline_name.empty() && r.baseline_value > 0;
    const double ratio = has_base ? r.value / r.baseline_value : 0;
    std::printf("%-44s %12.3f %-6s %28s %8s\n", r.metric.c_str(), r.value, r.unit.c_str(),
                has_base ? absl::StrCat(r.baseline_value).c_str() : "-",
                has_base ? absl::StrFormat("%.3f", ratio).c_str() : "-");
    if (!out.is_open()) continue;
    Result line = r;
    if (!has_base) line.baseline_name.clear();
    out << JsonLine("gpu_copy_bench", line, machine, date, command) << "\n";
  }
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  const std::string command = tutti::bench::CommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  std::vector<tutti::bench::Result> results;
  absl::Status s = tutti::bench::Run(&results);
  tutti::bench::Report(results, command);
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_copy_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

// GPU-initiated NVMe submission against the software controller model (no NVMe device):
//  - the command rate the GPU side sustains: 4 KiB reads issued, completed and scattered by the
//    read kernel (gpu_queue.h), per second. A PROTOCOL RATE over host memory served by one model
//    thread, not a device speed;
//  - the CPU time per GB of the thread that drives the reads, GPU-initiated (it launches and
//    waits, blocking sync) against the CPU-driven path in the same run (QueuePair::Submit/Poll on
//    that thread, then one cudaMemcpyAsync per piece from the bounce ring to the engine).
// Both paths read the same plan from the same model into the same device memory and verify a
// sample of the bytes. Never asserts on time. JSON lines (bench/jsonl.h) to --out; a table last.
#include <cuda_runtime.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/jsonl.h"
#include "bench/nvme_gpu/gpu_queue.h"
#include "common/status_macros.h"
#include "daemon/io/nvme/controller.h"
#include "daemon/io/nvme/model/controller_model.h"
#include "daemon/io/nvme/queue_pair.h"
#include "gpu/cuda_status.h"
#include "gpu/probe.h"

ABSL_FLAG(uint32_t, rate_ios, 200000, "4 KiB reads for the command-rate figure");
ABSL_FLAG(uint32_t, bulk_mib, 1024, "MiB read per repetition for the CPU-time-per-GB figure");
ABSL_FLAG(uint32_t, io_kib, 128, "I/O size for the CPU-time-per-GB figure");
ABSL_FLAG(uint32_t, piece_kib, 32, "engine pieces per I/O: io_kib / piece_kib (one KV object)");
ABSL_FLAG(uint32_t, depth, 1024, "queue entries; slots = depth - 1 commands in flight");
ABSL_FLAG(uint32_t, threads, 256, "the read kernel's CTA size");
ABSL_FLAG(int, reps, 3, "repetitions per figure (median reported)");
ABSL_FLAG(std::string, out, "", "JSON lines file to append results to");
ABSL_FLAG(std::string, machine, "", "machine name for the results (default: the GPU's name)");

namespace tutti::bench {
namespace {

using io::nvme::Controller;
using io::nvme::ControllerModel;
using io::nvme::NvmeOp;
using io::nvme::NvmeRequest;
using io::nvme::QueuePair;
using io::nvme::gpu::GpuPiece;
using io::nvme::gpu::GpuPlan;
using io::nvme::gpu::GpuQueue;
using io::nvme::gpu::GpuReadIo;

constexpr uint32_t kLba = 4096;

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Measure {
  double wall_s = 0, cpu_s = 0;
};

// `n` reads of `io_bytes` at random LBAs, pieces of `piece_bytes` to a random permutation of the
// engine's chunks, over `layers` layers.
GpuPlan MakePlan(uint32_t n, uint32_t io_bytes, uint32_t piece_bytes, uint64_t ns_blocks,
                 uint32_t layers, uint32_t seed) {
  GpuPlan plan;
  plan.num_layers = layers;
  const uint32_t per = io_bytes / piece_bytes;
  std::vector<uint32_t> chunks(uint64_t{n} * per);
  std::iota(chunks.begin(), chunks.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(chunks.begin(), chunks.end(), rng);
  std::uniform_int_distribution<uint64_t> lba(0, (ns_blocks - io_bytes / kLba) / 8);
  for (uint32_t i = 0; i < n; ++i) {
    GpuReadIo io{lba(rng) * 8, io_bytes / kLba, i * layers / n,
                 static_cast<uint32_t>(plan.pieces.size()), per};
    for (uint32_t k = 0; k < per; ++k) {
      plan.pieces.push_back(GpuPiece{k * piece_bytes, piece_bytes,
                                     uint64_t{chunks[uint64_t{i} * per + k]} * piece_bytes});
    }
    plan.ios.push_back(io);
  }
  return plan;
}

class Bench {
 public:
  absl::Status Init() {
    io::nvme::ModelOptions m;
    m.namespace_blocks = 262144;  // 1 GiB
    m.max_queue_entries = absl::GetFlag(FLAGS_depth);
    ASSIGN_OR_RETURN(model_, ControllerModel::Create(m));
    for (uint64_t i = 0; i < (m.namespace_blocks * kLba) / 8; ++i) {
      reinterpret_cast<uint64_t*>(model_->namespace_data())[i] = i * 0x9E3779B97F4A7C15ull;
    }
    io::nvme::ControllerOptions c;
    c.io_queues = 2;  // 0: the GPU's, 1: the CPU-driven baseline's
    c.io_queue_depth = absl::GetFlag(FLAGS_depth);
    ASSIGN_OR_RETURN(controller_, Controller::Create(c, model_.get(), model_.get()));
    io::nvme::gpu::GpuQueueOptions q;
    q.slots = c.io_queue_depth - 1;
    q.slot_bytes = std::max<uint32_t>(absl::GetFlag(FLAGS_io_kib) * 1024, kLba);
    q.threads = absl::GetFlag(FLAGS_threads);
    ASSIGN_OR_RETURN(gpu_, GpuQueue::Create(q, controller_.get(), model_.get()));
    slots_ = q.slots;
    slot_bytes_ = q.slot_bytes;
    ASSIGN_OR_RETURN(cpu_bounce_, model_->Allocate(uint64_t{slots_} * slot_bytes_));
    ASSIGN_OR_RETURN(cpu_region_, controller_->Register(*cpu_bounce_));
    CUDA_RETURN_IF_ERROR(
        cudaHostRegister(cpu_bounce_->host(), cpu_bounce_->size(), cudaHostRegisterDefault));
    engine_bytes_ = std::max(uint64_t{absl::GetFlag(FLAGS_bulk_mib)} << 20,
                             uint64_t{absl::GetFlag(FLAGS_rate_ios)} * kLba);
    CUDA_RETURN_IF_ERROR(cudaMalloc(&engine_, engine_bytes_));
    CUDA_RETURN_IF_ERROR(cudaMalloc(&words_, 64 * sizeof(uint32_t)));
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }
  ~Bench() {
    if (cpu_bounce_ != nullptr) cudaHostUnregister(cpu_bounce_->host());
    if (engine_ != nullptr) cudaFree(engine_);
    if (words_ != nullptr) cudaFree(words_);
  }

  absl::StatusOr<Measure> Gpu(const GpuPlan& plan) {
    CUDA_RETURN_IF_ERROR(cudaMemset(engine_, 0, engine_bytes_));
    const double w0 = WallSeconds(), c0 = ThreadCpuSeconds();
    ASSIGN_OR_RETURN(auto out,
                     gpu_->Read(plan, engine_, engine_bytes_, words_, ++ticket_, stream_));
    Measure m{WallSeconds() - w0, ThreadCpuSeconds() - c0};
    if (!out.ok())
      return absl::InternalError(
          absl::StrCat("GPU read: ", out.summary.done, " of ", plan.ios.size(), " I/Os done"));
    RETURN_IF_ERROR(Verify(plan));
    return m;
  }

  // The CPU-driven path: the same plan through QueuePair on this thread, bounce slot per command,
  // each landed I/O's pieces copied to the engine (one cudaMemcpyAsync each).
  absl::StatusOr<Measure> Cpu(const GpuPlan& plan) {
    CUDA_RETURN_IF_ERROR(cudaMemset(engine_, 0, engine_bytes_));
    const double w0 = WallSeconds(), c0 = ThreadCpuSeconds();
    QueuePair* qp = controller_->queue_pair(1);
    std::vector<NvmeRequest> batch(slots_);
    for (size_t first = 0; first < plan.ios.size(); first += slots_) {
      const size_t n = std::min<size_t>(slots_, plan.ios.size() - first);
      for (size_t k = 0; k < n; ++k) {
        const GpuReadIo& io = plan.ios[first + k];
        batch[k] =
            NvmeRequest{NvmeOp::kRead, io.slba, io.blocks, cpu_region_.get(), k * slot_bytes_};
      }
      qp->Execute(absl::MakeSpan(batch.data(), n));
      for (size_t k = 0; k < n; ++k) {
        if (batch[k].result < 0) return absl::InternalError("CPU-driven read failed");
        const GpuReadIo& io = plan.ios[first + k];
        for (uint32_t p = 0; p < io.num_pieces; ++p) {
          const GpuPiece& piece = plan.pieces[io.first_piece + p];
          CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
              engine_ + piece.dst_offset, cpu_bounce_->host() + k * slot_bytes_ + piece.src_offset,
              piece.len, cudaMemcpyHostToDevice, stream_));
        }
      }
      CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the slots are reused next batch
    }
    Measure m{WallSeconds() - w0, ThreadCpuSeconds() - c0};
    RETURN_IF_ERROR(Verify(plan));
    return m;
  }

  uint64_t ns_blocks() const { return model_->options().namespace_blocks; }

 private:
  // Every 97th I/O's first piece against the namespace.
  absl::Status Verify(const GpuPlan& plan) {
    std::vector<uint8_t> got;
    for (size_t i = 0; i < plan.ios.size(); i += 97) {
      const GpuPiece& p = plan.pieces[plan.ios[i].first_piece];
      got.resize(p.len);
      CUDA_RETURN_IF_ERROR(
          cudaMemcpy(got.data(), engine_ + p.dst_offset, p.len, cudaMemcpyDeviceToHost));
      const uint8_t* want = model_->namespace_data() + plan.ios[i].slba * kLba + p.src_offset;
      if (std::memcmp(got.data(), want, p.len) != 0) {
        return absl::DataLossError(absl::StrCat("I/O ", i, ": engine bytes differ"));
      }
    }
    return absl::OkStatus();
  }

  std::unique_ptr<ControllerModel> model_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<GpuQueue> gpu_;
  std::unique_ptr<io::nvme::DmaBuffer> cpu_bounce_;
  std::unique_ptr<io::nvme::RegisteredRegion> cpu_region_;
  uint32_t slots_ = 0, slot_bytes_ = 0;
  uint8_t* engine_ = nullptr;
  uint64_t engine_bytes_ = 0;
  uint32_t* words_ = nullptr;
  uint32_t ticket_ = 0;
  cudaStream_t stream_ = nullptr;
};

absl::Status Run(std::vector<Result>* results) {
  // The waiting thread sleeps in cudaStreamSynchronize instead of spinning: its CPU time is then
  // what the path costs.
  CUDA_RETURN_IF_ERROR(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync | cudaDeviceMapHost));
  Bench b;
  RETURN_IF_ERROR(b.Init());
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  // Command rate: 4 KiB reads, one piece each.
  const uint32_t n = absl::GetFlag(FLAGS_rate_ios);
  GpuPlan small = MakePlan(n, kLba, kLba, b.ns_blocks(), 32, 1);
  std::vector<double> g_rate, c_rate;
  for (int r = 0; r < reps; ++r) {
    ASSIGN_OR_RETURN(Measure g, b.Gpu(small));
    ASSIGN_OR_RETURN(Measure c, b.Cpu(small));
    g_rate.push_back(n / g.wall_s);
    c_rate.push_back(n / c.wall_s);
  }
  results->push_back({"gpu_initiated_4k_commands_per_s_vs_model", Median(g_rate), "cmd/s",
                      "cpu_driven_4k_commands_per_s_vs_model", Median(c_rate),
                      "protocol rate against the software controller model (one host thread "
                      "serving host memory), not a device speed"});
  // CPU time per GB: io_kib reads, piece_kib pieces.
  const uint32_t io_bytes = absl::GetFlag(FLAGS_io_kib) * 1024;
  const uint32_t piece = std::min(io_bytes, absl::GetFlag(FLAGS_piece_kib) * 1024);
  const uint32_t bulk_ios =
      static_cast<uint32_t>((uint64_t{absl::GetFlag(FLAGS_bulk_mib)} << 20) / io_bytes);
  GpuPlan bulk = MakePlan(bulk_ios, io_bytes, piece, b.ns_blocks(), 32, 2);
  const double gb = static_cast<double>(bulk_ios) * io_bytes / 1e9;
  std::vector<double> g_cpu, c_cpu, g_gbps, c_gbps;
  for (int r = 0; r < reps; ++r) {
    ASSIGN_OR_RETURN(Measure g, b.Gpu(bulk));
    ASSIGN_OR_RETURN(Measure c, b.Cpu(bulk));
    g_cpu.push_back(g.cpu_s * 1e3 / gb);
    c_cpu.push_back(c.cpu_s * 1e3 / gb);
    g_gbps.push_back(gb / g.wall_s);
    c_gbps.push_back(gb / c.wall_s);
  }
  const std::string shape =
      absl::StrCat(io_bytes / 1024, "KiB reads, ", piece / 1024, "KiB pieces, ", bulk_ios, " I/Os");
  results->push_back({"gpu_initiated_driver_thread_cpu_ms_per_gb", Median(g_cpu), "ms/GB",
                      "cpu_driven_driver_thread_cpu_ms_per_gb", Median(c_cpu),
                      absl::StrCat("CPU time of the thread driving the reads (the model's own "
                                   "thread excluded); ",
                                   shape)});
  results->push_back({"gpu_initiated_gb_per_s_vs_model", Median(g_gbps), "GB/s",
                      "cpu_driven_gb_per_s_vs_model", Median(c_gbps),
                      absl::StrCat("against the model (memcpy from host memory), not a device "
                                   "speed; ",
                                   shape)});
  return absl::OkStatus();
}

void Report(const std::vector<Result>& results, const std::string& command) {
  std::string machine = absl::GetFlag(FLAGS_machine);
  if (machine.empty()) {
    auto dev = gpu::Probe(0);
    machine = dev.ok() ? dev->name : "?";
  }
  const std::string date = UtcNow();
  std::ofstream out;
  if (!absl::GetFlag(FLAGS_out).empty()) out.open(absl::GetFlag(FLAGS_out), std::ios::app);
  std::printf("\n%-44s %12s %-6s %40s %12s %8s\n", "metric", "value", "unit", "baseline",
              "baseline_v", "ratio");
  for (const Result& r : results) {
    std::printf("%-44s %12.3f %-6s %40s %12.3f %8.3f\n", r.metric.c_str(), r.value, r.unit.c_str(),
                r.baseline_name.c_str(), r.baseline_value, r.value / r.baseline_value);
    if (out.is_open()) out << JsonLine("gpu_nvme_bench", r, machine, date, command) << "\n";
  }
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  const std::string command = tutti::bench::CommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  std::vector<tutti::bench::Result> results;
  absl::Status s = tutti::bench::Run(&results);
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_nvme_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  tutti::bench::Report(results, command);
  return 0;
}

// raw_read_to_gpu: the least any reader of an array of files into GPU memory must do, for
// bench/ssd_array.py to set beside tuttid's retrieve: O_DIRECT random reads of one request size
// (one io_uring and one thread per file, `qd` in flight each) into pinned host slots, each
// completed read copied at once to the GPU by the copy engine (cudaMemcpyAsync on the thread's
// own stream) and its slot reused once that copy has finished. No checks, no layout: a ceiling.
//
//   raw_read_to_gpu [--io_bytes=1048576] [--qd=16] [--slots=32] [--seconds=3] [--no_gpu] [--async]
//                 FILE...
//
// --slots is the pinned slots per file (at least qd): few slots keep the staging hot in the CPU's
// caches, many make it as cold as a consumer's that rotates through a large staging pool.
// --no_gpu reads into the same slots without the copies. Prints one JSON object on stdout (files,
// io_bytes, qd, slots, bytes, seconds, gbps, per-file GB/s, CPU seconds); messages on stderr.
// Exit status: 0, 1 when an I/O or CUDA call failed (named), 2 for bad arguments.
#include <fcntl.h>
#include <liburing.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/jsonl.h"
#include "cuda_runtime_api.h"

ABSL_FLAG(uint64_t, io_bytes, 1 << 20, "request size, a multiple of 4096");
ABSL_FLAG(uint32_t, qd, 16, "reads in flight per file");
ABSL_FLAG(uint32_t, slots, 32, "pinned slots of io_bytes per file (at least qd)");
ABSL_FLAG(double, seconds, 3.0, "how long to run");
ABSL_FLAG(bool, no_gpu, false, "read only: no copies to the GPU");
ABSL_FLAG(bool, async, false,
          "IOSQE_ASYNC on every read: io_uring's workers copy (on tmpfs, where reads would "
          "otherwise complete inline on this file's one thread)");
ABSL_FLAG(uint64_t, device_bytes, 64 << 20, "GPU buffer per file the copies rotate through");

namespace {

using Clock = std::chrono::steady_clock;

std::string CudaError(const char* what, cudaError_t e) {
  return absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

struct Result {
  uint64_t bytes = 0;
  double seconds = 0;
  std::string error;
};

// One file: its ring, its slots, its stream. Runs until `deadline`.
void RunFile(const std::string& path, uint64_t io_bytes, uint32_t qd, uint32_t slots, bool gpu,
             bool async_reads, uint64_t device_bytes, Clock::time_point start,
             Clock::time_point deadline, uint64_t seed, Result* out) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) {
    out->error = absl::StrCat("open ", path, " O_DIRECT: ", std::strerror(errno));
    return;
  }
  struct stat st;
  fstat(fd, &st);
  const uint64_t span_slots = static_cast<uint64_t>(st.st_size) / io_bytes;
  if (span_slots == 0) {
    out->error = absl::StrCat(path, ": smaller than one request");
    close(fd);
    return;
  }
  uint8_t* host = nullptr;
  uint8_t* dev = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> events(slots, nullptr);
  cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&host), uint64_t{slots} * io_bytes,
                                cudaHostAllocPortable);
  if (e != cudaSuccess) {
    out->error = CudaError("cudaHostAlloc", e);
    close(fd);
    return;
  }
  std::memset(host, 1, uint64_t{slots} * io_bytes);
  if (gpu) {
    if ((e = cudaMalloc(reinterpret_cast<void**>(&dev), device_bytes)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) {
      out->error = CudaError("cudaMalloc/cudaStreamCreate", e);
      return;
    }
    for (auto& ev : events) {
      if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) {
        out->error = CudaError("cudaEventCreate", e);
        return;
      }
    }
  }
  io_uring ring;
  int rc = io_uring_queue_init(qd, &ring, 0);
  if (rc < 0) {
    out->error = absl::StrCat("io_uring_queue_init: ", std::strerror(-rc));
    return;
  }
  std::mt19937_64 rng(seed);
  std::deque<uint32_t> free_slots;  // no read, no copy pending
  std::deque<uint32_t> copying;     // copy enqueued, oldest first
  std::vector<bool> copy_pending(slots, false);
  for (uint32_t i = 0; i < slots; ++i) free_slots.push_back(i);
  uint64_t dev_pos = 0;
  uint32_t in_flight = 0;
  bool stopping = false;
  // Moves finished copies' slots back to free; waits for the oldest when none is free.
  auto reclaim = [&](bool must) -> bool {
    while (!copying.empty()) {
      const uint32_t s = copying.front();
      cudaError_t q = cudaEventQuery(events[s]);
      if (q == cudaErrorNotReady) {
        if (!must || !free_slots.empty()) return true;
        q = cudaEventSynchronize(events[s]);
      }
      if (q != cudaSuccess) {
        out->error = CudaError("copy", q);
        return false;
      }
      copying.pop_front();
      free_slots.push_back(s);
    }
    return true;
  };
  auto issue = [&] {
    if (stopping || Clock::now() >= deadline) {
      stopping = true;
      return;
    }
    if (free_slots.empty() && !reclaim(true)) {
      stopping = true;
      return;
    }
    const uint32_t s = free_slots.front();
    free_slots.pop_front();
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read(sqe, fd, host + uint64_t{s} * io_bytes, static_cast<unsigned>(io_bytes),
                       (rng() % span_slots) * io_bytes);
    if (async_reads) sqe->flags |= IOSQE_ASYNC;
    io_uring_sqe_set_data64(sqe, s);
    ++in_flight;
  };
  for (uint32_t i = 0; i < qd; ++i) issue();
  while (in_flight > 0) {
    rc = io_uring_submit_and_wait(&ring, 1);
    if (rc < 0 && rc != -EINTR) {
      out->error = absl::StrCat("io_uring_submit_and_wait: ", std::strerror(-rc));
      break;
    }
    unsigned head, seen = 0, done = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++seen;
      --in_flight;
      const uint32_t s = static_cast<uint32_t>(cqe->user_data);
      if (cqe->res != static_cast<int>(io_bytes)) {
        if (out->error.empty()) {
          out->error = absl::StrCat("read: ", cqe->res < 0 ? std::strerror(-cqe->res) : "short");
        }
        stopping = true;
        free_slots.push_back(s);
        continue;
      }
      out->bytes += io_bytes;
      ++done;
      if (!gpu) {
        free_slots.push_back(s);
        continue;
      }
      if (dev_pos + io_bytes > device_bytes) dev_pos = 0;
      cudaError_t c = cudaMemcpyAsync(dev + dev_pos, host + uint64_t{s} * io_bytes, io_bytes,
                                      cudaMemcpyHostToDevice, stream);
      if (c == cudaSuccess) c = cudaEventRecord(events[s], stream);
      if (c != cudaSuccess) {
        out->error = CudaError("cudaMemcpyAsync", c);
        stopping = true;
        continue;
      }
      dev_pos += io_bytes;
      copying.push_back(s);
    }
    io_uring_cq_advance(&ring, seen);
    if (gpu && !reclaim(false)) stopping = true;
    for (unsigned i = 0; i < done; ++i) issue();
  }
  if (gpu) {
    const cudaError_t c = cudaStreamSynchronize(stream);
    if (c != cudaSuccess && out->error.empty()) out->error = CudaError("final sync", c);
  }
  out->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  io_uring_queue_exit(&ring);
  close(fd);
}

double CpuSeconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = tutti::bench::CommandLine(argc, argv);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  const uint64_t io_bytes = absl::GetFlag(FLAGS_io_bytes);
  const uint32_t qd = absl::GetFlag(FLAGS_qd);
  const uint32_t slots = absl::GetFlag(FLAGS_slots);
  const bool gpu = !absl::GetFlag(FLAGS_no_gpu);
  const uint64_t device_bytes = absl::GetFlag(FLAGS_device_bytes);
  std::vector<std::string> files(rest.begin() + 1, rest.end());
  if (files.empty() || io_bytes == 0 || io_bytes % 4096 != 0 || qd == 0 || slots < qd ||
      device_bytes < io_bytes) {
    std::fprintf(stderr,
                 "usage: raw_read_to_gpu [--io_bytes=N (x4096)] [--qd=N] [--slots=N>=qd] "
                 "[--seconds=S] [--no_gpu] [--device_bytes=N] FILE...\n");
    return 2;
  }
  if (gpu) {
    const cudaError_t e = cudaFree(nullptr);
    if (e != cudaSuccess) {
      std::fprintf(stderr, "%s\n", CudaError("CUDA init", e).c_str());
      return 1;
    }
  }
  std::vector<Result> results(files.size());
  std::vector<std::thread> threads;
  const double cpu0 = CpuSeconds();
  const auto start = Clock::now();
  const Clock::time_point deadline =
      start + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
  for (size_t i = 0; i < files.size(); ++i) {
    threads.emplace_back(RunFile, files[i], io_bytes, qd, slots, gpu, absl::GetFlag(FLAGS_async),
                         device_bytes, start, deadline, 1000003 * (i + 1), &results[i]);
  }
  for (auto& t : threads) t.join();
  const double cpu = CpuSeconds() - cpu0;
  uint64_t bytes = 0;
  double seconds = 0;
  std::vector<std::string> per_file;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!results[i].error.empty()) {
      std::fprintf(stderr, "%s: %s\n", files[i].c_str(), results[i].error.c_str());
      return 1;
    }
    bytes += results[i].bytes;
    seconds = std::max(seconds, results[i].seconds);
    per_file.push_back(absl::StrCat(results[i].bytes / 1e9 / results[i].seconds));
  }
  std::printf(
      "{\"tool\":\"raw_read_to_gpu\",\"files\":%zu,\"io_bytes\":%lu,\"qd\":%u,\"slots\":%u,"
      "\"to_gpu\":%s,\"async\":%s,\"bytes\":%lu,\"seconds\":%.3f,\"gbps\":%.2f,\"file_gbps\":[%s],"
      "\"cpu_seconds\":%.2f,\"command\":%s}\n",
      files.size(), io_bytes, qd, slots, gpu ? "true" : "false",
      absl::GetFlag(FLAGS_async) ? "true" : "false", bytes, seconds, bytes / 1e9 / seconds,
      absl::StrJoin(per_file, ",").c_str(), cpu, tutti::bench::JsonString(command).c_str());
  return 0;
}

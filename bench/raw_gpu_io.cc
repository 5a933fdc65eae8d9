// raw_gpu_io: the least any mover of data between an array of files and GPU memory must do, for
// bench/ssd_array.py to set beside tuttid in the same run. Reads: O_DIRECT random reads of one
// request size (one io_uring and one thread per file, `qd` in flight each) into pinned host slots,
// each landed read copied at once to the GPU by the copy engine (cudaMemcpyAsync on the thread's
// own stream), its slot reused once that copy has finished. Writes: the other way round, each slot
// copied from the GPU, then written; fdatasync at the end, inside the timing. No checks, no
// layout, no journal: a ceiling. Copies (--op=copy): the reads' copies alone, without the reads:
// each thread keeps `qd` copies of one slot each in flight from its slots to the GPU, so what the
// copy engines give chunks of io_bytes from several threads is seen apart from the reads (the
// FILEs are not opened then, only counted: one thread each).
//
//   raw_gpu_io [--op=read|write|copy] [--io_bytes=1048576] [--qd=16] [--slots=32] [--seconds=3]
//              [--no_gpu] [--async] [--device_bytes=N] [--staging=hostalloc|register]
//              [--fixed] [--lifo] FILE...
//
// --slots is the pinned slots per file (at least qd): few keep the staging hot in the CPU's
// caches, many make it as cold as a consumer's that rotates through a large staging pool.
// --no_gpu does the same I/O without the copies. The rest tell what of tuttid's way costs what:
// --staging=register takes the slots as tuttid takes its staging (2 MiB aligned, huge pages
// advised, cudaHostRegister) instead of cudaHostAlloc; --fixed registers them with the ring
// (READ_FIXED / WRITE_FIXED, as tuttid); --lifo reuses the slot freed last first (tuttid's bounce
// slots) instead of the oldest; --sequential reads in order from a random start instead of at
// random offsets; --burst=N submits reads only N at a time, in one io_uring_enter;
// --reads_per_copy=N makes each slot N requests long, lands N reads of io_bytes back to back in it
// and copies the slot to the GPU in one copy once all N have landed (tuttid's batches: reads of at
// most datapath.max_read_bytes, one copy of datapath.read_post_bytes). Offsets are
// random multiples of io_bytes within each file's size. Prints one JSON object on stdout (op,
// files, io_bytes, qd, slots, the options, bytes, seconds, gbps, per-file GB/s, CPU seconds);
// messages on stderr. Exit status: 0, 1 when an I/O or CUDA call failed (named), 2 for bad
// arguments.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
#include "bench/start_line.h"
#include "bench/worker_sampler.h"
#include "cuda_runtime_api.h"

ABSL_FLAG(std::string, op, "read", "read | write | copy (the copies to the GPU alone)");
ABSL_FLAG(uint64_t, io_bytes, 1 << 20, "request size, a multiple of 4096");
ABSL_FLAG(uint32_t, qd, 16, "reads in flight per file");
ABSL_FLAG(uint32_t, slots, 32,
          "pinned slots per file, each io_bytes x reads_per_copy (at least qd where that is 1)");
ABSL_FLAG(double, seconds, 3.0, "how long to run");
ABSL_FLAG(bool, no_gpu, false, "the I/O alone: no copies to or from the GPU");
ABSL_FLAG(bool, async, false,
          "IOSQE_ASYNC on every request: io_uring's workers copy (on tmpfs, where reads "
          "would otherwise complete inline on this file's one thread)");
ABSL_FLAG(uint64_t, device_bytes, 64 << 20, "GPU buffer per file the copies rotate through");
ABSL_FLAG(std::string, staging, "hostalloc", "hostalloc | register (huge pages, cudaHostRegister)");
ABSL_FLAG(bool, fixed, false, "register the slots with the ring: READ_FIXED / WRITE_FIXED");
ABSL_FLAG(bool, lifo, false, "reuse the slot freed last first");
ABSL_FLAG(uint32_t, burst, 1,
          "reads: submit only once this many slots of the queue depth are free (or none is in "
          "flight), all in one io_uring_enter");
ABSL_FLAG(bool, sequential, false,
          "offsets in order from a random start (as a layer's merged reads walk a file) instead "
          "of random");
ABSL_FLAG(uint32_t, reads_per_copy, 1,
          "reads: each slot holds this many requests of io_bytes, read back to back into it and "
          "copied to the GPU in one copy once all have landed (at most qd)");

namespace {

using Clock = std::chrono::steady_clock;

std::string CudaError(const char* what, cudaError_t e) {
  return absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

double CpuSeconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

struct Result {
  uint64_t bytes = 0;
  double seconds = 0;
  std::string error;
};

struct FileOptions {
  uint64_t io_bytes = 0;
  uint32_t qd = 0;
  uint32_t slots = 0;
  bool write = false;
  bool copy_only = false;
  bool gpu = true;
  bool async = false;
  uint64_t device_bytes = 0;
  bool host_register = false;
  bool fixed = false;
  bool lifo = false;
  bool sequential = false;
  uint32_t burst = 1;
  uint32_t reads_per_copy = 1;  // requests a slot holds; a slot is io_bytes times this
  double seconds = 0;
  tutti::bench::StartLine* start_line = nullptr;  // every file's run arrives, opened or not
  double* cpu_at_start = nullptr;  // one run's: the process's CPU seconds at the start line
  uint64_t seed = 0;
};

// One file's ring, pinned slots, GPU buffer, stream and one event per slot.
class FileRun {
 public:
  FileRun(const std::string& path, const FileOptions& o, Result* out)
      : path_(path),
        o_(o),
        out_(out),
        slot_bytes_(o.io_bytes * o.reads_per_copy),
        events_(o.slots, nullptr),
        landed_(o.slots, 0) {}

  ~FileRun() {
    if (ring_ok_) io_uring_queue_exit(&ring_);
    for (cudaEvent_t e : events_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (dev_ != nullptr) cudaFree(dev_);
    if (host_ != nullptr) {
      if (o_.gpu && o_.host_register) cudaHostUnregister(host_);
      o_.gpu && !o_.host_register ? (void)cudaFreeHost(host_) : free(host_);
    }
    if (fd_ >= 0) close(fd_);
  }

  void Run() {
    const bool opened = Open();
    start_ = o_.start_line->Arrive();  // set-up (pinning, cudaMalloc) outside the timing
    if (o_.cpu_at_start != nullptr) *o_.cpu_at_start = CpuSeconds();
    deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(o_.seconds));
    if (!opened) return;
    if (o_.copy_only) {
      Copies();
    } else if (o_.write) {
      Writes();
    } else {
      Reads();
    }
    if (o_.gpu) Check(cudaStreamSynchronize(stream_), "final sync");
    if (o_.write && out_->error.empty() && fdatasync(fd_) != 0) {
      out_->error = absl::StrCat("fdatasync: ", std::strerror(errno));
    }
    out_->seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  }

 private:
  bool Fail(std::string error) {
    if (out_->error.empty()) out_->error = std::move(error);
    return false;
  }
  bool Check(cudaError_t e, const char* what) {
    return e == cudaSuccess || Fail(CudaError(what, e));
  }

  bool Open() {
    if (o_.copy_only) {
      span_slots_ = 1;
      return Buffers();
    }
    fd_ = open(path_.c_str(), (o_.write ? O_RDWR : O_RDONLY) | O_DIRECT);
    if (fd_ < 0) return Fail(absl::StrCat("open ", path_, " O_DIRECT: ", std::strerror(errno)));
    struct stat st;
    if (fstat(fd_, &st) != 0) return Fail(absl::StrCat("fstat: ", std::strerror(errno)));
    span_slots_ = static_cast<uint64_t>(st.st_size) / o_.io_bytes;
    if (span_slots_ == 0) return Fail(absl::StrCat(path_, ": smaller than one request"));
    if (!Buffers()) return false;
    const int rc = io_uring_queue_init(o_.qd, &ring_, 0);
    if (rc < 0) return Fail(absl::StrCat("io_uring_queue_init: ", std::strerror(-rc)));
    ring_ok_ = true;
    if (o_.fixed) {
      const iovec v{host_, uint64_t{o_.slots} * slot_bytes_};
      const int r = io_uring_register_buffers(&ring_, &v, 1);
      if (r < 0) return Fail(absl::StrCat("io_uring_register_buffers: ", std::strerror(-r)));
    }
    rng_.seed(o_.seed);
    next_ = rng_() % span_slots_;
    return true;
  }

  // The pinned slots (all free), the GPU buffer, the stream and the events.
  bool Buffers() {
    const uint64_t bytes = uint64_t{o_.slots} * slot_bytes_;
    if (o_.gpu && !o_.host_register) {
      if (!Check(cudaHostAlloc(reinterpret_cast<void**>(&host_), bytes, cudaHostAllocPortable),
                 "cudaHostAlloc")) {
        return false;
      }
    } else {
      void* p = nullptr;
      if (posix_memalign(&p, 2 << 20, bytes) != 0) return Fail("posix_memalign: out of memory");
      host_ = static_cast<uint8_t*>(p);
      if (o_.host_register) madvise(host_, bytes, MADV_HUGEPAGE);  // advice only
    }
    std::memset(host_, 1, bytes);
    if (o_.gpu && o_.host_register &&
        !Check(cudaHostRegister(host_, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
               "cudaHostRegister")) {
      return false;  // the destructor's unregister fails harmlessly; free() follows
    }
    if (o_.gpu) {
      if (!Check(cudaMalloc(reinterpret_cast<void**>(&dev_), o_.device_bytes), "cudaMalloc") ||
          !Check(cudaMemset(dev_, 2, o_.device_bytes), "cudaMemset") ||
          !Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate")) {
        return false;
      }
      for (cudaEvent_t& e : events_) {
        if (!Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate")) {
          return false;
        }
      }
    }
    for (uint32_t i = 0; i < o_.slots; ++i) free_.push_back(i);
    return true;
  }

  bool Stopping() {
    if (!stopping_ && Clock::now() >= deadline_) stopping_ = true;
    return stopping_ || !out_->error.empty();
  }

  // The slot's requests (reads_per_copy of them, back to back in the slot).
  void Submit(uint32_t slot) {
    for (uint32_t i = 0; i < o_.reads_per_copy; ++i) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      uint8_t* p = host_ + uint64_t{slot} * slot_bytes_ + uint64_t{i} * o_.io_bytes;
      const uint64_t off =
          (o_.sequential ? next_++ % span_slots_ : rng_() % span_slots_) * o_.io_bytes;
      const unsigned n = static_cast<unsigned>(o_.io_bytes);
      if (o_.fixed) {
        o_.write ? io_uring_prep_write_fixed(sqe, fd_, p, n, off, 0)
                 : io_uring_prep_read_fixed(sqe, fd_, p, n, off, 0);
      } else {
        o_.write ? io_uring_prep_write(sqe, fd_, p, n, off)
                 : io_uring_prep_read(sqe, fd_, p, n, off);
      }
      if (o_.async) sqe->flags |= IOSQE_ASYNC;
      io_uring_sqe_set_data64(sqe, slot);
      ++in_flight_;
    }
  }

  // The copy of `slot` (to the GPU for reads, from it for writes), then its event.
  bool Copy(uint32_t slot) {
    if (dev_pos_ + slot_bytes_ > o_.device_bytes) dev_pos_ = 0;
    uint8_t* h = host_ + uint64_t{slot} * slot_bytes_;
    uint8_t* d = dev_ + dev_pos_;
    dev_pos_ += slot_bytes_;
    const cudaError_t e = o_.write
                              ? cudaMemcpyAsync(h, d, slot_bytes_, cudaMemcpyDeviceToHost, stream_)
                              : cudaMemcpyAsync(d, h, slot_bytes_, cudaMemcpyHostToDevice, stream_);
    if (!Check(e, "cudaMemcpyAsync")) return false;
    if (!Check(cudaEventRecord(events_[slot], stream_), "cudaEventRecord")) return false;
    copying_.push_back(slot);
    return true;
  }

  // Slots whose copies have finished, oldest first, into `to`; waits for the oldest if `wait`.
  bool Finished(std::deque<uint32_t>* to, bool wait) {
    while (!copying_.empty()) {
      const uint32_t s = copying_.front();
      cudaError_t q = cudaEventQuery(events_[s]);
      if (q == cudaErrorNotReady) {
        if (!wait) return true;
        q = cudaEventSynchronize(events_[s]);
      }
      if (!Check(q, "copy")) return false;
      wait = false;
      copying_.pop_front();
      if (o_.lifo && to == &free_) {
        to->push_front(s);
      } else {
        to->push_back(s);
      }
    }
    return true;
  }

  // Completions: each slot whose requests have all completed to `done`; counts bytes; false on a
  // failed request.
  bool Reap(std::deque<uint32_t>* done) {
    const int rc = io_uring_submit_and_wait(&ring_, 1);
    if (rc < 0 && rc != -EINTR) {
      return Fail(absl::StrCat("io_uring_submit_and_wait: ", std::strerror(-rc)));
    }
    unsigned head, seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      --in_flight_;
      const uint32_t s = static_cast<uint32_t>(cqe->user_data);
      if (cqe->res != static_cast<int>(o_.io_bytes)) {
        Fail(absl::StrCat(o_.write ? "write: " : "read: ",
                          cqe->res < 0 ? std::strerror(-cqe->res) : "short"));
        continue;  // the run stops; its slot is not used again
      }
      out_->bytes += o_.io_bytes;
      if (++landed_[s] < o_.reads_per_copy) continue;
      landed_[s] = 0;
      done->push_back(s);
    }
    io_uring_cq_advance(&ring_, seen);
    return out_->error.empty();
  }

  // Reads into free slots, each copied to the GPU when it lands; a slot is free again once its
  // copy has finished.
  void Reads() {
    while (true) {
      while (!Stopping() && in_flight_ + o_.reads_per_copy <= o_.qd &&
             (in_flight_ == 0 || o_.qd - in_flight_ >= o_.burst || submitting_)) {
        submitting_ = true;
        if (free_.empty() && o_.gpu && !Finished(&free_, /*wait=*/in_flight_ == 0)) break;
        if (free_.empty()) break;
        Submit(free_.front());
        free_.pop_front();
      }
      submitting_ = false;
      if (in_flight_ == 0) return;
      std::deque<uint32_t> landed;
      if (!Reap(&landed)) stopping_ = true;
      for (uint32_t s : landed) {
        if (!o_.gpu) {
          o_.lifo ? free_.push_front(s) : free_.push_back(s);
        } else if (!Copy(s)) {
          stopping_ = true;
        }
      }
      if (o_.gpu && !Finished(&free_, false)) stopping_ = true;
    }
  }

  // --op=copy: `qd` copies in flight from the slots to the GPU, each slot again once its copy has
  // finished; bytes counted as each copy is enqueued (the final sync is inside the timing).
  void Copies() {
    while (!Stopping()) {
      if (free_.empty() || copying_.size() >= o_.qd) {
        if (!Finished(&free_, /*wait=*/true)) return;
        continue;
      }
      const uint32_t s = free_.front();
      free_.pop_front();
      if (!Copy(s)) return;
      out_->bytes += slot_bytes_;
    }
  }

  // Copies from the GPU into free slots, each written once its copy has finished; a slot is
  // free again when its write completes.
  void Writes() {
    std::deque<uint32_t> ready;  // copied from the GPU, not yet written
    while (true) {
      while (!Stopping() && !free_.empty() && copying_.size() + ready.size() < o_.qd) {
        const uint32_t s = free_.front();
        free_.pop_front();
        if (!o_.gpu) {
          ready.push_back(s);
        } else if (!Copy(s)) {
          stopping_ = true;
        }
      }
      if (o_.gpu && !Finished(&ready, /*wait=*/in_flight_ == 0 && ready.empty())) {
        stopping_ = true;
      }
      while (!ready.empty() && in_flight_ < o_.qd && out_->error.empty()) {
        Submit(ready.front());
        ready.pop_front();
      }
      if (in_flight_ == 0) {
        if (Stopping() || (copying_.empty() && ready.empty() && free_.empty())) return;
        continue;
      }
      if (!Reap(&free_)) stopping_ = true;
    }
  }

  const std::string path_;
  const FileOptions o_;
  Result* const out_;
  const uint64_t slot_bytes_;           // io_bytes x reads_per_copy
  Clock::time_point start_, deadline_;  // from the start line
  int fd_ = -1;
  uint64_t span_slots_ = 0;
  uint8_t* host_ = nullptr;
  uint8_t* dev_ = nullptr;
  uint64_t dev_pos_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::vector<uint32_t> landed_;  // per slot: its requests completed so far
  io_uring ring_{};
  bool ring_ok_ = false;
  std::mt19937_64 rng_;
  uint64_t next_ = 0;             // --sequential: the next request's index
  bool submitting_ = false;       // --burst: a burst started, fill the queue
  std::deque<uint32_t> free_;     // no request, no copy
  std::deque<uint32_t> copying_;  // copy enqueued, oldest first
  uint32_t in_flight_ = 0;
  bool stopping_ = false;
};

void RunFile(const std::string& path, const FileOptions& o, Result* out) {
  FileRun(path, o, out).Run();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = tutti::bench::CommandLine(argc, argv);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  const uint64_t io_bytes = absl::GetFlag(FLAGS_io_bytes);
  const uint32_t qd = absl::GetFlag(FLAGS_qd);
  const uint32_t slots = absl::GetFlag(FLAGS_slots);
  const std::string op = absl::GetFlag(FLAGS_op);
  const bool gpu = !absl::GetFlag(FLAGS_no_gpu);
  const uint64_t device_bytes = absl::GetFlag(FLAGS_device_bytes);
  const uint32_t burst = std::max<uint32_t>(1, std::min(absl::GetFlag(FLAGS_burst), qd));
  const uint32_t reads_per_copy = absl::GetFlag(FLAGS_reads_per_copy);
  std::vector<std::string> files(rest.begin() + 1, rest.end());
  if ((op != "read" && op != "write" && op != "copy") || (op == "copy" && !gpu) || files.empty() ||
      io_bytes == 0 || io_bytes % 4096 != 0 || qd == 0 || reads_per_copy == 0 ||
      reads_per_copy > qd || (reads_per_copy > 1 && op == "write") || slots == 0 ||
      (reads_per_copy == 1 && slots < qd) || device_bytes < io_bytes * reads_per_copy ||
      (absl::GetFlag(FLAGS_staging) != "hostalloc" && absl::GetFlag(FLAGS_staging) != "register")) {
    std::fprintf(
        stderr,
        "usage: raw_gpu_io [--op=read|write|copy] [--io_bytes=N (x4096)] [--qd=N] "
        "[--slots=N (>= qd unless --reads_per_copy)] [--reads_per_copy=N<=qd, reads and copies] "
        "[--seconds=S] [--no_gpu] [--async] [--device_bytes=N] "
        "[--staging=hostalloc|register] [--fixed] [--lifo] [--sequential] [--burst=N] FILE...\n");
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
  tutti::bench::WorkerSampler sampler;  // io_uring workers runnable at once (copies on tmpfs)
  sampler.Start();
  double cpu0 = 0;  // set by the first file's run at the start line
  tutti::bench::StartLine start_line(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    FileOptions o;
    o.io_bytes = io_bytes;
    o.qd = qd;
    o.slots = slots;
    o.write = op == "write";
    o.copy_only = op == "copy";
    o.gpu = gpu;
    o.async = absl::GetFlag(FLAGS_async);
    o.device_bytes = device_bytes;
    o.host_register = absl::GetFlag(FLAGS_staging) == "register";
    o.fixed = absl::GetFlag(FLAGS_fixed);
    o.lifo = absl::GetFlag(FLAGS_lifo);
    o.sequential = absl::GetFlag(FLAGS_sequential);
    o.burst = burst;
    o.reads_per_copy = reads_per_copy;
    o.seconds = absl::GetFlag(FLAGS_seconds);
    o.start_line = &start_line;
    o.cpu_at_start = i == 0 ? &cpu0 : nullptr;
    o.seed = 1000003 * (i + 1);
    threads.emplace_back(RunFile, files[i], o, &results[i]);
  }
  for (auto& t : threads) t.join();
  const double cpu = CpuSeconds() - cpu0;
  const tutti::bench::WorkerSamples workers = sampler.Stop();
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
      "{\"tool\":\"raw_gpu_io\",\"op\":\"%s\",\"files\":%zu,\"io_bytes\":%lu,\"qd\":%u,\"slots\":%"
      "u,"
      "\"gpu\":%s,\"async\":%s,\"staging\":\"%s\",\"fixed\":%s,\"lifo\":%s,\"sequential\":%s,"
      "\"burst\":%u,\"reads_per_copy\":%u,\"bytes\":%lu,\"seconds\":%.3f,\"gbps\":%.2f,"
      "\"file_gbps\":[%s],"
      "\"cpu_seconds\":%.2f,\"iou_workers_runnable\":%.2f,\"iou_workers\":%u,"
      "\"command\":%s}\n",
      op.c_str(), files.size(), io_bytes, qd, slots, gpu ? "true" : "false",
      absl::GetFlag(FLAGS_async) ? "true" : "false", absl::GetFlag(FLAGS_staging).c_str(),
      absl::GetFlag(FLAGS_fixed) ? "true" : "false", absl::GetFlag(FLAGS_lifo) ? "true" : "false",
      absl::GetFlag(FLAGS_sequential) ? "true" : "false", burst, reads_per_copy, bytes, seconds,
      bytes / 1e9 / seconds, absl::StrJoin(per_file, ",").c_str(), cpu, workers.mean_runnable,
      workers.workers_seen, tutti::bench::JsonString(command).c_str());
  return 0;
}

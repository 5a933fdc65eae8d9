// raw_array_io: the raw baseline of an array of files (one per device): O_DIRECT random reads or
// writes of one request size, one io_uring and one thread per file, `qd` requests in flight on
// each. What the devices give to a plain liburing loop, for bench/ssd_array.py to hold tuttid
// against in the same run.
//
//   raw_array_io --op=read [--io_bytes=1048576] [--qd=16] [--seconds=5 | --bytes=N]
//                [--span_bytes=X] [--fill] [--async] [--buffer_bytes=B] FILE...
//
// Offsets are random multiples of io_bytes within each file's first span_bytes (default: the
// file's size). --fill first creates each file (or extends it) to span_bytes and writes all of it
// sequentially, untimed, so that later reads hit written data (a hole or an unwritten extent reads
// as zeros without touching the device). Writes end with fdatasync of each file, inside the
// timing. Each file's requests land in (or leave from) its own buffer of --buffer_bytes (default:
// qd requests, reused at once and so largely cache-resident), used round robin: a larger buffer
// makes a read's destination as cold as a consumer's staging (tuttid's rotates through
// limits.retrieve_staging_bytes). Prints one JSON object on stdout (op, files, io_bytes, qd, bytes, seconds, gbps, iops,
// per-file GB/s, CPU seconds of this process); messages go to stderr. Exit status: 0, 1 when an
// I/O failed (the error is named), 2 for bad arguments.
#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/jsonl.h"
#include "bench/start_line.h"
#include "bench/worker_sampler.h"

ABSL_FLAG(std::string, op, "read", "read | write");
ABSL_FLAG(uint64_t, io_bytes, 1 << 20, "request size, a multiple of 4096");
ABSL_FLAG(uint32_t, qd, 16, "requests in flight per file (one io_uring each)");
ABSL_FLAG(double, seconds, 5.0, "how long to run (ignored with --bytes)");
ABSL_FLAG(uint64_t, bytes, 0,
          "move this many bytes over all files, an equal share each, as a striped transfer does "
          "(0: run --seconds)");
ABSL_FLAG(uint64_t, span_bytes, 0,
          "offsets lie within each file's first span_bytes (0: the file's size)");
ABSL_FLAG(bool, fill, false,
          "create or extend each file to span_bytes and write all of it first (untimed)");
ABSL_FLAG(uint64_t, seed, 1, "random offsets' seed");
ABSL_FLAG(bool, async, false,
          "issue reads as IOSQE_ASYNC, each on an io_uring worker (what tuttid does on tmpfs, "
          "io.memory_read_workers; there io_uring otherwise copies one read at a time per file)");

ABSL_FLAG(uint64_t, buffer_bytes, 0,
          "each file's buffer, used round robin by its requests (0: qd x io_bytes); a multiple "
          "of io_bytes, at least qd x io_bytes");

namespace tutti::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  bool write = false;
  uint64_t io_bytes = 0;
  uint32_t qd = 0;
  double seconds = 0;
  uint64_t bytes = 0;
  uint64_t span = 0;
  bool fill = false;
  uint64_t seed = 0;
  bool async = false;
  uint64_t buffer_bytes = 0;  // per file; 0: qd x io_bytes
};

struct FileRun {
  std::string path;
  uint64_t span = 0;
  uint64_t bytes = 0;
  uint64_t ios = 0;
  double fill_seconds = 0;
  Clock::time_point start, end;  // start: the common start line
  std::string error;             // empty: no failure
};

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// One file's ring, buffers and descriptor.
class Ring {
 public:
  ~Ring() {
    if (ring_ok_) io_uring_queue_exit(&ring_);
    if (buf_ != nullptr) munmap(buf_, buf_bytes_);
    if (fd_ >= 0) close(fd_);
  }

  std::string Open(const std::string& path, const Options& o) {
    io_bytes_ = o.io_bytes;
    qd_ = o.qd;
    const int flags = (o.write || o.fill ? O_RDWR : O_RDONLY) | O_DIRECT | (o.fill ? O_CREAT : 0);
    fd_ = open(path.c_str(), flags, 0600);
    if (fd_ < 0) {
      return absl::StrCat("open ", path, " with O_DIRECT: ", std::strerror(errno),
                          errno == EINVAL ? " (does this filesystem take O_DIRECT?)" : "");
    }
    buf_bytes_ = std::max(uint64_t{qd_} * io_bytes_, o.buffer_bytes);
    num_slots_ = static_cast<uint32_t>(buf_bytes_ / io_bytes_);
    void* p = mmap(nullptr, buf_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return absl::StrCat("mmap ", buf_bytes_, " bytes: ", std::strerror(errno));
    buf_ = static_cast<uint8_t*>(p);
    madvise(buf_, buf_bytes_, MADV_HUGEPAGE);
    std::mt19937_64 rng(o.seed);
    // Random bytes in the first qd requests' worth, copied over the rest: every page is backed
    // by memory of its own (never the shared zero page) before the timing.
    const uint64_t random_bytes = std::min(buf_bytes_, uint64_t{qd_} * io_bytes_);
    for (uint64_t i = 0; i + 8 <= random_bytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(buf_ + i, &v, 8);
    }
    for (uint64_t i = random_bytes; i < buf_bytes_; i += random_bytes) {
      std::memcpy(buf_ + i, buf_, std::min(random_bytes, buf_bytes_ - i));
    }
    const int rc = io_uring_queue_init(qd_, &ring_, 0);
    if (rc < 0) return absl::StrCat("io_uring_queue_init(", qd_, "): ", std::strerror(-rc));
    ring_ok_ = true;
    iovec iov{buf_, buf_bytes_};
    fixed_ = io_uring_register_buffers(&ring_, &iov, 1) == 0;
    async_reads_ = o.async;
    return "";
  }

  int fd() const { return fd_; }

  // Keeps qd requests of `write` in flight at offsets next_offset() until it returns false or a
  // request fails; counts the bytes done. Returns "" or the failure.
  std::string Run(bool write, const std::function<bool(uint64_t*)>& next_offset, uint64_t* bytes,
                  uint64_t* ios) {
    uint32_t in_flight = 0;
    bool stopping = false;
    std::string error;
    // Slots free to take, oldest first: the requests go round the whole buffer.
    std::deque<uint32_t> free_slots;
    for (uint32_t i = 0; i < num_slots_; ++i) free_slots.push_back(i);
    auto issue = [&] {
      uint64_t off;
      if (stopping || !next_offset(&off)) {
        stopping = true;
        return;
      }
      const uint32_t slot = free_slots.front();
      free_slots.pop_front();
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      uint8_t* p = buf_ + uint64_t{slot} * io_bytes_;
      const unsigned n = static_cast<unsigned>(io_bytes_);
      if (write) {
        fixed_ ? io_uring_prep_write_fixed(sqe, fd_, p, n, off, 0)
               : io_uring_prep_write(sqe, fd_, p, n, off);
      } else {
        fixed_ ? io_uring_prep_read_fixed(sqe, fd_, p, n, off, 0)
               : io_uring_prep_read(sqe, fd_, p, n, off);
        if (async_reads_) sqe->flags |= IOSQE_ASYNC;
      }
      io_uring_sqe_set_data64(sqe, (uint64_t{slot} << 48) | (off >> 12));
      ++in_flight;
    };
    for (uint32_t i = 0; i < qd_; ++i) issue();
    while (in_flight > 0) {
      const int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR) {
        return absl::StrCat("io_uring_submit_and_wait: ", std::strerror(-rc));
      }
      unsigned head, seen = 0;
      io_uring_cqe* cqe;
      uint32_t done = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        --in_flight;
        free_slots.push_back(static_cast<uint32_t>(cqe->user_data >> 48));
        const uint64_t off = (cqe->user_data & ((uint64_t{1} << 48) - 1)) << 12;
        if (cqe->res != static_cast<int>(io_bytes_)) {
          if (error.empty()) {
            error = cqe->res < 0 ? absl::StrCat(write ? "write" : "read", " at offset ", off, ": ",
                                                std::strerror(-cqe->res))
                                 : absl::StrCat("short ", write ? "write" : "read", " at offset ",
                                                off, ": ", cqe->res, " of ", io_bytes_, " bytes");
          }
          stopping = true;
          continue;
        }
        *bytes += io_bytes_;
        ++*ios;
        ++done;
      }
      io_uring_cq_advance(&ring_, seen);
      for (uint32_t i = 0; i < done; ++i) issue();
    }
    return error;
  }

 private:
  int fd_ = -1;
  uint8_t* buf_ = nullptr;
  uint64_t buf_bytes_ = 0;
  uint64_t io_bytes_ = 0;
  uint32_t qd_ = 0;
  uint32_t num_slots_ = 0;
  io_uring ring_{};
  bool ring_ok_ = false;
  bool fixed_ = false;
  bool async_reads_ = false;
};

// Sizes the file (with --fill: extends it and writes all of span sequentially). Returns the span
// or sets *error.
uint64_t Prepare(Ring& ring, const std::string& path, const Options& o, double* fill_seconds,
                 std::string* error) {
  struct stat st;
  if (fstat(ring.fd(), &st) != 0) {
    *error = absl::StrCat("fstat ", path, ": ", std::strerror(errno));
    return 0;
  }
  uint64_t span = o.span != 0 ? o.span : static_cast<uint64_t>(st.st_size);
  span -= span % o.io_bytes;
  if (span < o.io_bytes) {
    *error = absl::StrCat(path, ": span of ", span, " bytes is less than one request of ",
                          o.io_bytes, " (file size ", st.st_size, "; give --span_bytes or --fill)");
    return 0;
  }
  if (!o.fill) {
    if (static_cast<uint64_t>(st.st_size) < span) {
      *error = absl::StrCat(path, " has ", st.st_size, " bytes, less than --span_bytes ", span,
                            " (use --fill)");
      return 0;
    }
    return span;
  }
  if (static_cast<uint64_t>(st.st_size) < span &&
      ftruncate(ring.fd(), static_cast<off_t>(span)) != 0) {
    *error = absl::StrCat("ftruncate ", path, " to ", span, ": ", std::strerror(errno));
    return 0;
  }
  const auto t0 = Clock::now();
  uint64_t next = 0, bytes = 0, ios = 0;
  *error = ring.Run(
      /*write=*/true,
      [&](uint64_t* off) {
        if (next >= span) return false;
        *off = next;
        next += o.io_bytes;
        return true;
      },
      &bytes, &ios);
  if (error->empty() && fdatasync(ring.fd()) != 0) {
    *error = absl::StrCat("fdatasync ", path, ": ", std::strerror(errno));
  }
  if (!error->empty()) *error = absl::StrCat("filling ", path, ": ", *error);
  *fill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return span;
}

void Worker(size_t index, const Options& o, tutti::bench::StartLine* start_line, uint64_t share,
            FileRun* run) {
  Ring ring;
  std::string error = ring.Open(run->path, o);
  if (error.empty()) run->span = Prepare(ring, run->path, o, &run->fill_seconds, &error);
  const Clock::time_point start = start_line->Arrive();
  run->start = run->end = start;
  if (!error.empty()) {
    run->error = error;
    return;
  }
  const auto deadline = start + std::chrono::duration<double>(o.seconds);
  std::mt19937_64 rng(o.seed * 1000003 + index);
  const uint64_t slots = run->span / o.io_bytes;
  uint64_t issued = 0;
  run->error = ring.Run(
      o.write,
      [&](uint64_t* off) {
        if (o.bytes != 0) {
          if (issued >= share) return false;
          issued += o.io_bytes;
        } else if (Clock::now() >= deadline) {
          return false;
        }
        *off = (rng() % slots) * o.io_bytes;
        return true;
      },
      &run->bytes, &run->ios);
  if (run->error.empty() && o.write && fdatasync(ring.fd()) != 0) {
    run->error = absl::StrCat("fdatasync: ", std::strerror(errno));
  }
  if (!run->error.empty()) run->error = absl::StrCat(run->path, ": ", run->error);
  run->end = Clock::now();
}

std::string Num(double v) { return absl::StrFormat("%.4f", v); }

int Usage(const std::string& why) {
  std::fprintf(stderr, "raw_array_io: %s\nusage: raw_array_io --op=read|write [flags] FILE...\n",
               why.c_str());
  return 2;
}

int Main(const std::vector<std::string>& files, const std::string& command) {
  Options o;
  const std::string op = absl::GetFlag(FLAGS_op);
  if (op != "read" && op != "write") return Usage("--op must be read or write, not " + op);
  o.write = op == "write";
  o.io_bytes = absl::GetFlag(FLAGS_io_bytes);
  o.qd = absl::GetFlag(FLAGS_qd);
  o.async = absl::GetFlag(FLAGS_async);
  o.seconds = absl::GetFlag(FLAGS_seconds);
  o.bytes = absl::GetFlag(FLAGS_bytes);
  o.span = absl::GetFlag(FLAGS_span_bytes);
  o.fill = absl::GetFlag(FLAGS_fill);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.buffer_bytes = absl::GetFlag(FLAGS_buffer_bytes);
  if (files.empty()) return Usage("no files given");
  if (o.io_bytes == 0 || o.io_bytes % 4096 != 0 || o.io_bytes > (1u << 30)) {
    return Usage("--io_bytes must be a multiple of 4096, at most 1 GiB");
  }
  if (o.qd == 0 || o.qd > 4096) return Usage("--qd must be in 1 .. 4096");
  if (o.bytes == 0 && !(o.seconds > 0)) return Usage("give --seconds > 0 or --bytes");
  if (o.fill && o.span == 0) return Usage("--fill needs --span_bytes");
  if (o.buffer_bytes != 0 &&
      (o.buffer_bytes % o.io_bytes != 0 || o.buffer_bytes < uint64_t{o.qd} * o.io_bytes ||
       o.buffer_bytes / o.io_bytes >= (uint64_t{1} << 16))) {
    return Usage("--buffer_bytes must be a multiple of io_bytes, at least qd x io_bytes, and "
                 "fewer than 65536 requests");
  }

  std::vector<FileRun> runs(files.size());
  for (size_t i = 0; i < files.size(); ++i) runs[i].path = files[i];
  tutti::bench::StartLine start_line(files.size());
  // Each file's share of --bytes, in whole requests (rounded up).
  const uint64_t share = (o.bytes / files.size() + o.io_bytes - 1) / o.io_bytes * o.io_bytes;
  // The most io_uring workers seen at once (sampled every 50 ms while the rings run).
  tutti::bench::WorkerSampler sampler(std::chrono::milliseconds(50));
  sampler.Start();
  std::vector<std::thread> threads;
  for (size_t i = 0; i < files.size(); ++i) {
    threads.emplace_back(Worker, i, std::cref(o), &start_line, share, &runs[i]);
  }
  for (auto& t : threads) t.join();
  const uint32_t iou_max = sampler.Stop().workers_seen;
  bool failed = false;
  for (const FileRun& r : runs) {
    if (r.error.empty()) continue;
    std::fprintf(stderr, "raw_array_io: %s\n", r.error.c_str());
    failed = true;
  }
  if (failed) return 1;
  // The whole process's CPU seconds (the fill included, when there was one).
  const double cpu = CpuSeconds();
  uint64_t bytes = 0, ios = 0;
  Clock::time_point end = runs[0].start;
  double fill_seconds = 0;
  std::vector<std::string> per_file;
  for (const FileRun& r : runs) {
    bytes += r.bytes;
    ios += r.ios;
    end = std::max(end, r.end);
    fill_seconds = std::max(fill_seconds, r.fill_seconds);
    const double s = std::chrono::duration<double>(r.end - r.start).count();
    per_file.push_back(Num(s > 0 ? r.bytes / s / 1e9 : 0));
  }
  const double seconds = std::chrono::duration<double>(end - runs[0].start).count();
  if (bytes == 0 || seconds <= 0) {
    std::fprintf(stderr, "raw_array_io: nothing was %s\n", o.write ? "written" : "read");
    return 1;
  }
  std::vector<std::string> quoted;
  for (const std::string& f : files) quoted.push_back(JsonString(f));
  std::printf(
      "{\"tool\":\"raw_array_io\",\"op\":%s,\"files\":%zu,\"paths\":[%s],\"io_bytes\":%lu,"
      "\"qd\":%u,\"span_bytes\":%lu,\"bytes\":%lu,\"ios\":%lu,\"seconds\":%s,\"gbps\":%s,"
      "\"iops\":%s,\"per_file_gbps\":[%s],\"fill_seconds\":%s,\"process_cpu_s\":%s,"
      "\"async\":%s,\"buffer_bytes\":%lu,\"iou_workers_max\":%u,\"date\":%s,\"command\":%s}\n",
      JsonString(op).c_str(), files.size(), absl::StrJoin(quoted, ",").c_str(), o.io_bytes, o.qd,
      runs[0].span, bytes, ios, Num(seconds).c_str(), Num(bytes / seconds / 1e9).c_str(),
      Num(ios / seconds).c_str(), absl::StrJoin(per_file, ",").c_str(), Num(fill_seconds).c_str(),
      Num(cpu).c_str(), o.async ? "true" : "false",
      std::max(uint64_t{o.qd} * o.io_bytes, o.buffer_bytes), iou_max, JsonString(UtcNow()).c_str(),
      JsonString(command).c_str());
  return 0;
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  const std::string command = tutti::bench::CommandLine(argc, argv);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> files(rest.begin() + 1, rest.end());
  return tutti::bench::Main(files, command);
}

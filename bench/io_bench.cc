// io_bench: random reads of pool objects through the "uring" I/O backend versus a plain liburing
// loop over the same O_DIRECT files, with the same object size and queue depth, in one run.
//
// The pool is made by OpenOrCreatePool under --dir (one subdirectory per file) and filled with
// real data once (a pre-allocated but unwritten extent reads as zeros without touching the disk).
// Rounds alternate baseline / backend so drift on a shared machine hits both; each mode's figure
// is the median of its rounds. Prints a table; with --out, appends one JSON line per metric with
// bench, metric, value, unit, baseline_name, baseline_value, ratio, machine, date, command (and
// the parameters).
//
//   bazel build //bench:io_bench
//   bazel-bin/bench/io_bench --file_gib=2 --seconds=5 --out=bench/results/io_bench.jsonl
#include <fcntl.h>
#include <liburing.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "bench/jsonl.h"
#include "bench/worker_sampler.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/io/uring_backend.h"
#include "daemon/pool/layout.h"
#include "daemon/pool/pool_files.h"

ABSL_FLAG(std::string, dir, "/var/tmp/tutti-bench",
          "where the pool files live (kept between runs)");
ABSL_FLAG(uint32_t, files, 1, "pool files (one subdirectory each)");
ABSL_FLAG(double, file_gib, 2.0, "size of each pool file, GiB");
ABSL_FLAG(uint32_t, object_kib, 32, "object size, KiB (one read each)");
ABSL_FLAG(uint32_t, qd, 64, "queue depth per file: reads in flight");
ABSL_FLAG(uint32_t, batches_in_flight, 3, "backend: batches of qd reads per file outstanding");
ABSL_FLAG(std::string, resubmit, "caller",
          "backend: who submits the next batch: \"caller\" (a thread waiting for completions, "
          "as the store does) or \"callback\" (the batch's done callback)");
ABSL_FLAG(bool, huge_pages, true,
          "back both modes' buffers with transparent huge pages (MADV_HUGEPAGE)");
ABSL_FLAG(uint32_t, memory_read_workers, 16, "backend, files on tmpfs: io.memory_read_workers");
ABSL_FLAG(uint32_t, memory_read_rings, 1, "backend, files on tmpfs: io.memory_read_rings");
ABSL_FLAG(double, seconds, 5.0, "length of each round");
ABSL_FLAG(uint32_t, rounds, 3, "rounds per mode, alternating");
ABSL_FLAG(std::string, out, "", "append JSON lines here (empty: print only)");
ABSL_FLAG(std::string, machine, "", "machine description for the results (default: host, cores)");

namespace tutti::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Setup {
  pool::PoolLayout layout;
  std::vector<int> fds;
  uint32_t object_bytes;
  uint32_t qd;
};

struct Round {
  double gbps = 0, iops = 0;
  uint64_t errors = 0;
  double mean_depth = 0;     // requests in flight at each wait, averaged
  double cpu_us_per_io = 0;  // user + system CPU time of the whole process per read
  WorkerSamples workers;     // io_uring workers runnable at once (copies going on tmpfs)
};

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Random object locations, drawn the same way for both modes.
class Picker {
 public:
  Picker(const pool::PoolLayout& l, uint64_t seed) : l_(l), rng_(seed) {}
  pool::Location Next() {
    return l_.ObjectLocation(rng_() % l_.num_slots(),
                             static_cast<uint32_t>(rng_() % l_.max_objects()));
  }

 private:
  const pool::PoolLayout& l_;
  std::mt19937_64 rng_;
};

// Writes every object frame of every file once, so that reads hit the disk.
bool Fill(const Setup& s, const std::string& marker, const std::string& uuid) {
  std::ifstream in(marker);
  std::string seen;
  if (in >> seen && seen == uuid) return true;
  constexpr uint64_t kChunk = 8 << 20;
  io::AlignedBuffer buf(kChunk);
  std::mt19937_64 rng(1);
  const uint64_t frames = s.layout.ObjectLocation(0, 0).offset;  // the same in every file
  for (size_t f = 0; f < s.fds.size(); ++f) {
    for (uint64_t off = frames; off < s.layout.file_bytes(); off += kChunk) {
      for (uint64_t i = 0; i < kChunk; i += 8) *reinterpret_cast<uint64_t*>(buf.data() + i) = rng();
      const uint64_t len = std::min(kChunk, s.layout.file_bytes() - off);
      if (pwrite(s.fds[f], buf.data(), len, static_cast<off_t>(off)) != static_cast<ssize_t>(len)) {
        std::perror("fill: pwrite");
        return false;
      }
    }
    fdatasync(s.fds[f]);
    std::printf("filled file %zu (%.2f GiB)\n", f, s.layout.file_bytes() / double(1 << 30));
  }
  std::ofstream(marker) << uuid << "\n";
  return true;
}

Round Finish(uint64_t done, uint64_t errors, uint32_t object_bytes, Clock::time_point start,
             double cpu_start, WorkerSampler& sampler) {
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  Round r{done * object_bytes / secs / 1e9, done / secs, errors};
  r.cpu_us_per_io = (CpuSeconds() - cpu_start) * 1e6 / std::max<uint64_t>(done, 1);
  r.workers = sampler.Stop();
  return r;
}

// The baseline: one ring with registered files and buffer, qd x files reads kept in flight.
Round RunRaw(const Setup& s, io::AlignedBuffer& buf, double seconds, uint64_t seed, bool* fixed) {
  const uint32_t depth = s.qd * static_cast<uint32_t>(s.fds.size());
  io_uring ring;
  if (io_uring_queue_init(depth, &ring, 0) != 0) return {};
  io_uring_register_files(&ring, s.fds.data(), s.fds.size());
  iovec iov{buf.data(), buf.size()};
  *fixed = io_uring_register_buffers(&ring, &iov, 1) == 0;
  Picker pick(s.layout, seed);
  auto issue = [&](uint32_t slot) {
    const pool::Location loc = pick.Next();
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    uint8_t* dst = buf.data() + uint64_t{slot} * s.object_bytes;
    if (*fixed) {
      io_uring_prep_read_fixed(sqe, static_cast<int>(loc.file), dst, s.object_bytes, loc.offset, 0);
    } else {
      io_uring_prep_read(sqe, static_cast<int>(loc.file), dst, s.object_bytes, loc.offset);
    }
    sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, slot);
  };
  WorkerSampler sampler;
  sampler.Start();
  const double cpu_start = CpuSeconds();
  for (uint32_t i = 0; i < depth; ++i) issue(i);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  uint64_t done = 0, errors = 0, in_flight = depth, waits = 0, depth_sum = 0;
  bool stopping = false;
  while (in_flight > 0) {
    ++waits;
    depth_sum += in_flight;
    io_uring_submit_and_wait(&ring, 1);
    stopping = stopping || Clock::now() >= deadline;
    unsigned head, seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++seen;
      (cqe->res == static_cast<int>(s.object_bytes) ? done : errors)++;
      if (stopping) {
        --in_flight;
      } else {
        issue(static_cast<uint32_t>(cqe->user_data));
      }
    }
    io_uring_cq_advance(&ring, seen);
  }
  Round r = Finish(done, errors, s.object_bytes, start, cpu_start, sampler);
  r.mean_depth = double(depth_sum) / waits;
  io_uring_queue_exit(&ring);
  return r;
}

// The backend: batches of qd reads per file, `batches` of them outstanding. With `in_callback`
// each batch's `done` submits the next one itself (on the backend's thread); otherwise `done`
// hands the batch back to this thread, which checks it and submits the next (as a store would).
Round RunBackend(io::UringBackend& b, io::AlignedBuffer& staging, const Setup& s, uint32_t batches,
                 double seconds, uint64_t seed, bool in_callback) {
  const uint32_t per_batch = s.qd * static_cast<uint32_t>(s.fds.size());
  std::vector<std::vector<io::IoRequest>> reqs(batches);
  absl::Mutex mu;
  std::deque<uint32_t> completed;  // batches handed back (caller mode)
  uint32_t outstanding = batches;  // guarded by mu
  std::atomic<uint64_t> done{0}, errors{0};
  Picker pick(s.layout, seed);
  const io::UringCounters before = b.counters();
  WorkerSampler sampler;
  sampler.Start();
  const double cpu_start = CpuSeconds();
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  auto count = [&](uint32_t id) {
    for (const io::IoRequest& r : reqs[id]) (r.result == s.object_bytes ? done : errors)++;
  };
  absl::Mutex pick_mu;  // with several files, callbacks may run on several threads
  std::function<void(uint32_t)> submit = [&](uint32_t id) {
    auto& batch = reqs[id];
    batch.resize(per_batch);
    absl::MutexLock lock(&pick_mu);
    for (uint32_t i = 0; i < per_batch; ++i) {
      const pool::Location loc = pick.Next();
      uint8_t* dst = staging.data() + (uint64_t{id} * per_batch + i) * s.object_bytes;
      batch[i] = io::IoRequest{io::Op::kRead, loc.file, loc.offset, dst, s.object_bytes};
    }
    b.Submit(absl::MakeSpan(batch), [&, id] {
      if (!in_callback) {
        absl::MutexLock lock(&mu);
        completed.push_back(id);
        return;
      }
      count(id);
      if (Clock::now() < deadline) return submit(id);
      absl::MutexLock lock(&mu);
      --outstanding;
    });
  };
  for (uint32_t id = 0; id < batches; ++id) submit(id);
  while (!in_callback) {
    uint32_t id;
    {
      absl::MutexLock lock(&mu);
      if (outstanding == 0) break;
      mu.Await(absl::Condition(
          +[](std::deque<uint32_t>* q) { return !q->empty(); }, &completed));
      id = completed.front();
      completed.pop_front();
    }
    count(id);
    if (Clock::now() < deadline) {
      submit(id);
    } else {
      absl::MutexLock lock(&mu);
      --outstanding;
    }
  }
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](uint32_t* n) { return *n == 0; }, &outstanding));
  }
  Round r = Finish(done, errors, s.object_bytes, start, cpu_start, sampler);
  const io::UringCounters after = b.counters();
  r.mean_depth = double(after.in_flight_sum - before.in_flight_sum) /
                 double(after.enter_calls - before.enter_calls);
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::string MachineDescription() {
  if (!absl::GetFlag(FLAGS_machine).empty()) return absl::GetFlag(FLAGS_machine);
  utsname u;
  uname(&u);
  return absl::StrCat(u.nodename, " (", std::thread::hardware_concurrency(), " cores, ", u.release,
                      ")");
}

// The kernel's transparent huge page mode, e.g. "madvise".
std::string ThpMode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const size_t a = line.find('['), b = line.find(']');
  return a != std::string::npos && b > a ? line.substr(a + 1, b - a - 1) : "unknown";
}

struct IoResult {
  std::string metric, unit;
  double value, baseline;
};

std::string Num(double v) { return absl::StrFormat("%.4f", v); }
std::string Bool(bool v) { return v ? "true" : "false"; }

// One result as a JSON object: the fields bench/results readers expect, then the parameters.
std::string JsonLine(const IoResult& r, const std::string& command, const Setup& s, bool fixed_raw,
                     bool fixed_backend) {
  const std::vector<std::pair<std::string, std::string>> fields = {
      {"bench", JsonString("io_bench")},
      {"metric", JsonString(r.metric)},
      {"value", Num(r.value)},
      {"unit", JsonString(r.unit)},
      {"baseline_name", JsonString("raw_liburing_odirect")},
      {"baseline_value", Num(r.baseline)},
      {"ratio", r.baseline > 0 ? Num(r.value / r.baseline) : "null"},
      {"machine", JsonString(MachineDescription())},
      {"date", JsonString(UtcNow())},
      {"command", JsonString(command)},
      {"object_bytes", absl::StrCat(s.object_bytes)},
      {"queue_depth", absl::StrCat(s.qd)},
      {"files", absl::StrCat(s.fds.size())},
      {"file_bytes", absl::StrCat(s.layout.file_bytes())},
      {"rounds", absl::StrCat(absl::GetFlag(FLAGS_rounds))},
      {"seconds", Num(absl::GetFlag(FLAGS_seconds))},
      {"batches_in_flight", absl::StrCat(absl::GetFlag(FLAGS_batches_in_flight))},
      {"resubmit", JsonString(absl::GetFlag(FLAGS_resubmit))},
      {"huge_pages", Bool(absl::GetFlag(FLAGS_huge_pages))},
      {"memory_read_workers", absl::StrCat(absl::GetFlag(FLAGS_memory_read_workers))},
      {"memory_read_rings", absl::StrCat(absl::GetFlag(FLAGS_memory_read_rings))},
      {"thp", JsonString(ThpMode())},
      {"fixed_buffers_backend", Bool(fixed_backend)},
      {"fixed_buffers_baseline", Bool(fixed_raw)},
  };
  std::string line = "{";
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&line, line.size() > 1 ? "," : "", "\"", key, "\":", value);
  }
  return line + "}";
}

void Report(const std::vector<IoResult>& results, const std::string& command, const Setup& s,
            bool fixed_raw, bool fixed_backend) {
  std::printf("\n%-46s %12s %12s %8s\n", "metric", "backend", "raw uring", "ratio");
  for (const IoResult& r : results) {
    std::printf("%-46s %12.3f %12.3f %8s  %s\n", r.metric.c_str(), r.value, r.baseline,
                r.baseline > 0 ? absl::StrFormat("%.3f", r.value / r.baseline).c_str() : "-",
                r.unit.c_str());
  }
  const std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) return;
  std::ofstream out(path, std::ios::app);
  for (const IoResult& r : results) out << JsonLine(r, command, s, fixed_raw, fixed_backend) << "\n";
  out.close();
  if (!out) {
    std::fprintf(stderr, "io_bench: could not write %s\n", path.c_str());
    return;
  }
  std::printf("appended %zu lines to %s\n", results.size(), path.c_str());
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "io_bench: %s\n", message.c_str());
  return 2;
}

// Creates (or reopens) the pool under --dir and fills it once. Returns the files in *pool.
absl::StatusOr<pool::PoolLayout> OpenBenchPool(pool::PoolFiles* pool) {
  const uint32_t files = absl::GetFlag(FLAGS_files);
  const uint64_t file_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_file_gib) * (1ull << 30));
  const uint32_t object_bytes = absl::GetFlag(FLAGS_object_kib) * 1024;
  auto layout = pool::PoolLayout::Compute(file_bytes * files, files, object_bytes, 64);
  if (!layout.ok()) return layout.status();
  std::vector<std::string> dirs;
  for (uint32_t f = 0; f < files; ++f) {
    dirs.push_back(absl::StrCat(absl::GetFlag(FLAGS_dir), "/d", f));
    std::error_code ec;
    std::filesystem::create_directories(dirs.back(), ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir ", dirs.back(), ": ", ec.message()));
  }
  auto opened = pool::OpenOrCreatePool(dirs, *layout, nullptr);
  if (!opened.ok()) return opened.status();
  *pool = *std::move(opened);
  const Setup s{*layout, pool->fds, object_bytes, absl::GetFlag(FLAGS_qd)};
  if (!Fill(s, absl::GetFlag(FLAGS_dir) + "/filled", pool->UuidHex())) {
    return absl::InternalError("could not fill the pool");
  }
  return layout;
}

struct Medians {
  std::vector<double> raw_gbps, raw_iops, be_gbps, be_iops;
  std::vector<double> raw_runnable, be_runnable;  // io_uring workers runnable at once, mean
  bool fixed_raw = false;
};

// Runs --rounds rounds of each mode, alternating which goes first, and reading different objects
// in each (a host-side cache under a virtual disk must not favour the second). False on errors.
bool RunRounds(const Setup& s, io::UringBackend& backend, io::AlignedBuffer& staging,
               io::AlignedBuffer& raw_buf, bool in_callback, Medians* m) {
  const double secs = absl::GetFlag(FLAGS_seconds);
  const uint32_t batches = absl::GetFlag(FLAGS_batches_in_flight);
  for (uint32_t round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    Round raw, be;
    if (round % 2 == 0) {
      raw = RunRaw(s, raw_buf, secs, 2 * round, &m->fixed_raw);
      be = RunBackend(backend, staging, s, batches, secs, 2 * round + 1, in_callback);
    } else {
      be = RunBackend(backend, staging, s, batches, secs, 2 * round, in_callback);
      raw = RunRaw(s, raw_buf, secs, 2 * round + 1, &m->fixed_raw);
    }
    std::printf(
        "round %u: raw %.3f GB/s %.0f IOPS depth %.1f cpu %.1f us/io workers runnable %.2f "
        "(max %u of %u) | backend %.3f GB/s %.0f IOPS depth %.1f cpu %.1f us/io workers "
        "runnable %.2f (max %u of %u)\n",
        round, raw.gbps, raw.iops, raw.mean_depth, raw.cpu_us_per_io, raw.workers.mean_runnable,
        raw.workers.max_runnable, raw.workers.workers_seen, be.gbps, be.iops, be.mean_depth,
        be.cpu_us_per_io, be.workers.mean_runnable, be.workers.max_runnable,
        be.workers.workers_seen);
    if (raw.errors + be.errors > 0) {
      std::fprintf(stderr, "io_bench: %lu raw and %lu backend reads failed\n", raw.errors,
                   be.errors);
      return false;
    }
    m->raw_gbps.push_back(raw.gbps);
    m->raw_iops.push_back(raw.iops);
    m->be_gbps.push_back(be.gbps);
    m->be_iops.push_back(be.iops);
    m->raw_runnable.push_back(raw.workers.mean_runnable);
    m->be_runnable.push_back(be.workers.mean_runnable);
  }
  return true;
}

int Main(const std::string& command) {
  const std::string resubmit = absl::GetFlag(FLAGS_resubmit);
  if (resubmit != "caller" && resubmit != "callback") {
    return Fail("--resubmit must be caller or callback");
  }
  pool::PoolFiles pool;
  auto layout = OpenBenchPool(&pool);
  if (!layout.ok()) return Fail(layout.status().ToString());
  const Setup s{*layout, pool.fds, layout->object_bytes(), absl::GetFlag(FLAGS_qd)};
  std::vector<int> dups;
  for (int fd : s.fds) dups.push_back(dup(fd));
  auto backend = io::UringBackend::Create(
      dups, io::UringOptions{s.qd, absl::GetFlag(FLAGS_memory_read_workers),
                             absl::GetFlag(FLAGS_memory_read_rings)});
  if (!backend.ok()) return Fail(backend.status().ToString());
  // Both modes' buffers: allocated once, the same way (see HugePages in aligned_buffer.h: the
  // physical layout of 4 KiB pages alone moved results by 10-25% on a virtio disk).
  const io::HugePages huge =
      absl::GetFlag(FLAGS_huge_pages) ? io::HugePages::kPrefer : io::HugePages::kNo;
  const uint64_t per_batch = uint64_t{s.qd} * s.fds.size() * s.object_bytes;
  io::AlignedBuffer staging(absl::GetFlag(FLAGS_batches_in_flight) * per_batch, huge);
  io::AlignedBuffer raw_buf(per_batch, huge);
  const absl::Status reg = (*backend)->RegisterBuffer(staging.span());
  if (!reg.ok()) std::printf("backend: no fixed buffers: %s\n", reg.ToString().c_str());
  Medians m;
  if (!RunRounds(s, **backend, staging, raw_buf, resubmit == "callback", &m)) return 1;
  const std::string tag =
      absl::StrCat("random_read_", absl::GetFlag(FLAGS_object_kib), "KiB_qd", s.qd);
  Report(
      {{tag + "_throughput", "GB/s", Median(m.be_gbps), Median(m.raw_gbps)},
       {tag + "_iops", "IOPS", Median(m.be_iops), Median(m.raw_iops)},
       // On tmpfs: how many reads were being copied at once (see worker_sampler.h).
       {tag + "_iou_workers_runnable", "workers", Median(m.be_runnable), Median(m.raw_runnable)}},
      command, s, m.fixed_raw, reg.ok());
  return 0;
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  const std::string command = tutti::bench::CommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  return tutti::bench::Main(command);
}

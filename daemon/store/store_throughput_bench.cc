// Host-mode throughput of a Store to durable (issue 20), against raw writes to the same files.
//
// Opens a BlockStore over --files pool directories under --dir (each "<dir>/<i>", made here) with
// the io_uring backend, as tuttid does (its default limits and datapath options unless a flag says
// otherwise; DRAM tier off), captures --gib of Llama-3-8B-shaped blocks (32 layers x K and V,
// 8 KV heads x 128 dims x 16 tokens x 2 bytes: 64 objects of 32 KiB, 2 MiB a block) from
// --capture_threads threads, and waits until every block is durable (Flush). Then, on the same
// files, the raw baseline: one thread and one io_uring per file, 1 MiB O_DIRECT writes at QD 16,
// the same bytes in all.
//
// Prints, for each: GB/s, CPU seconds per GB (getrusage, the whole process), and the busiest
// threads' share of a core (by name, from /proc/self/task). The ratio store / raw is
// `ssd_array_store_vs_raw_write`.
//
// With --probe_reads N: what a Retrieve waits while the store writes. Eight blocks are stored
// durable first; then N reads of one layer of them (512 KiB, through the store's reader, checked)
// run alone, and during the store a thread keeps reading one layer at a time. Prints the reads'
// median and 90th percentile, alone and beside the store.
//
//   bazel build //daemon/store:store_throughput_bench
//   bazel-bin/daemon/store/store_throughput_bench --dir=/dev/shm/tutti_bench --files=4 --gib=2
#include <fcntl.h>
#include <liburing.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/log.h"
#include "daemon/datapath/work_pool.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/io/uring_backend.h"
#include "daemon/pool/layout.h"
#include "daemon/pool/pool_files.h"
#include "daemon/store/block_store.h"

ABSL_FLAG(std::string, dir, "/dev/shm/tutti_store_bench", "scratch directory (removed first)");
ABSL_FLAG(uint32_t, files, 4, "pool files (emulated devices)");
ABSL_FLAG(std::vector<std::string>, pool_dirs, {},
          "empty pool directories to use instead of --files under --dir (say, mounts of "
          "devices); the state stays under --dir");
ABSL_FLAG(double, gib, 2, "GiB stored (and written raw)");
ABSL_FLAG(uint32_t, capture_threads, 1, "threads calling Capture");
ABSL_FLAG(uint32_t, blocks_per_capture, 16, "blocks per Capture call");
ABSL_FLAG(uint32_t, checksum_threads, 0, "datapath.checksum_threads (0: tuttid's default)");
ABSL_FLAG(uint32_t, write_batch_blocks, 64, "StoreOptions::write_batch_blocks");
ABSL_FLAG(uint32_t, write_batches_in_flight, 16, "datapath.write_batches_in_flight");
ABSL_FLAG(uint64_t, store_staging_mib, 256, "limits.store_staging_bytes, MiB");
ABSL_FLAG(uint32_t, queue_depth, 64, "io.queue_depth of the store's backend");
ABSL_FLAG(uint32_t, raw_qd, 16, "raw baseline: writes in flight per file");
ABSL_FLAG(uint32_t, raw_write_kib, 1024, "raw baseline: KiB per write");
ABSL_FLAG(bool, raw, true, "run the raw baseline too");
ABSL_FLAG(bool, warm, true, "write the files once (raw, not measured) before measuring");
ABSL_FLAG(bool, store, true, "run the store");
ABSL_FLAG(std::string, log_level, "warn", "tuttid's log level (debug shows each batch's times)");
ABSL_FLAG(uint32_t, probe_reads, 0, "reads of one layer of 8 blocks alone, then beside the store");

namespace tutti::store {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr uint32_t kLayers = 32;
constexpr uint32_t kObjectBytes = 32 << 10;
constexpr uint32_t kObjects = 2 * kLayers;
constexpr uint64_t kBlockBytes = uint64_t{kObjects} * kObjectBytes;

double Seconds(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

double CpuSeconds() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// CPU seconds of every thread now, by "<name>/<tid>".
std::map<std::string, double> ThreadCpu() {
  std::map<std::string, double> out;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm"), stat(entry.path() / "stat");
    std::string name, line;
    std::getline(comm, name);
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    // Fields after "pid (comm)": state is field 3; utime and stime are fields 14 and 15.
    std::vector<std::string> f;
    size_t pos = close + 2;
    while (pos < line.size() && f.size() < 13) {
      const size_t sp = line.find(' ', pos);
      f.push_back(line.substr(pos, sp - pos));
      pos = sp == std::string::npos ? line.size() : sp + 1;
    }
    uint64_t ut = 0, st = 0;
    if (f.size() < 13 || !absl::SimpleAtoi(f[11], &ut) || !absl::SimpleAtoi(f[12], &st)) continue;
    out[absl::StrCat(name, "/", entry.path().filename().string())] = (ut + st) / tick;
  }
  return out;
}

struct Measure {
  SteadyClock::time_point t0 = SteadyClock::now();
  double cpu0 = CpuSeconds();
  std::map<std::string, double> threads0 = ThreadCpu();

  // Prints GB/s, CPU s/GB and the threads above 5% of a core; returns GB/s. With `apart` (CPU
  // seconds of threads that already exited: the capturing ones), also the CPU s/GB of the store's
  // own threads: all but those and io_uring's kernel workers (iou-wrk, tmpfs's "device").
  double Report(const char* what, uint64_t bytes, double apart = -1) const {
    const double wall = Seconds(t0), cpu = CpuSeconds() - cpu0;
    const double gb = bytes / 1e9;
    std::printf("%s: %.3f GB in %.3f s = %.3f GB/s; CPU %.3f s = %.3f s/GB (%.2f cores)\n", what,
                gb, wall, gb / wall, cpu, cpu / gb, cpu / wall);
    std::vector<std::pair<double, std::string>> busy;
    double iou = 0;
    for (const auto& [name, s] : ThreadCpu()) {
      auto it = threads0.find(name);
      const double used = s - (it == threads0.end() ? 0 : it->second);
      if (name.rfind("iou-wrk", 0) == 0) iou += used;
      if (used / wall >= 0.05) busy.emplace_back(used / wall, name);
    }
    std::sort(busy.rbegin(), busy.rend());
    for (const auto& [share, name] : busy)
      std::printf("  %-24s %.2f of a core\n", name.c_str(), share);
    if (apart >= 0) {
      std::printf("  CPU s/GB: capture %.3f, iou-wrk %.3f, the store's own threads %.3f\n",
                  apart / gb, iou / gb, (cpu - apart - iou) / gb);
    }
    return gb / wall;
  }
};

tutti::v1::Namespace LlamaNamespace() {
  tutti::v1::Namespace ns;
  ns.set_model_id("llama-3-8b");
  ns.set_hash_scheme("bench");
  ns.set_tp_size(1);
  auto* l = ns.mutable_layout();
  l->set_num_layers(kLayers);
  l->set_kv_heads(8);
  l->set_head_dim(128);
  l->set_dtype_bytes(2);
  l->set_block_tokens(16);
  l->set_format(tutti::v1::KV_FORMAT_SEPARATE);
  return ns;
}

Key KeyOf(uint64_t i) {
  Key k;
  for (int b = 0; b < 8; ++b) k.bytes[b] = static_cast<uint8_t>(i >> (8 * b));
  for (int b = 8; b < 16; ++b) k.bytes[b] = static_cast<uint8_t>(0x5a ^ b);
  return k;
}

// Captures blocks [first, end) in steps of `step` keys from `engine` (engine memory, a ring of
// blocks), retrying refused blocks (staging or backlog full) until each is taken.
void CaptureRange(BlockStore* store, NamespaceId ns, uint64_t first, uint64_t end, uint32_t step,
                  const std::vector<uint8_t>& engine) {
  const uint64_t engine_blocks = engine.size() / kBlockBytes;
  std::vector<Key> keys;
  for (uint64_t i = first; i < end;) {
    keys.clear();
    for (uint64_t k = i; k < std::min(end, i + step); ++k) keys.push_back(KeyOf(k));
    const uint64_t base = i;
    const BlockStore::Gatherer gather = [&](absl::Span<const engine::CopyOp> ops) {
      for (const engine::CopyOp& op : ops) {
        const uint8_t* src = engine.data() + ((base + op.block) % engine_blocks) * kBlockBytes +
                             uint64_t{op.object} * kObjectBytes;
        std::memcpy(op.staging, src, kObjectBytes);
      }
      return absl::OkStatus();
    };
    auto out = store->Capture(ns, keys, 0, kLayers, gather, false);
    if (!out.ok()) {
      std::fprintf(stderr, "Capture: %s\n", out.status().ToString().c_str());
      std::exit(1);
    }
    // Blocks are taken in order; continue from the first refused one.
    uint64_t taken = 0;
    while (taken < out->size() && ((*out)[taken] == CaptureOutcome::kCaptured ||
                                   (*out)[taken] == CaptureOutcome::kAlreadyPresent)) {
      ++taken;
    }
    if (taken < out->size()) {
      const CaptureOutcome o = (*out)[taken];
      if (o != CaptureOutcome::kRejectedFull && o != CaptureOutcome::kRejectedBacklog &&
          o != CaptureOutcome::kRejectedOwnerLimit) {
        std::fprintf(stderr, "block %llu: outcome %d\n", (unsigned long long)(i + taken),
                     static_cast<int>(o));
        std::exit(1);
      }
      // A refused block after a taken one leaves the later taken ones queued: skip nothing, just
      // retry from the first refused (already present ones answer kAlreadyPresent).
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    i += taken;
  }
}

std::vector<std::string> MakeDirs(const std::string& root, uint32_t files) {
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/state");
  std::vector<std::string> dirs = absl::GetFlag(FLAGS_pool_dirs);
  if (!dirs.empty()) return dirs;
  for (uint32_t f = 0; f < files; ++f) {
    dirs.push_back(absl::StrCat(root, "/", f));
    std::filesystem::create_directories(dirs.back());
  }
  return dirs;
}

// The median and 90th percentile of `ms`, as text.
std::string Percentiles(std::vector<double> ms) {
  if (ms.empty()) return "no reads";
  std::sort(ms.begin(), ms.end());
  return absl::StrFormat("median %.3f ms, p90 %.3f ms (%d reads)", ms[ms.size() / 2],
                         ms[ms.size() * 9 / 10], static_cast<int>(ms.size()));
}

// --probe_reads: blocks stored durable before the store, and one read of a layer of them.
class ProbeReads {
 public:
  static constexpr uint32_t kBlocks = 8;
  ProbeReads(BlockStore* store, NamespaceId ns, const std::vector<uint8_t>& engine)
      : store_(store), ns_(ns) {
    for (uint32_t i = 0; i < kBlocks; ++i) keys_.push_back(KeyOf((1ull << 40) + i));
    const BlockStore::Gatherer gather = [&](absl::Span<const engine::CopyOp> ops) {
      for (const engine::CopyOp& op : ops) {
        std::memcpy(op.staging, engine.data() + op.block * kBlockBytes + op.object * kObjectBytes,
                    kObjectBytes);
      }
      return absl::OkStatus();
    };
    auto out = store->Capture(ns, keys_, 0, kLayers, gather, /*wait_durable=*/true);
    for (size_t i = 0; out.ok() && i < out->size(); ++i) {
      if ((*out)[i] != CaptureOutcome::kDurable) out = absl::InternalError("a probe block failed");
    }
    if (!out.ok()) {
      std::fprintf(stderr, "probe blocks: %s\n", out.status().ToString().c_str());
      std::exit(1);
    }
  }
  // Reads layer `layer` of the probe blocks; returns its milliseconds.
  double Read(uint32_t layer) {
    const auto t0 = SteadyClock::now();
    if (store_->LookupAndPin(ns_, keys_) != keys_.size()) {
      std::fprintf(stderr, "probe blocks: not all found\n");
      std::exit(1);
    }
    absl::Status s = store_->Read(ns_, keys_, layer, layer + 1,
                                  [](const datapath::LayerObjects&) { return absl::OkStatus(); });
    store_->Unpin(ns_, keys_);
    if (!s.ok()) {
      std::fprintf(stderr, "probe read: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    return Seconds(t0) * 1e3;
  }

 private:
  BlockStore* const store_;
  const NamespaceId ns_;
  std::vector<Key> keys_;
};

double RunStore(const pool::PoolLayout& layout, const std::vector<std::string>& dirs,
                const std::string& state_dir, uint64_t blocks) {
  auto files = pool::OpenOrCreatePool(dirs, layout);
  if (!files.ok()) {
    std::fprintf(stderr, "pool: %s\n", files.status().ToString().c_str());
    std::exit(1);
  }
  auto backend =
      io::CreateUringBackend(files->TakeFds(), io::UringOptions{absl::GetFlag(FLAGS_queue_depth)});
  if (!backend.ok()) {
    std::fprintf(stderr, "uring: %s\n", backend.status().ToString().c_str());
    std::exit(1);
  }
  StoreOptions options;
  options.state_dir = state_dir;
  options.layout = layout;
  options.dram_bytes = 0;
  options.store_staging_bytes = absl::GetFlag(FLAGS_store_staging_mib) << 20;
  options.write_batch_blocks = absl::GetFlag(FLAGS_write_batch_blocks);
  options.write_batches_in_flight = absl::GetFlag(FLAGS_write_batches_in_flight);
  const uint32_t sums = absl::GetFlag(FLAGS_checksum_threads);
  options.checksum_threads = sums != 0 ? sums : datapath::WorkPool::DefaultThreads();
  auto store = BlockStore::Open(options, std::move(backend).value(), Clock::Real());
  if (!store.ok()) {
    std::fprintf(stderr, "store: %s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  auto ns = (*store)->RegisterNamespace(LlamaNamespace());
  if (!ns.ok()) {
    std::fprintf(stderr, "namespace: %s\n", ns.status().ToString().c_str());
    std::exit(1);
  }
  // Engine memory: 64 distinct blocks per capturing thread, written once so its pages exist.
  const uint32_t threads = std::max<uint32_t>(1, absl::GetFlag(FLAGS_capture_threads));
  std::vector<std::vector<uint8_t>> engines(threads);
  for (uint32_t t = 0; t < threads; ++t) {
    engines[t].resize(64 * kBlockBytes);
    for (size_t i = 0; i < engines[t].size(); i += 8) {
      const uint64_t v = (i + t) * 0x9e3779b97f4a7c15ull;
      std::memcpy(&engines[t][i], &v, 8);
    }
  }
  std::printf(
      "store: %u checksum threads, batches of %u blocks, %llu MiB staging, %u capture "
      "threads of %u blocks per call\n",
      options.checksum_threads, options.write_batch_blocks,
      (unsigned long long)(options.store_staging_bytes >> 20), threads,
      absl::GetFlag(FLAGS_blocks_per_capture));
  const uint32_t probes = absl::GetFlag(FLAGS_probe_reads);
  std::unique_ptr<ProbeReads> probe;
  std::vector<double> alone_ms, beside_ms;
  if (probes > 0) {
    probe = std::make_unique<ProbeReads>(store->get(), *ns, engines[0]);
    for (uint32_t i = 0; i < probes; ++i) alone_ms.push_back(probe->Read(i % kLayers));
  }
  std::printf("measuring\n");
  std::fflush(stdout);
  Measure m;
  std::atomic<bool> stored{false};
  std::thread prober;
  if (probe != nullptr) {
    prober = std::thread([&] {
      for (uint32_t i = 0; !stored.load(); ++i) {
        beside_ms.push_back(probe->Read(i % kLayers));
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    });
  }
  std::vector<std::thread> capture;
  std::vector<double> capture_cpu(threads);
  for (uint32_t t = 0; t < threads; ++t) {
    capture.emplace_back([&, t] {
      CaptureRange(store->get(), *ns, blocks * t / threads, blocks * (t + 1) / threads,
                   absl::GetFlag(FLAGS_blocks_per_capture), engines[t]);
      capture_cpu[t] = ThreadCpuSeconds();
    });
  }
  for (auto& t : capture) t.join();
  (*store)->Flush();
  stored.store(true);
  if (prober.joinable()) prober.join();
  const double wall = Seconds(m.t0);
  double captured = 0;
  for (double s : capture_cpu) captured += s;
  const double gbs = m.Report("store to durable", blocks * kBlockBytes, captured);
  for (uint32_t t = 0; t < threads; ++t) {
    std::printf("  %-24s %.2f of a core (engine -> staging copies; exited)\n",
                absl::StrCat("capture ", t).c_str(), capture_cpu[t] / wall);
  }
  if (probe != nullptr) {
    std::printf("  probe reads (one layer of %u blocks): alone %s; beside the store %s\n",
                ProbeReads::kBlocks, Percentiles(alone_ms).c_str(), Percentiles(beside_ms).c_str());
  }
  const StoreStats stats = (*store)->Stats();
  if (stats.blocks_stored != blocks + (probe != nullptr ? ProbeReads::kBlocks : 0)) {
    std::fprintf(stderr, "stored %llu of %llu blocks (failed %llu)\n",
                 (unsigned long long)stats.blocks_stored, (unsigned long long)blocks,
                 (unsigned long long)stats.store_failed);
    std::exit(1);
  }
  return gbs;
}

// One file's raw writer: `bytes` of --raw_write_kib writes from `offset` on, `qd` in flight.
void RawWriter(const std::string& path, uint64_t offset, uint64_t bytes, uint32_t qd) {
  const uint32_t kRawWrite = absl::GetFlag(FLAGS_raw_write_kib) << 10;
  const int fd = open(path.c_str(), O_RDWR | O_DIRECT);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  io::AlignedBuffer buf(uint64_t{qd} * kRawWrite);
  std::memset(buf.data(), 0xa5, buf.size());
  io_uring ring;
  if (io_uring_queue_init(qd, &ring, 0) != 0) {
    std::fprintf(stderr, "io_uring_queue_init failed\n");
    std::exit(1);
  }
  const uint64_t total = bytes / kRawWrite;
  uint64_t issued = 0, done = 0;
  uint32_t in_flight = 0;
  while (done < total) {
    while (in_flight < qd && issued < total) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      const uint64_t slot = issued % qd;
      io_uring_prep_write(sqe, fd, buf.data() + slot * kRawWrite, kRawWrite,
                          offset + issued * kRawWrite);
      ++issued;
      ++in_flight;
    }
    io_uring_submit_and_wait(&ring, 1);
    io_uring_cqe* cqe;
    while (io_uring_peek_cqe(&ring, &cqe) == 0) {
      if (cqe->res != static_cast<int>(kRawWrite)) {
        std::fprintf(stderr, "%s: raw write: %d\n", path.c_str(), cqe->res);
        std::exit(1);
      }
      io_uring_cqe_seen(&ring, cqe);
      --in_flight;
      ++done;
    }
  }
  if (fdatasync(fd) != 0) std::perror("fdatasync");
  io_uring_queue_exit(&ring);
  close(fd);
}

double RunRaw(const pool::PoolLayout& layout, const std::vector<std::string>& dirs, uint64_t bytes,
              bool report = true) {
  const uint32_t write = absl::GetFlag(FLAGS_raw_write_kib) << 10;
  const uint64_t per_file = bytes / dirs.size() / (1 << 20) * (1 << 20);
  // The start of the frame area (the same in every file): the bytes the store wrote.
  const uint64_t start = layout.ObjectLocation(0, 0).offset;
  Measure m;
  std::vector<std::thread> writers;
  std::vector<double> seconds(dirs.size());
  for (size_t f = 0; f < dirs.size(); ++f) {
    writers.emplace_back([&, f] {
      const auto t0 = SteadyClock::now();
      RawWriter(dirs[f] + "/" + pool::kPoolFileName, start, per_file, absl::GetFlag(FLAGS_raw_qd));
      seconds[f] = Seconds(t0);
    });
  }
  for (auto& t : writers) t.join();
  if (!report) return 0;
  const double gbs = m.Report(absl::StrCat("raw ", write >> 10, " KiB O_DIRECT writes").c_str(),
                              per_file * dirs.size());
  std::printf("  per file, s:");
  for (double s : seconds) std::printf(" %.3f", s);
  std::printf("\n");
  return gbs;
}

int Main() {
  log::SetLevel(absl::GetFlag(FLAGS_log_level));
  const uint64_t blocks =
      static_cast<uint64_t>(absl::GetFlag(FLAGS_gib) * (1ull << 30)) / kBlockBytes;
  const std::string root = absl::GetFlag(FLAGS_dir);
  const std::vector<std::string> dirs = MakeDirs(root, absl::GetFlag(FLAGS_files));
  const auto nfiles = static_cast<uint32_t>(dirs.size());
  // Room for every block, and a tenth more.
  auto layout = pool::PoolLayout::Compute(blocks * (kBlockBytes + 4096) / 10 * 11 + (64ull << 20),
                                          nfiles, kObjectBytes, kObjects);
  if (!layout.ok()) {
    std::fprintf(stderr, "layout: %s\n", layout.status().ToString().c_str());
    return 1;
  }
  std::printf("%u files of %.2f GiB, %llu slots, G = %u; %llu blocks of 2 MiB\n", nfiles,
              layout->file_bytes() / double(1ull << 30), (unsigned long long)layout->num_slots(),
              layout->extent_slots(), (unsigned long long)blocks);
  double store = 0, raw = 0;
  if (absl::GetFlag(FLAGS_warm)) {
    // First writes to fresh tmpfs pages cost more than later ones (seen: the last file's twice
    // the others'); both runs below write pages already written once.
    pool::OpenOrCreatePool(dirs, *layout).IgnoreError();
    RunRaw(*layout, dirs, blocks * kBlockBytes / 10 * 11, /*report=*/false);
  }
  if (absl::GetFlag(FLAGS_store)) store = RunStore(*layout, dirs, root + "/state", blocks);
  if (absl::GetFlag(FLAGS_raw)) {
    if (!absl::GetFlag(FLAGS_store) && !absl::GetFlag(FLAGS_warm)) {
      pool::OpenOrCreatePool(dirs, *layout).IgnoreError();
    }
    raw = RunRaw(*layout, dirs, blocks * kBlockBytes);
  }
  if (store > 0 && raw > 0) std::printf("store_vs_raw_write: %.3f\n", store / raw);
  std::filesystem::remove_all(root);
  return 0;
}

}  // namespace
}  // namespace tutti::store

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tutti::store::Main();
}

// The index and journal at the scale of a large pool: one run per block count (--blocks), so the
// RSS figures of one count never include memory freed by another. Blocks are small (one object of
// 4 KiB, 8 KiB slots): the index and journal do not care about block size, and the pool is an
// io::MemoryDisk, which is sparse (only pages written cost memory), so 2 million slots fit.
//
// Steps, each reported as a results line (bench "scale", metric suffixed with the block count):
//  1. Fill: RegisterNamespace through a BlockStore, then --blocks Put records appended to the
//     journal directly (Journal::Append, a Sync every 65536), exactly as recovery sees a store that
//     wrote them and crashed before any checkpoint. Not through Capture: at 2M blocks that is 31K
//     batches of two syncs each and 16 GiB of object writes, which measures the disk, not the
//     index.
//  2. Recovery from the journal: BlockStore::Open timed; VmRSS before and after gives the store's
//     memory per block (the index, its checksum table, the journal's read buffer; staging is 2
//     MiB).
//  3. Lookup: --samples single-key LookupAndPin + Unpin of random present keys, each pair timed.
//     Stats(): one call timed (it walks per-namespace counts).
//  4. Checkpoint: the store's destructor (final journal sync and checkpoint) timed; file size.
//  5. Recovery from the checkpoint: BlockStore::Open again, timed.
//  6. Eviction: the pool has a few thousand slots more than --blocks. Capture fills those (batches
//     of 64, wait_durable: the control, no eviction), then --evict more blocks, each of which
//     evicts the least recently used one; the per-block time of both is reported, the difference
//     being eviction's cost.
//  7. The index alone (an Index built in the process, no store): Find, and Find + Touch.
// The state directory (--dir) defaults to /dev/shm so the journal's fdatasync costs nothing and
// the eviction delta is not buried under it; recovery reads page-cached files either way.
//
//   bazel build -c opt //bench:scale
//   for n in 10000 100000 1000000 2000000; do
//     bazel-bin/bench/scale --blocks=$n --out=$PWD/bench/results/scale.jsonl; done
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/jsonl.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "daemon/io/memory_backend.h"
#include "daemon/store/block_store.h"
#include "daemon/store/index.h"
#include "daemon/store/journal.h"

ABSL_FLAG(uint64_t, blocks, 10000, "blocks in the index");
ABSL_FLAG(uint64_t, samples, 200000, "timed lookups");
ABSL_FLAG(uint64_t, evict, 4096, "blocks captured into the full pool (each evicts one)");
ABSL_FLAG(bool, shuffle_slots, false,
          "fill slots in a random order (as after eviction churn) instead of 0, 1, 2, ...");
ABSL_FLAG(std::string, dir, "/dev/shm/tutti-scale-bench", "state directory (removed first)");
ABSL_FLAG(std::string, out, "", "JSON lines file to append to");
ABSL_FLAG(std::string, machine, "", "machine description for the results");
ABSL_FLAG(std::string, label, "", "detail written on every results line (e.g. the code measured)");

namespace tutti::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr uint32_t kObjectBytes = 4096;
constexpr uint64_t kSlotBytes = kObjectBytes + 4096;  // one object and the header
constexpr uint64_t kSpareSlots = 4096;                // free slots past --blocks (at least)

double SecondsSince(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// VmRSS of this process in bytes, 0 if unreadable.
uint64_t RssBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

tutti::v1::Namespace BenchNamespace() {
  tutti::v1::Namespace ns;
  ns.set_model_id("scale-bench");
  ns.set_hash_scheme("bench");
  ns.set_tp_size(1);
  auto* l = ns.mutable_layout();
  l->set_num_layers(1);
  l->set_kv_heads(1);
  l->set_head_dim(64);
  l->set_dtype_bytes(2);
  l->set_block_tokens(16);  // 16 x 1 x 64 x 2 = 2 KiB, one frame of 4 KiB
  l->set_format(tutti::v1::KV_FORMAT_MLA);
  return ns;
}

Key KeyOf(uint64_t i) {
  Key k;
  uint64_t a = i * 0x9E3779B97F4A7C15ull + 1, b = (i + 7) * 0xC2B2AE3D27D4EB4Full;
  std::memcpy(k.bytes.data(), &a, 8);
  std::memcpy(k.bytes.data() + 8, &b, 8);
  return k;
}

struct Run {
  uint64_t blocks = 0, slots = 0;
  std::vector<Result> results;
  void Add(const std::string& metric, double value, const std::string& unit,
           const std::string& baseline = "", double baseline_value = 0) {
    results.push_back({absl::StrCat(metric, "_", blocks), value, unit,
                       baseline.empty() ? "" : absl::StrCat(baseline, "_", blocks),
                       baseline_value});
    std::printf("%-40s %12.3f %s\n", results.back().metric.c_str(), value, unit.c_str());
  }
};

// Appends `n` Put records for keys [0, n) in slots [0, n) (in a random order with
// --shuffle_slots) to the journal in `dir`.
absl::Status FillJournal(const std::string& dir, NamespaceId ns, uint64_t n) {
  ASSIGN_OR_RETURN(auto journal, store::Journal::Open(dir, {}, nullptr));
  std::vector<uint32_t> slots(n);
  for (uint64_t i = 0; i < n; ++i) slots[i] = static_cast<uint32_t>(i);
  if (absl::GetFlag(FLAGS_shuffle_slots)) std::shuffle(slots.begin(), slots.end(), std::mt19937(3));
  store::PutRecord r;
  r.ns = ns;
  r.object_len = 2048;
  r.checksums = {0};
  for (uint64_t i = 0; i < n; ++i) {
    r.key = KeyOf(i);
    r.slot = slots[i];
    r.epoch = i + 1;
    r.checksums[0] = i * 31;
    const uint64_t seq = journal->Append(r);
    if (i % 65536 == 65535 || i + 1 == n) RETURN_IF_ERROR(journal->Sync(seq));
  }
  return absl::OkStatus();
}

void MeasureLookups(Run* run, store::BlockStore* store, NamespaceId ns) {
  const uint64_t samples = absl::GetFlag(FLAGS_samples);
  std::vector<double> us;
  us.reserve(samples);
  std::mt19937_64 rng(11);
  uint64_t misses = 0;
  for (uint64_t i = 0; i < samples; ++i) {
    const Key k = KeyOf(rng() % run->blocks);
    const auto t0 = SteadyClock::now();
    const bool hit = store->LookupAndPin(ns, {&k, 1}) == 1;
    if (hit) store->Unpin(ns, {&k, 1});
    us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
    misses += !hit;
  }
  std::sort(us.begin(), us.end());
  run->Add("lookup_p50", us[us.size() / 2], "us");
  run->Add("lookup_p99", us[us.size() * 99 / 100], "us");
  if (misses > 0) std::printf("WARNING: %llu lookups missed\n", (unsigned long long)misses);
  const auto t0 = SteadyClock::now();
  (void)store->Stats();
  run->Add("stats_call", SecondsSince(t0) * 1e3, "ms");
}

// The index alone (no store lock, no stats): Find, and Find + Touch, of random present keys, to
// tell the hash probe from the LRU relink. Median of --samples, in ns.
void MeasureIndexAlone(Run* run) {
  store::Index index(run->blocks, 1);
  for (uint64_t i = 0; i < run->blocks; ++i) index.Insert(1, KeyOf(i), i, i + 1, 2048, {i});
  const uint64_t samples = absl::GetFlag(FLAGS_samples);
  for (const bool touch : {false, true}) {
    std::vector<double> ns;
    ns.reserve(samples);
    std::mt19937_64 rng(13);
    for (uint64_t i = 0; i < samples; ++i) {
      const Key k = KeyOf(rng() % run->blocks);
      const auto t0 = SteadyClock::now();
      store::Entry* e = index.Find(1, k);
      if (touch) index.Touch(e);
      ns.push_back(std::chrono::duration<double, std::nano>(SteadyClock::now() - t0).count());
    }
    std::sort(ns.begin(), ns.end());
    run->Add(touch ? "index_find_touch_p50" : "index_find_p50", ns[ns.size() / 2], "ns");
  }
}

// Captures keys [first, first + n) in batches of 64, waiting for durability; seconds per block.
absl::StatusOr<double> CaptureRange(store::BlockStore* store, NamespaceId ns, uint64_t first,
                                    uint64_t n) {
  const store::BlockStore::Gatherer fill = [](absl::Span<const engine::CopyOp> ops) {
    for (const engine::CopyOp& op : ops) std::memset(op.staging, op.block & 0xff, 2048);
    return absl::OkStatus();
  };
  const auto t0 = SteadyClock::now();
  for (uint64_t i = first; i < first + n; i += 64) {
    std::vector<Key> keys;
    for (uint64_t k = i; k < std::min(first + n, i + 64); ++k) keys.push_back(KeyOf(k));
    ASSIGN_OR_RETURN(auto out, store->Capture(ns, keys, 0, 1, fill, true));
    for (auto o : out) {
      if (o != store::CaptureOutcome::kDurable) return absl::InternalError("block not durable");
    }
  }
  return SecondsSince(t0) / static_cast<double>(n);
}

absl::Status RunScale(Run* run) {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSIGN_OR_RETURN(auto layout, pool::PoolLayout::Compute(
                                    (run->blocks + kSpareSlots + 512) * kSlotBytes + (4ull << 20),
                                    1, kObjectBytes, 1));
  run->slots = layout.num_slots();
  if (run->slots < run->blocks + kSpareSlots) return absl::InternalError("pool too small");
  ASSIGN_OR_RETURN(auto disk, io::MemoryDisk::Create({layout.file_bytes()}));
  store::StoreOptions options;
  options.state_dir = dir;
  options.layout = layout;
  options.store_staging_bytes = 1 << 20;
  options.retrieve_staging_bytes = 1 << 20;
  options.checkpoint_every = 1u << 30;  // only the one at shutdown
  auto open = [&]() {
    return store::BlockStore::Open(options, io::MemoryBackend::CreateOn(disk), Clock::Real());
  };
  NamespaceId ns;
  {
    ASSIGN_OR_RETURN(auto store, open());
    ASSIGN_OR_RETURN(ns, store->RegisterNamespace(BenchNamespace()));
  }
  auto t0 = SteadyClock::now();
  RETURN_IF_ERROR(FillJournal(dir, ns, run->blocks));
  std::printf("filled the journal with %llu Puts in %.2f s (pool of %llu slots)\n",
              (unsigned long long)run->blocks, SecondsSince(t0), (unsigned long long)run->slots);

  const uint64_t rss0 = RssBytes();
  t0 = SteadyClock::now();
  ASSIGN_OR_RETURN(auto store, open());
  run->Add("recovery_from_journal", SecondsSince(t0), "s");
  const uint64_t rss1 = RssBytes();
  run->Add("store_rss_per_block", static_cast<double>(rss1 - rss0) / run->blocks, "bytes");
  if (store->Stats().slots_used != run->blocks) return absl::InternalError("blocks lost");
  MeasureLookups(run, store.get(), ns);

  t0 = SteadyClock::now();
  store.reset();
  run->Add("checkpoint_at_shutdown", SecondsSince(t0), "s");
  run->Add("checkpoint_bytes_per_block",
           static_cast<double>(std::filesystem::file_size(dir + "/checkpoint")) / run->blocks,
           "bytes");
  t0 = SteadyClock::now();
  ASSIGN_OR_RETURN(store, open());
  run->Add("recovery_from_checkpoint", SecondsSince(t0), "s");

  const uint64_t free_slots = run->slots - run->blocks;
  ASSIGN_OR_RETURN(const double into_free, CaptureRange(store.get(), ns, run->blocks, free_slots));
  ASSIGN_OR_RETURN(const double evicting,
                   CaptureRange(store.get(), ns, run->slots, absl::GetFlag(FLAGS_evict)));
  run->Add("capture_into_free_slot", into_free * 1e6, "us");
  run->Add("capture_evicting", evicting * 1e6, "us", "capture_into_free_slot", into_free * 1e6);
  if (store->Stats().evictions != absl::GetFlag(FLAGS_evict)) {
    return absl::InternalError("eviction count mismatch");
  }
  store.reset();
  std::filesystem::remove_all(dir);
  MeasureIndexAlone(run);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Run run;
  run.blocks = absl::GetFlag(FLAGS_blocks);
  if (run.blocks == 0) return 2;
  if (absl::Status s = RunScale(&run); !s.ok()) {
    std::fprintf(stderr, "scale, %llu blocks: %s\n", (unsigned long long)run.blocks,
                 s.ToString().c_str());
    return 1;
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return 0;
  std::string machine = absl::GetFlag(FLAGS_machine);
  if (machine.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    machine = absl::StrCat(host, ", ", std::thread::hardware_concurrency(), " cores");
  }
  std::ofstream f(out, std::ios::app);
  const std::string date = UtcNow(), command = CommandLine(argc, argv);
  const std::string label = absl::GetFlag(FLAGS_label);
  for (Result& r : run.results) {
    if (!label.empty()) r.detail = label;
    f << JsonLine("scale", r, machine, date, command) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tutti::bench::Main(argc, argv);
}

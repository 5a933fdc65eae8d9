// How long lookups wait while the store writes a checkpoint: the checkpoint copied under the
// store's lock a chunk of slots at a time (StoreOptions::checkpoint_chunk_slots, the default 1024)
// against the whole checkpoint encoded and written under one hold (0: the behaviour before
// chunking), in the same run.
//
// Per variant: an in-memory pool filled with --blocks blocks (the journal and checkpoint on --dir,
// a real directory), reopened with a checkpoint every 32 records; then --rounds rounds, each
// storing 32 blocks, so the writer checkpoints every block while a thread does single-key
// LookupAndPin + Unpin of random stored keys without pause (the pair timed). Reports the latency over
// the rounds: the median round's maximum, the largest maximum, the 99.9th percentile and the
// median.
//
//   bazel run -c opt //bench:checkpoint_bench -- --out=$PWD/bench/results/checkpoint.jsonl
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/jsonl.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "daemon/io/memory_backend.h"
#include "daemon/store/block_store.h"

ABSL_FLAG(uint32_t, blocks, 60000, "blocks stored before the measured checkpoint");
ABSL_FLAG(uint32_t, layers, 4, "layers per block (K and V, 4 KiB objects)");
ABSL_FLAG(uint32_t, rounds, 7, "checkpoints measured per variant");
ABSL_FLAG(std::vector<std::string>, chunk_slots, std::vector<std::string>({"0", "1024"}),
          "checkpoint_chunk_slots variants; the first is the baseline");
ABSL_FLAG(std::string, dir, "/var/tmp/tutti-checkpoint-bench", "journal and checkpoint directory");
ABSL_FLAG(std::string, out, "", "JSON lines file to append to");
ABSL_FLAG(std::string, machine, "", "machine description for the results");

namespace tutti::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr uint32_t kObjectBytes = 4096;

tutti::v1::Namespace BenchNamespace(uint32_t layers) {
  tutti::v1::Namespace ns;
  ns.set_model_id("checkpoint-bench");
  ns.set_hash_scheme("bench");
  ns.set_tp_size(1);
  auto* l = ns.mutable_layout();
  l->set_num_layers(layers);
  l->set_kv_heads(1);
  l->set_head_dim(128);
  l->set_dtype_bytes(2);
  l->set_block_tokens(16);  // 16 x 1 x 128 x 2 = 4 KiB per object
  l->set_format(tutti::v1::KV_FORMAT_SEPARATE);
  return ns;
}

Key KeyOf(uint64_t i) {
  Key k;
  for (int b = 0; b < 16; ++b) k.bytes[b] = static_cast<uint8_t>((i >> (8 * (b % 8))) ^ (b * 29));
  return k;
}

struct Window {
  double median_us = 0, p999_us = 0, max_us = 0, median_round_max_us = 0, window_ms = 0;
  uint64_t lookups = 0;
};

absl::StatusOr<Window> RunVariant(uint64_t chunk_slots) {
  const uint32_t blocks = absl::GetFlag(FLAGS_blocks);
  const uint32_t layers = absl::GetFlag(FLAGS_layers);
  const uint32_t objects = 2 * layers;
  const std::string dir = absl::StrCat(absl::GetFlag(FLAGS_dir), "/chunk", chunk_slots);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const uint64_t slot_bytes = uint64_t{objects} * kObjectBytes + 4096;
  ASSIGN_OR_RETURN(auto layout,
                   pool::PoolLayout::Compute((blocks + 2048) * slot_bytes, 1, kObjectBytes, objects));
  ASSIGN_OR_RETURN(auto disk, io::MemoryDisk::Create({layout.file_bytes()}));
  store::StoreOptions options;
  options.state_dir = dir;
  options.layout = layout;
  options.store_staging_bytes = 64ull * objects * kObjectBytes;
  options.retrieve_staging_bytes = 64ull * objects * kObjectBytes;
  options.checkpoint_every = 1u << 30;  // none while filling
  options.checkpoint_chunk_slots = chunk_slots;
  std::unique_ptr<store::BlockStore> store;
  auto open = [&]() -> absl::Status {
    store.reset();
    ASSIGN_OR_RETURN(store, store::BlockStore::Open(options, io::MemoryBackend::CreateOn(disk),
                                                    Clock::Real()));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(open());
  ASSIGN_OR_RETURN(const NamespaceId ns, store->RegisterNamespace(BenchNamespace(layers)));
  const store::BlockStore::Gatherer fill = [](absl::Span<const engine::CopyOp> ops) {
    for (const engine::CopyOp& op : ops) std::memset(op.staging, op.block & 0xff, kObjectBytes);
    return absl::OkStatus();
  };
  auto store_range = [&](uint64_t first, uint64_t n) -> absl::Status {
    for (uint64_t i = first; i < first + n; i += 32) {
      std::vector<Key> keys;
      for (uint64_t k = i; k < std::min(first + n, i + 32); ++k) keys.push_back(KeyOf(k));
      ASSIGN_OR_RETURN(auto out, store->Capture(ns, keys, 0, layers, fill, true));
      for (auto o : out) {
        if (o != store::CaptureOutcome::kDurable) return absl::InternalError("store not durable");
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(store_range(0, blocks));
  options.checkpoint_every = 32;  // every round's stores end in a checkpoint of every block
  RETURN_IF_ERROR(open());        // (a clean shutdown, and recovery from its checkpoint)

  const uint32_t rounds = absl::GetFlag(FLAGS_rounds);
  std::vector<double> all_us, round_max_us;
  double window_ms = 0;
  for (uint32_t round = 0; round < rounds; ++round) {
    std::atomic<bool> stop{false};
    std::vector<double> latencies_us;
    latencies_us.reserve(1 << 20);
    std::thread looker([&] {
      std::mt19937_64 rng(7 + round);
      while (!stop.load(std::memory_order_relaxed)) {
        const Key k = KeyOf(rng() % blocks);
        // Both calls take the store's lock: timed together, so a checkpoint that starts while
        // the thread is in either is seen.
        const auto t0 = SteadyClock::now();
        if (store->LookupAndPin(ns, {&k, 1}) == 1) store->Unpin(ns, {&k, 1});
        const auto t1 = SteadyClock::now();
        latencies_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    });
    const auto start = SteadyClock::now();
    // 32 blocks: one batch, then the checkpoint; the next store waits behind it (one writer
    // thread), so the window covers the whole checkpoint.
    absl::Status s = store_range(blocks + 64ull * round, 32);
    if (s.ok()) s = store_range(blocks + 64ull * round + 32, 1);
    window_ms += std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
    stop = true;
    looker.join();
    RETURN_IF_ERROR(s);
    if (latencies_us.empty()) return absl::InternalError("no lookups ran");
    round_max_us.push_back(*std::max_element(latencies_us.begin(), latencies_us.end()));
    all_us.insert(all_us.end(), latencies_us.begin(), latencies_us.end());
  }
  Window w;
  w.window_ms = window_ms;
  w.lookups = all_us.size();
  std::sort(all_us.begin(), all_us.end());
  std::sort(round_max_us.begin(), round_max_us.end());
  w.median_us = all_us[all_us.size() / 2];
  w.p999_us = all_us[std::min(all_us.size() - 1, all_us.size() * 999 / 1000)];
  w.max_us = all_us.back();
  w.median_round_max_us = round_max_us[round_max_us.size() / 2];
  const uint64_t checkpoint_bytes = std::filesystem::file_size(dir + "/checkpoint");
  std::printf("chunk_slots %-6llu checkpoint %.1f MiB, %u rounds: %llu lookups in %.0f ms; median "
              "%.2f us, p99.9 %.1f us, round max: median %.1f us, largest %.1f us\n",
              static_cast<unsigned long long>(chunk_slots), checkpoint_bytes / 1048576.0, rounds,
              static_cast<unsigned long long>(w.lookups), w.window_ms, w.median_us, w.p999_us,
              w.median_round_max_us, w.max_us);
  store.reset();
  std::filesystem::remove_all(dir);
  return w;
}

int Main(int argc, char** argv) {
  const std::string command = CommandLine(argc, argv);
  std::vector<uint64_t> variants;
  for (const std::string& v : absl::GetFlag(FLAGS_chunk_slots)) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(v, &n)) {
      std::fprintf(stderr, "--chunk_slots: %s is not a number\n", v.c_str());
      return 2;
    }
    variants.push_back(n);
  }
  if (variants.empty()) return 2;
  std::vector<Result> results;
  Window base;
  for (size_t i = 0; i < variants.size(); ++i) {
    absl::StatusOr<Window> w = RunVariant(variants[i]);
    if (!w.ok()) {
      std::fprintf(stderr, "chunk_slots %llu: %s\n", static_cast<unsigned long long>(variants[i]),
                   w.status().ToString().c_str());
      return 1;
    }
    if (i == 0) base = *w;
    const std::string name = absl::StrCat("lookup_during_checkpoint_", absl::GetFlag(FLAGS_blocks),
                                          "blocks_chunk", variants[i]);
    const std::string base_name = absl::StrCat("lookup_during_checkpoint_",
                                               absl::GetFlag(FLAGS_blocks), "blocks_chunk",
                                               variants[0]);
    results.push_back({name + "_round_max_median", w->median_round_max_us, "us",
                       i == 0 ? "" : base_name + "_round_max_median", base.median_round_max_us});
    results.push_back({name + "_max", w->max_us, "us", i == 0 ? "" : base_name + "_max",
                       base.max_us});
    results.push_back({name + "_p999", w->p999_us, "us", i == 0 ? "" : base_name + "_p999",
                       base.p999_us});
    results.push_back({name + "_median", w->median_us, "us", "", 0});
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    std::string machine = absl::GetFlag(FLAGS_machine);
    if (machine.empty()) {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      machine = absl::StrCat(host, ", ", std::thread::hardware_concurrency(), " cores");
    }
    std::ofstream f(out, std::ios::app);
    const std::string date = UtcNow();
    for (const Result& r : results) {
      f << JsonLine("checkpoint_bench", r, machine, date, command) << "\n";
    }
  }
  return 0;
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tutti::bench::Main(argc, argv);
}

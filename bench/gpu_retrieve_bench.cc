// Retrieve into random 16-token paged blocks of a Llama-3-8B-shaped cache (32 layers, fused K/V,
// 32 KiB objects), measured on a GPU machine, each figure against a baseline of the same run:
//
//  inproc: the daemon's data path alone (gpu::LayerCopier, as tuttid uses it) from pinned host
//    staging, layer by layer with a ready word per layer: staged (copy engine + device-to-device
//    scatter) and mapped (scatter kernel over PCIe), against one contiguous pinned -> GPU copy per
//    layer, with several copy-then-scatter round sizes; the naive path (one cudaMemcpyAsync per
//    object); registered memory laid out like the DRAM tier (a chunk per block), with pitched 2D
//    copies and with one copy per run; the whole transfer in one piece.
//  dram: through a real tuttid (GPU mode, blocks in its DRAM tier), this process the engine: GB/s
//    from sending the Retrieve to the last layer's ready word releasing the engine's stream, and
//    the time to layer 0 and to the last layer.
//  ssd: the same with the DRAM tier off, so reads hit the pool files (O_DIRECT, io_uring), against
//    raw liburing O_DIRECT random reads of the same file and span at the same queue depth, of the
//    object size (32 KiB) and of 1 MiB (ssd_read_vs_raw_1mib); tuttid's CPU seconds per GB moved
//    (utime + stime of its process over the retrieves); --ssd_label names the variant, and
//    --extent_slots / --max_read_bytes set tuttid's pool.extent_slots and datapath.max_read_bytes
//    (1 and 32768: the per-object reads of format 1), so two runs compare the layouts.
//  stores: SSD-tier retrieve GB/s while a second engine stores new blocks continuously (no
//    wait for durability, rejected blocks dropped) against retrieve alone, same daemon, alternated
//    (retrieve_with_stores_vs_alone); then how long store staging takes to drain once stores stop.
//
// Every part that runs tuttid in GPU mode prints how many layers its copier sent through the copy
// engines (gpu.scatter "auto" switches when its timed scatter kernels run slow).
//
// JSON lines (bench, metric, value, unit, baseline_name, baseline_value, ratio, machine, date,
// command) are appended to --out.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/jsonl.h"
#include "common/status_macros.h"
#include "daemon/gpu/layer_copier.h"
#include "daemon/gpu/testing/kv_layout.h"
#include "gpu/cuda_status.h"
#include "gpu/pinned.h"
#include "gpu/probe.h"
#include "gpu/testing/test_util.h"
#include "tests/gpu/gpu_engine.h"
#include "tests/gpu/tuttid_runner.h"

ABSL_FLAG(std::string, parts, "inproc,dram,ssd", "which parts to run (inproc, dram, ssd, stores)");
ABSL_FLAG(uint32_t, blocks, 2048, "blocks per retrieve (inproc, dram)");
ABSL_FLAG(uint32_t, ssd_blocks, 512, "blocks per retrieve from the SSD tier");
ABSL_FLAG(uint32_t, engine_blocks, 8192, "engine blocks per layer tensor");
ABSL_FLAG(uint32_t, reps, 5, "repetitions (the median is reported)");
ABSL_FLAG(uint32_t, sms, 16, "I/O green-context SMs (inproc and tuttid)");
ABSL_FLAG(std::string, scatter, "auto", "tuttid's gpu.scatter for the dram and ssd parts");
ABSL_FLAG(std::vector<std::string>, round_kib, std::vector<std::string>({"0", "8192", "2048"}),
          "inproc staged: copy-then-scatter round sizes to measure, KiB (0: a whole slot)");
ABSL_FLAG(std::string, ssd_label, "", "ssd and stores parts: suffix of their metric names");
ABSL_FLAG(uint32_t, extent_slots, 0, "tuttid's pool.extent_slots (0: its default)");
ABSL_FLAG(uint32_t, max_read_bytes, 0, "tuttid's datapath.max_read_bytes (0: its default)");
ABSL_FLAG(uint32_t, queue_depth, 64, "tuttid's io.queue_depth, and the raw reads' queue depth");
ABSL_FLAG(double, ssd_pool_gib, 6, "pool size of the ssd and stores parts, GiB");
ABSL_FLAG(std::string, out, "", "JSON lines file to append to");
ABSL_FLAG(std::string, machine, "", "machine description");

namespace tutti::bench {
namespace {

using gpu::CudaStatus;
using gputest::EngineShape;
using gputest::GpuEngine;
using gputest::TuttidRunner;

constexpr uint32_t kLayers = 32, kObj = 32768, kParts = 2;
constexpr uint64_t kDefaultRoundBytes = 8ull << 20;  // config/default.textproto gpu.round_bytes
constexpr uint32_t kWindow = 4;  // layers of pinned staging, reused round robin like the store's

using Record = Result;
std::vector<Record> g_records;

void Add(Record r) {
  const bool base = !r.baseline_name.empty();
  std::printf("%-58s %10.3f %-4s %s\n", r.metric.c_str(), r.value, r.unit.c_str(),
              base ? absl::StrCat("vs ", r.baseline_name, " ", r.baseline_value, " (ratio ",
                                  r.value / r.baseline_value, ")")
                         .c_str()
                   : "");
  std::fflush(stdout);
  g_records.push_back(std::move(r));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

// ---- in-process data path ----

struct InProc {
  std::unique_ptr<gpu::IoStream> io;
  gpu::testing::KvLayout kv;
  std::vector<gpu::LocalRegion> regions;
  std::unique_ptr<gpu::PinnedRegion> pinned;  // kWindow layers
  std::unique_ptr<gpu::PinnedRegion> chunks;  // the same size, laid out like the DRAM tier
  uint8_t* contiguous = nullptr;              // one layer of device memory
  std::vector<uint32_t> blocks;
  uint64_t layer_bytes = 0;
  std::unique_ptr<gpu::ReadyWordArray> words_array;
  std::unique_ptr<gpu::ReadyWords> words;
  ~InProc() {
    words.reset();
    for (auto& r : regions) cudaFree(r.device_ptr);
    cudaFree(contiguous);
  }
  // Layer l's ops with staging in `base` (kWindow layers, round robin).
  std::vector<engine::CopyOp> Ops(uint32_t layer, uint8_t* base) const {
    std::vector<engine::CopyOp> ops;
    uint8_t* src = base + (layer % kWindow) * layer_bytes;
    for (uint32_t b : blocks) {
      for (uint32_t p = 0; p < kParts; ++p, src += kObj)
        ops.push_back({b, layer * kParts + p, src});
    }
    return ops;
  }
};

absl::Status SetUpInProc(InProc* s) {
  const uint32_t n = absl::GetFlag(FLAGS_blocks);
  ASSIGN_OR_RETURN(s->io, gpu::IoStream::Create({0, absl::GetFlag(FLAGS_sms), 0}));
  std::printf("I/O stream: %s, %u CTAs\n", s->io->description().c_str(), s->io->ctas());
  s->kv = gpu::testing::MakeKvLayout(gpu::testing::KvFormat::kFusedKv, kLayers,
                                     absl::GetFlag(FLAGS_engine_blocks), kObj);
  for (uint64_t size : s->kv.region_sizes) {
    void* p = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, size), "cudaMalloc(KV)"));
    s->regions.push_back({p, size});
  }
  s->layer_bytes = uint64_t{n} * kParts * kObj;
  ASSIGN_OR_RETURN(s->pinned, gpu::PinnedRegion::Allocate(kWindow * s->layer_bytes));
  std::memset(s->pinned->host(), 0x3c, kWindow * s->layer_bytes);
  ASSIGN_OR_RETURN(s->chunks, gpu::PinnedRegion::Allocate(kWindow * s->layer_bytes));
  std::memset(s->chunks->host(), 0x3c, kWindow * s->layer_bytes);
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&s->contiguous), s->layer_bytes),
                             "cudaMalloc(contiguous)"));
  s->blocks = gpu::testing::RandomBlocks(3, n, absl::GetFlag(FLAGS_engine_blocks));
  ASSIGN_OR_RETURN(s->words_array, gpu::ReadyWordArray::Create(0, kLayers + 1));
  ASSIGN_OR_RETURN(s->words,
                   gpu::ReadyWords::WrapLocal(s->words_array->word(0), kLayers + 1, s->io.get()));
  return absl::OkStatus();
}

// Median seconds of `reps` runs of `body` (after one warm-up).
absl::StatusOr<double> Time(const std::function<absl::Status()>& body) {
  RETURN_IF_ERROR(body());
  std::vector<double> t;
  for (uint32_t r = 0; r < absl::GetFlag(FLAGS_reps); ++r) {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(body());
    t.push_back(Seconds(start));
  }
  return Median(t);
}

// Layer by layer through a copier; *first gets the median time to layer 0.
// With `overlap`, every layer but the last returns once enqueued (LayerCopier::Wait::kPrevious),
// as tuttid does for DRAM-tier layers; the time to layer 0 is then the time to its enqueue.
absl::StatusOr<double> TimeLayered(InProc& s, gpu::LayerCopier& copier, gpu::CudaIpcMemory& mem,
                                   uint8_t* base, double* first, bool overlap = false) {
  std::vector<double> firsts;
  uint32_t ticket = 0;
  auto run = [&]() -> absl::Status {
    const absl::Time start = absl::Now();
    ++ticket;
    for (uint32_t l = 0; l < kLayers; ++l) {
      const auto wait = overlap && l + 1 < kLayers ? gpu::LayerCopier::Wait::kPrevious
                                                   : gpu::LayerCopier::Wait::kLanded;
      RETURN_IF_ERROR(copier.ScatterLayer(&mem, s.Ops(l, base), s.words.get(), l, ticket, wait));
      if (l == 0) firsts.push_back(Seconds(start));
    }
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(double t, Time(run));
  firsts.erase(firsts.begin());  // warm-up
  *first = Median(firsts);
  return t;
}

absl::Status RunInProc() {
  InProc s;
  RETURN_IF_ERROR(SetUpInProc(&s));
  const double total = static_cast<double>(s.layer_bytes) * kLayers;
  cudaStream_t st = s.io->stream();
  ASSIGN_OR_RETURN(
      double contiguous, Time([&]() -> absl::Status {
        for (uint32_t l = 0; l < kLayers; ++l) {
          RETURN_IF_ERROR(CudaStatus(
              cudaMemcpyAsync(s.contiguous, s.pinned->host() + (l % kWindow) * s.layer_bytes,
                              s.layer_bytes, cudaMemcpyHostToDevice, st),
              "contiguous copy"));
        }
        return s.io->Synchronize();
      }));
  const double base_gbps = total / contiguous / 1e9;
  Add({"contiguous_pinned_to_gpu", base_gbps, "GB/s", "", 0});
  // The whole transfer as one piece: nothing is ready before all of it has landed.
  Add({"one_piece_contiguous_ready", contiguous * 1e3, "ms", "", 0});
  std::vector<uint8_t*> bases;
  for (const auto& r : s.regions) bases.push_back(static_cast<uint8_t*>(r.device_ptr));
  ASSIGN_OR_RETURN(double naive, Time([&]() -> absl::Status {
                     for (uint32_t l = 0; l < kLayers; ++l) {
                       for (const engine::CopyOp& op : s.Ops(l, s.pinned->host())) {
                         const auto& p = s.kv.layout.placements[op.object];
                         RETURN_IF_ERROR(CudaStatus(
                             cudaMemcpyAsync(bases[p.region] + p.offset + op.block * p.block_stride,
                                             op.staging, kObj, cudaMemcpyHostToDevice, st),
                             "naive copy"));
                       }
                     }
                     return s.io->Synchronize();
                   }));
  Add({"naive_memcpy_per_object", total / naive / 1e9, "GB/s", "contiguous_pinned_to_gpu",
       base_gbps});
  // Staged with each round size (0: a whole slot, the names of earlier runs), then mapped.
  std::vector<std::pair<gpu::LayerCopier::Mode, uint64_t>> variants;
  for (const std::string& kib : absl::GetFlag(FLAGS_round_kib)) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(kib, &v)) return absl::InvalidArgumentError("--round_kib: " + kib);
    variants.push_back({gpu::LayerCopier::Mode::kStaged, v << 10});
  }
  variants.push_back({gpu::LayerCopier::Mode::kMapped, 0});
  variants.push_back({gpu::LayerCopier::Mode::kCopyEngine, 0});
  variants.push_back({gpu::LayerCopier::Mode::kAuto, kDefaultRoundBytes});
  for (const auto& [mode, round] : variants) {
    const std::string name =
        absl::StrCat(std::string(gpu::LayerCopier::ModeName(mode)),
                     round == 0 ? "" : absl::StrCat("_round", round >> 10, "k"));
    ASSIGN_OR_RETURN(auto copier,
                     gpu::LayerCopier::Create({mode, s.layer_bytes, /*bounce_threads=*/4, round},
                                              s.io.get(), {s.pinned->staging()}));
    ASSIGN_OR_RETURN(auto mem, gpu::CudaIpcMemory::WrapLocal(
                                   s.kv.layout, s.regions, copier->staging_regions(), s.io.get()));
    double first = 0;
    ASSIGN_OR_RETURN(double t, TimeLayered(s, *copier, *mem, s.pinned->host(), &first));
    Add({"datapath_" + name + "_layered_pinned", total / t / 1e9, "GB/s",
         "contiguous_pinned_to_gpu", base_gbps});
    if (mode == gpu::LayerCopier::Mode::kStaged) {
      Add({"datapath_" + name + "_layer0_ready", first * 1e3, "ms", "", 0});
      Add({"datapath_" + name + "_last_layer_ready", t * 1e3, "ms", "one_piece_contiguous_ready",
           contiguous * 1e3});
    }
    if (mode == gpu::LayerCopier::Mode::kStaged && round == kDefaultRoundBytes) {
      // The same with the next layer's copies overlapping each layer's tail (tuttid's DRAM path).
      ASSIGN_OR_RETURN(double o, TimeLayered(s, *copier, *mem, s.pinned->host(), &first, true));
      Add({"datapath_" + name + "_overlapped_layered_pinned", total / o / 1e9, "GB/s",
           "contiguous_pinned_to_gpu", base_gbps});
      Add({"datapath_" + name + "_overlapped_last_layer_ready", o * 1e3, "ms",
           "one_piece_contiguous_ready", contiguous * 1e3});
    }
  }
  // Registered memory laid out as tuttid's DRAM tier holds blocks: a chunk per block, each
  // layer's K and V adjacent (a 64 KiB run), chunks side by side (here 4 layers a chunk, 256 KiB
  // apart; tuttid's chunks hold all 32 layers, 2 MiB apart), so a layer is 2048 runs at a constant
  // pitch. One pitched 2D copy per round (the default) against one copy per run (as before).
  auto dram_like = [&](uint32_t layer) {
    std::vector<engine::CopyOp> ops;
    for (size_t i = 0; i < s.blocks.size(); ++i) {
      uint8_t* src =
          s.chunks->host() + i * kWindow * kParts * kObj + (layer % kWindow) * kParts * kObj;
      for (uint32_t p = 0; p < kParts; ++p)
        ops.push_back({s.blocks[i], layer * kParts + p, src + p * kObj});
    }
    return ops;
  };
  for (bool strided : {true, false}) {
    ASSIGN_OR_RETURN(auto copier,
                     gpu::LayerCopier::Create({gpu::LayerCopier::Mode::kStaged, s.layer_bytes,
                                               /*bounce_threads=*/0, kDefaultRoundBytes, strided},
                                              s.io.get(), {s.chunks->staging()}));
    ASSIGN_OR_RETURN(auto mem, gpu::CudaIpcMemory::WrapLocal(
                                   s.kv.layout, s.regions, copier->staging_regions(), s.io.get()));
    uint32_t ticket = 5000;
    ASSIGN_OR_RETURN(double h, Time([&]() -> absl::Status {
                       ++ticket;
                       for (uint32_t l = 0; l < kLayers; ++l) {
                         RETURN_IF_ERROR(copier->ScatterLayer(mem.get(), dram_like(l),
                                                              s.words.get(), l, ticket));
                       }
                       return absl::OkStatus();
                     }));
    Add({strided ? "datapath_staged_layered_dram_chunks_2d"
                 : "datapath_staged_layered_dram_chunks_per_run",
         total / h / 1e9, "GB/s", "contiguous_pinned_to_gpu", base_gbps});
  }
  return absl::OkStatus();
}

// ---- through tuttid ----

std::string DaemonConfig(uint64_t dram_bytes) {
  const uint32_t extent_slots = absl::GetFlag(FLAGS_extent_slots);
  const uint32_t max_read = absl::GetFlag(FLAGS_max_read_bytes);
  const uint64_t pool_bytes =
      dram_bytes > 0 ? 6ull << 30
                     : static_cast<uint64_t>(absl::GetFlag(FLAGS_ssd_pool_gib) * (1 << 30));
  return absl::StrCat(
      "pool { capacity_bytes: ", pool_bytes, " object_bytes: 32768 max_objects: 64",
      extent_slots > 0 ? absl::StrCat(" extent_slots: ", extent_slots) : "", " }\n",
      max_read > 0 ? absl::StrCat("datapath { max_read_bytes: ", max_read, " }\n") : "",
      "io { backend: \"uring\" queue_depth: ", absl::GetFlag(FLAGS_queue_depth), " }\n",
      "dram { capacity_bytes: ", dram_bytes, " }\n",
      "limits { max_blocks_per_call: 2048 store_staging_bytes: 268435456 "
      "retrieve_staging_bytes: 536870912 max_store_staging_bytes_per_session: 268435456 }\n",
      "gpu { mode: \"cuda\" io_sm_count: ", absl::GetFlag(FLAGS_sms), " scatter: \"",
      absl::GetFlag(FLAGS_scatter), "\" }\n");
}

std::vector<uint32_t> Iota(uint32_t n) {
  std::vector<uint32_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

absl::Status StoreAll(GpuEngine& e, const std::vector<uint32_t>& blocks) {
  for (size_t i = 0; i < blocks.size(); i += 64) {
    const size_t n = std::min<size_t>(64, blocks.size() - i);
    std::vector<uint32_t> part(blocks.begin() + i, blocks.begin() + i + n);
    ASSIGN_OR_RETURN(auto outcomes, e.Store(part, part, true));
    for (auto o : outcomes) {
      if (o != tutti::v1::STORE_DURABLE) return absl::InternalError("a block was not stored");
    }
  }
  return absl::OkStatus();
}

struct Retrieved {
  double gbps, layer0_ms, last_ms;
};

// Retrieves `n` stored blocks into random engine blocks `reps` times (the last one checked).
absl::StatusOr<Retrieved> RetrieveMedian(GpuEngine& e, uint32_t n, uint32_t reps) {
  const std::vector<uint32_t> ids = Iota(n);
  const std::vector<uint32_t> to = gpu::testing::RandomBlocks(5, n, e.shape().num_blocks);
  std::vector<double> gbps, first, last;
  for (uint32_t r = 0; r < reps; ++r) {
    const bool check = r + 1 == reps;
    ASSIGN_OR_RETURN(auto hits, e.Lookup(ids));
    if (hits.first != n) return absl::InternalError(absl::StrCat("only ", hits.first, " hits"));
    const uint32_t ticket = e.NextTicket();
    RETURN_IF_ERROR(
        e.EnqueueLayerWaits(ticket, to, ids, check ? std::optional<uint64_t>(1) : std::nullopt));
    gputest::RetrieveResult res = e.Retrieve(hits.second, to, ids, ticket);
    if (!res.rpc.ok()) return absl::InternalError(res.rpc.error_message());
    if (!e.WaitStream(absl::Seconds(60))) return absl::InternalError("stream did not drain");
    if (!res.failed.empty()) return absl::InternalError("blocks failed");
    ASSIGN_OR_RETURN(std::vector<float> ms, e.LayerReadyMs());
    first.push_back(ms.front());
    last.push_back(ms.back());
    gbps.push_back(e.LayerBytes(n) * kLayers / (ms.back() * 1e-3) / 1e9);
    if (check) {
      ASSIGN_OR_RETURN(std::vector<uint64_t> mm, e.Mismatches());
      for (uint64_t m : mm) {
        if (m != 0) return absl::DataLossError("retrieved content differs");
      }
    }
  }
  return Retrieved{Median(gbps), Median(first), Median(last)};
}

absl::StatusOr<std::unique_ptr<GpuEngine>> StoredEngine(TuttidRunner& d, uint32_t n) {
  EngineShape shape;
  shape.layers = kLayers;
  shape.num_blocks = absl::GetFlag(FLAGS_engine_blocks);
  shape.model_id = "llama-3-8b-shaped";
  ASSIGN_OR_RETURN(auto e, GpuEngine::Create(shape, d.socket(), "bench-engine"));
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(e->Fill(Iota(n), Iota(n), 1));
  RETURN_IF_ERROR(StoreAll(*e, Iota(n)));
  std::printf("stored %u blocks (%.2f GiB) in %.1f s\n", n,
              e->LayerBytes(n) * kLayers / 1073741824.0, Seconds(start));
  return e;
}

// utime + stime of process `pid`, seconds; 0 if it cannot be read.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::vector<std::string> f = absl::StrSplit(stat.substr(paren + 2), ' ');
  double utime = 0, stime = 0;  // fields 14 and 15 of stat(5); f[0] is field 3
  if (f.size() < 13 || !absl::SimpleAtod(f[11], &utime) || !absl::SimpleAtod(f[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Layers tuttid's copier placed, and those the copy engines moved alone.
void PrintCopierCounts(TuttidRunner& d, const char* part) {
  grpc::ClientContext ctx;
  tutti::v1::StatsResponse st;
  if (d.admin().Stats(&ctx, tutti::v1::StatsRequest(), &st).ok()) {
    std::printf("%s: copy-engine layers %llu of %llu\n", part,
                static_cast<unsigned long long>(st.gpu_layers_copy_engine()),
                static_cast<unsigned long long>(st.gpu_layers()));
  }
}

std::string Labelled(const std::string& metric) {
  const std::string label = absl::GetFlag(FLAGS_ssd_label);
  return label.empty() ? metric : absl::StrCat(metric, "_", label);
}

absl::Status RunDram(double contiguous_gbps) {
  const uint32_t n = absl::GetFlag(FLAGS_blocks);
  ASSIGN_OR_RETURN(auto d, TuttidRunner::Start(DaemonConfig(5ull << 30)));
  ASSIGN_OR_RETURN(auto e, StoredEngine(*d, n));
  ASSIGN_OR_RETURN(Retrieved r, RetrieveMedian(*e, n, absl::GetFlag(FLAGS_reps)));
  Add({"tuttid_dram_retrieve", r.gbps, "GB/s",
       contiguous_gbps > 0 ? "contiguous_pinned_to_gpu" : "", contiguous_gbps});
  Add({"tuttid_dram_layer0_ready", r.layer0_ms, "ms", "", 0});
  Add({"tuttid_dram_last_layer_ready", r.last_ms, "ms", "", 0});
  PrintCopierCounts(*d, "dram");
  e.reset();
  return d->Stop().status();
}

// Raw O_DIRECT random reads of `obj` bytes (aligned to their size) at `qd` over [0, span) of
// `path` for `seconds`.
absl::StatusOr<double> RawRead(const std::string& path, uint64_t span, uint32_t qd, double seconds,
                               uint64_t obj = kObj) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", strerror(errno)));
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, uint64_t{qd} * obj) != 0) {
    close(fd);
    return absl::ResourceExhaustedError("posix_memalign for the raw reads");
  }
  io_uring ring;
  if (const int rc = io_uring_queue_init(qd, &ring, 0); rc < 0) {
    free(buf);
    close(fd);
    return absl::InternalError(absl::StrCat("io_uring_queue_init: ", strerror(-rc)));
  }
  std::mt19937_64 rng(9);
  const uint64_t objects = span / obj;
  auto issue = [&](uint32_t slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read(sqe, fd, static_cast<uint8_t*>(buf) + uint64_t{slot} * obj, obj,
                       (rng() % objects) * obj);
    io_uring_sqe_set_data64(sqe, slot);
  };
  for (uint32_t i = 0; i < qd; ++i) issue(i);
  const absl::Time start = absl::Now();
  uint64_t done = 0;
  while (Seconds(start) < seconds) {
    io_uring_submit_and_wait(&ring, 1);
    unsigned head, seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++seen;
      done += cqe->res == static_cast<int>(obj);
      issue(static_cast<uint32_t>(cqe->user_data));
    }
    io_uring_cq_advance(&ring, seen);
  }
  const double gbps = done * double(obj) / Seconds(start) / 1e9;
  io_uring_queue_exit(&ring);
  free(buf);
  close(fd);
  return gbps;
}

absl::Status RunSsd() {
  const uint32_t n = absl::GetFlag(FLAGS_ssd_blocks);
  ASSIGN_OR_RETURN(auto d, TuttidRunner::Start(DaemonConfig(0)));
  ASSIGN_OR_RETURN(auto e, StoredEngine(*d, n));
  std::vector<double> tuttid, raw, raw_1m, first, last;
  double cpu_s = 0, moved_gb = 0;
  const std::string pool = d->root() + "/pool/tutti.pool";
  const uint64_t span = e->LayerBytes(n) * kLayers;  // the slots written first
  const uint32_t qd = absl::GetFlag(FLAGS_queue_depth);
  const std::string raw32 = absl::StrCat("raw_odirect_read_32k_qd", qd);
  const std::string raw1m = absl::StrCat("raw_odirect_read_1m_qd", qd);
  for (uint32_t r = 0; r < 3; ++r) {  // alternate, so drift hits both
    const double cpu0 = CpuSeconds(d->pid());
    ASSIGN_OR_RETURN(Retrieved got, RetrieveMedian(*e, n, 1));
    cpu_s += CpuSeconds(d->pid()) - cpu0;
    moved_gb += span / 1e9;
    tuttid.push_back(got.gbps);
    first.push_back(got.layer0_ms);
    last.push_back(got.last_ms);
    ASSIGN_OR_RETURN(double raw_gbps, RawRead(pool, span, qd, got.last_ms * 1e-3));
    raw.push_back(raw_gbps);
    ASSIGN_OR_RETURN(double raw_1m_gbps, RawRead(pool, span, qd, got.last_ms * 1e-3, 1 << 20));
    raw_1m.push_back(raw_1m_gbps);
  }
  PrintCopierCounts(*d, "ssd");
  Add({Labelled(raw32), Median(raw), "GB/s", "", 0});
  Add({Labelled(raw1m), Median(raw_1m), "GB/s", "", 0});
  Add({Labelled("tuttid_ssd_retrieve"), Median(tuttid), "GB/s", Labelled(raw32), Median(raw)});
  Add({Labelled("ssd_read_vs_raw_1mib"), Median(tuttid), "GB/s", Labelled(raw1m), Median(raw_1m)});
  Add({Labelled("tuttid_ssd_cpu_s_per_gb"), moved_gb > 0 ? cpu_s / moved_gb : 0, "s/GB", "", 0});
  Add({Labelled("tuttid_ssd_layer0_ready"), Median(first), "ms", "", 0});
  Add({Labelled("tuttid_ssd_last_layer_ready"), Median(last), "ms", "", 0});
  e.reset();
  return d->Stop().status();
}

// A second engine storing new blocks (64 per call, all layers, no wait for durability) until
// `stop`; counts blocks captured and refused.
struct StoreStream {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> captured{0}, refused{0};
  absl::Status status;
  void Run(GpuEngine* w, uint32_t blocks) {
    const std::vector<uint32_t> ids = Iota(blocks);
    uint32_t next_key = 1u << 20;
    while (!stop.load()) {
      std::vector<uint32_t> keys(64);
      for (uint32_t& k : keys) k = next_key++;
      const std::vector<uint32_t> from(ids.begin(), ids.begin() + 64);
      absl::StatusOr<std::vector<tutti::v1::StoreOutcome>> out = w->Store(from, keys, false);
      if (!out.ok()) {
        status = out.status();
        return;
      }
      uint64_t rejected = 0;
      for (auto o : *out) rejected += o == tutti::v1::STORE_REJECTED_FULL;
      refused += rejected;
      captured += out->size() - rejected;
      // As an engine would: a full backlog is retried later, not at once.
      if (rejected == out->size()) absl::SleepFor(absl::Milliseconds(2));
    }
  }
};

absl::Status RunStores() {
  const uint32_t n = absl::GetFlag(FLAGS_ssd_blocks);
  ASSIGN_OR_RETURN(auto d, TuttidRunner::Start(DaemonConfig(0)));
  ASSIGN_OR_RETURN(auto e, StoredEngine(*d, n));
  EngineShape shape = e->shape();
  shape.model_id = "llama-3-8b-shaped-writer";
  ASSIGN_OR_RETURN(auto w, GpuEngine::Create(shape, d->socket(), "bench-writer"));
  RETURN_IF_ERROR(w->Fill(Iota(64), Iota(64), 2));
  std::vector<double> alone, with;
  uint64_t captured = 0, refused = 0;
  for (uint32_t r = 0; r < 3; ++r) {
    ASSIGN_OR_RETURN(Retrieved a, RetrieveMedian(*e, n, 1));
    alone.push_back(a.gbps);
    StoreStream stream;
    std::thread writer([&] { stream.Run(w.get(), 64); });
    absl::SleepFor(absl::Milliseconds(300));  // a backlog builds up first
    absl::StatusOr<Retrieved> b = RetrieveMedian(*e, n, 1);
    stream.stop = true;
    writer.join();
    RETURN_IF_ERROR(b.status());
    RETURN_IF_ERROR(stream.status);
    with.push_back(b->gbps);
    captured += stream.captured;
    refused += stream.refused;
    // Drained: store staging empty again (every captured block written or failed).
    const absl::Time stopped = absl::Now();
    uint64_t used = 1;
    while (used > 0 && absl::Now() - stopped < absl::Seconds(60)) {
      grpc::ClientContext ctx;
      tutti::v1::StatsResponse st;
      if (!d->admin().Stats(&ctx, tutti::v1::StatsRequest(), &st).ok()) break;
      used = st.store_staging_used_bytes();
      if (used > 0) absl::SleepFor(absl::Milliseconds(20));
    }
    std::printf(
        "stores round %u: alone %.2f GB/s, with stores %.2f GB/s; %llu captured, %llu "
        "refused; staging %s %.2f s after stores stopped\n",
        r, a.gbps, b->gbps, static_cast<unsigned long long>(stream.captured.load()),
        static_cast<unsigned long long>(stream.refused.load()),
        used == 0 ? "empty" : "STILL IN USE", Seconds(stopped));
    Add({Labelled("store_backlog_drain_s"), Seconds(stopped), "s", "", 0});
  }
  PrintCopierCounts(*d, "stores");
  Add({Labelled("retrieve_with_stores_vs_alone"), Median(with), "GB/s",
       Labelled("tuttid_ssd_retrieve_alone"), Median(alone)});
  Add({Labelled("stores_during_retrieve_blocks"), static_cast<double>(captured), "blocks", "", 0});
  Add({Labelled("stores_refused_during_retrieve_blocks"), static_cast<double>(refused), "blocks",
       "", 0});
  w.reset();
  e.reset();
  return d->Stop().status();
}

void Write(const std::string& command) {
  if (absl::GetFlag(FLAGS_out).empty()) return;
  const std::string date = tutti::bench::UtcNow();
  std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::app);
  for (const Record& r : g_records) {
    out << JsonLine("gpu_retrieve", r, absl::GetFlag(FLAGS_machine), date, command) << "\n";
  }
}

absl::Status Run() {
  const std::string parts = absl::GetFlag(FLAGS_parts);
  double contiguous = 0;
  if (parts.find("inproc") != std::string::npos) {
    RETURN_IF_ERROR(RunInProc());
    contiguous = g_records.front().value;
  }
  if (parts.find("dram") != std::string::npos) RETURN_IF_ERROR(RunDram(contiguous));
  if (parts.find("ssd") != std::string::npos) RETURN_IF_ERROR(RunSsd());
  if (parts.find("stores") != std::string::npos) RETURN_IF_ERROR(RunStores());
  return absl::OkStatus();
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) {
  const std::string command = tutti::bench::CommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  absl::Status s = tutti::bench::Run();
  tutti::bench::Write(command);
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_retrieve_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

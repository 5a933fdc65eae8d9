// lookup_latency: the latency of Lookup of a long chain against the real tuttid over its unix
// socket, through the C++ client (client/cpp), as vLLM's scheduler calls it for every waiting
// request on every step (issue 12).
//
// One tuttid (the uring backend on a small pool), one host-mode session of a small layout (one
// layer, MLA, 4 KiB objects). The first --chain blocks are stored (durably) first; then
// --iterations rounds of: Lookup of the stored chain (all hits) + Release of its lease, and Lookup
// of a chain never stored (all misses) + Release (a no-op for a lease of 0 hits), and Lookup of its
// first key alone (the fixed cost of a call) + Release. The baseline,
// measured in the same run over the same socket, is the KeepAlive round trip (gRPC stub).
//
// Writes bench/results/lookup_latency.jsonl lines (bench/jsonl.h): p50/p99/max of the hit
// Lookup, of Lookup + Release, of the miss Lookup, of the one-key Lookup, and of KeepAlive; ratios
// against KeepAlive's p50 (p99 against its p99). Never asserts on time; exits 1 if a Lookup
// answered other than all hits / all misses, or the daemon failed.
//
// Example (from the workspace root, after bazel build -c opt //bench:lookup_latency
// //daemon:tuttid):
//   TUTTID_BIN=bazel-bin/daemon/tuttid bazel-bin/bench/lookup_latency --iterations=2000
//     --machine="..." --out=bench/results/lookup_latency.jsonl
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/jsonl.h"
#include "tests/integration/tuttid_process.h"
#include "tutti/client.h"
#include "tutti/v1/kvcache.grpc.pb.h"

ABSL_FLAG(int, iterations, 2000, "rounds of hit and miss Lookups (each followed by Release)");
ABSL_FLAG(int, chain, 2048, "blocks in the looked-up chain");
ABSL_FLAG(int, warmup, 100, "rounds before measuring");
ABSL_FLAG(std::string, out, "bench/results/lookup_latency.jsonl", "results file (appended)");
ABSL_FLAG(std::string, machine, "", "machine description for the results");

namespace tutti::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// Key i of chain `salt` (no hashing: the daemon only compares keys).
std::vector<client::BlockKey> Chain(uint32_t n, uint8_t salt) {
  std::vector<client::BlockKey> keys(n);
  for (uint32_t i = 0; i < n; ++i) {
    keys[i][0] = salt;
    for (int b = 0; b < 4; ++b) keys[i][1 + b] = static_cast<uint8_t>(i >> (8 * b));
  }
  return keys;
}

client::ModelNamespace SmallNamespace() {
  client::ModelNamespace ns;
  ns.model_id = "lookup-latency";
  ns.layout = {1, 1, 2048, 2, 1, client::KvFormat::kMla};  // 1 token x 2048 x 2 B = 4 KiB
  return ns;
}

// Stores blocks [0, n) of the session's memory as chain keys, durably, 256 per call.
bool StoreChain(client::Client& c, const std::vector<client::BlockKey>& keys) {
  for (size_t at = 0; at < keys.size(); at += 256) {
    const size_t end = std::min(keys.size(), at + 256);
    std::vector<client::BlockKey> part(keys.begin() + at, keys.begin() + end);
    std::vector<uint32_t> blocks;
    for (size_t i = at; i < end; ++i) blocks.push_back(static_cast<uint32_t>(i));
    client::StoreOptions o;
    o.wait_durable = true;
    auto r = c.Store(part, blocks, o);
    if (!r.ok()) return fprintf(stderr, "store: %s\n", r.status().ToString().c_str()), false;
    for (client::StoreOutcome x : *r) {
      if (x != client::StoreOutcome::kDurable && x != client::StoreOutcome::kAlreadyPresent) {
        return fprintf(stderr, "store outcome %d\n", static_cast<int>(x)), false;
      }
    }
  }
  return true;
}

struct Samples {
  std::vector<double> hit, hit_release, miss, one_key, keepalive;
  uint64_t wrong = 0;
};

// One round: a hit Lookup + Release, a miss Lookup + Release, a KeepAlive.
void Round(client::Client& c, tutti::v1::KvCache::Stub& stub, uint64_t session,
           const std::vector<client::BlockKey>& hits, const std::vector<client::BlockKey>& misses,
           Samples* s) {
  const auto t0 = Clock::now();
  auto lease = c.Lookup(hits);
  const auto t1 = Clock::now();
  if (!lease.ok() || lease->hits != hits.size()) {
    if (s->wrong++ == 0) {
      fprintf(stderr, "hit lookup: %s, %u hits\n", lease.status().ToString().c_str(),
              lease.ok() ? lease->hits : 0);
    }
  }
  if (lease.ok() && !c.Release(*lease).ok()) ++s->wrong;
  const auto t2 = Clock::now();
  auto miss = c.Lookup(misses);
  const auto t3 = Clock::now();
  if (!miss.ok() || miss->hits != 0 || !c.Release(*miss).ok()) ++s->wrong;
  // The fixed cost of a Lookup: one key (a hit), with its Release.
  const std::vector<client::BlockKey> first(hits.begin(), hits.begin() + 1);
  const auto t6 = Clock::now();
  auto one = c.Lookup(first);
  const auto t7 = Clock::now();
  if (!one.ok() || one->hits != 1 || !c.Release(*one).ok()) ++s->wrong;
  // The client library keeps the session's token to itself: the baseline is a KeepAlive naming
  // the session without it, answered NOT_FOUND (the same round trip and session check).
  tutti::v1::KeepAliveRequest req;
  req.set_session_id(session);
  tutti::v1::KeepAliveResponse resp;
  grpc::ClientContext ctx;
  const auto t4 = Clock::now();
  if (stub.KeepAlive(&ctx, req, &resp).error_code() != grpc::StatusCode::NOT_FOUND) ++s->wrong;
  const auto t5 = Clock::now();
  s->hit.push_back(Us(t1 - t0));
  s->hit_release.push_back(Us(t2 - t0));
  s->miss.push_back(Us(t3 - t2));
  s->one_key.push_back(Us(t7 - t6));
  s->keepalive.push_back(Us(t5 - t4));
}

std::string DefaultMachine() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, ", ", std::thread::hardware_concurrency(),
                      " cores; bench and tuttid on the same machine");
}

int Main(int argc, char** argv) {
  const std::string command = CommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  const auto n = static_cast<uint32_t>(absl::GetFlag(FLAGS_chain));
  testing::TuttidConfig config;
  config.max_objects = 1;  // slots of one 4 KiB object: the chain fills a quarter of the pool
  config.capacity_bytes = std::max<uint64_t>(64ull << 20, uint64_t{n} * 4096 * 4);
  config.max_blocks_per_call = std::max<uint32_t>(n, 256);
  config.log_level = "warn";
  auto env = testing::TuttidEnv::Create(config);
  if (!env.ok()) return fprintf(stderr, "%s\n", env.status().ToString().c_str()), 2;
  auto daemon = testing::TuttidProcess::Start(**env);
  if (!daemon.ok()) return fprintf(stderr, "%s\n", daemon.status().ToString().c_str()), 2;

  const client::ModelNamespace ns = SmallNamespace();
  const uint64_t object = ns.layout.object_bytes();
  auto shm = client::SharedMemory::Create("lookup-latency", uint64_t{n} * object);
  if (!shm.ok()) return fprintf(stderr, "%s\n", shm.status().ToString().c_str()), 2;
  client::AttachOptions o;
  o.socket_path = (*env)->socket();
  o.engine_id = "lookup-latency";
  o.ns = ns;
  o.num_blocks = n;
  o.objects = {{(*shm)->data(), object}};
  o.host_regions = {client::RegionOf(**shm)};
  auto c = client::Client::Attach(o);
  if (!c.ok()) return fprintf(stderr, "attach: %s\n", c.status().ToString().c_str()), 2;
  const std::vector<client::BlockKey> hits = Chain(n, 1), misses = Chain(n, 2);
  if (!StoreChain(**c, hits)) return 2;
  auto stub = tutti::v1::KvCache::NewStub((*daemon)->channel());
  const uint64_t session = (*c)->info().session_id;

  Samples warm, s;
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i)
    Round(**c, *stub, session, hits, misses, &warm);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  for (int i = 0; i < iterations; ++i) Round(**c, *stub, session, hits, misses, &s);
  c->reset();
  stub.reset();
  auto stop = (*daemon)->Stop();

  std::string machine = absl::GetFlag(FLAGS_machine);
  if (machine.empty()) machine = DefaultMachine();
  const std::string date = UtcNow();
  std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::app);
  auto emit = [&](const Result& r) {
    const std::string line = JsonLine("lookup_latency", r, machine, date, command);
    out << line << "\n";
    printf("%s\n", line.c_str());
  };
  const double ka50 = Quantile(s.keepalive, 0.5), ka99 = Quantile(s.keepalive, 0.99);
  const std::string base = "KeepAlive round trip, same run";
  const std::string detail =
      absl::StrCat(iterations, " iterations (after ", warm.hit.size(), " warm-up) of a ", n,
                   "-key chain, 4 KiB objects, C++ client over the unix "
                   "socket; wrong answers ",
                   s.wrong);
  struct Series {
    const char* name;
    const std::vector<double>* v;
  };
  for (const Series& x :
       {Series{"lookup_hit", &s.hit}, Series{"lookup_hit_release", &s.hit_release},
        Series{"lookup_miss", &s.miss}, Series{"lookup_1key", &s.one_key}}) {
    emit({absl::StrCat(x.name, "_p50_us"), Quantile(*x.v, 0.5), "us", base, ka50, detail});
    emit({absl::StrCat(x.name, "_p99_us"), Quantile(*x.v, 0.99), "us", base, ka99, std::nullopt});
    emit({absl::StrCat(x.name, "_max_us"), Quantile(*x.v, 1.0), "us", "", 0, std::nullopt});
  }
  emit({"keepalive_p50_us", ka50, "us", "", 0, std::nullopt});
  emit({"keepalive_p99_us", ka99, "us", "", 0,
        absl::StrCat("tuttid stop: ",
                     stop.ok() ? absl::StrCat("exit ", *stop) : stop.status().ToString())});
  return s.wrong == 0 && stop.ok() && *stop == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) { return tutti::bench::Main(argc, argv); }

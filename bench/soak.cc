// soak: many host-mode engine sessions of mixed traffic against the real tuttid for minutes, then
// one abusive session beside them, and the others measured with and without it in the same run.
//
// Phases, one after another on one daemon: "baseline" (the sessions alone), "abuse" (the sessions
// plus one abusive session: Lookups without Release until its lease and pin limits answer
// RESOURCE_EXHAUSTED, Stores of layer 0 only of many blocks, which fill its staging share, and many
// concurrent calls past its in-flight limit), "after" (the sessions alone again). Every session
// thread loops: Lookup + Retrieve (verified byte for byte) of a prefix of what it stored, Store of
// the next blocks of its chain, Lookup of keys never stored. tuttid's RSS and open descriptors are
// sampled every --sample_s seconds.
//
// Writes bench/results/soak.jsonl lines (bench/jsonl.h): Lookup p50/p99 and error rate per phase,
// the abuse phase's against the baseline phase (ratio), errors by code, the abuser's limits hit,
// RSS and fd samples. Never asserts on time; exits 1 only if a wrong byte was served or the daemon
// failed.
//
// Example (from the workspace root, after bazel build -c opt //bench:soak //daemon:tuttid):
//   TUTTID_BIN=bazel-bin/daemon/tuttid bazel-bin/bench/soak --sessions=64 --baseline_s=240
//     --abuse_s=240 --after_s=120 --out=bench/results/soak.jsonl
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/jsonl.h"
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
#include "tests/integration/harness.h"

ABSL_FLAG(int, sessions, 64, "well-behaved engine sessions, one thread each");
ABSL_FLAG(int, baseline_s, 240, "seconds of the sessions alone");
ABSL_FLAG(int, abuse_s, 240, "seconds of the sessions with the abusive session beside them");
ABSL_FLAG(int, after_s, 120, "seconds of the sessions alone again");
ABSL_FLAG(int, sample_s, 5, "seconds between RSS / fd samples of tuttid");
ABSL_FLAG(int, abuser_threads, 16, "concurrent callers of the abusive session");
ABSL_FLAG(std::string, out, "bench/results/soak.jsonl", "results file (appended)");
ABSL_FLAG(std::string, machine, "", "machine description for the results");

namespace tutti::bench {
namespace {

using hostengine::EngineClient;
using hostengine::HostEngine;
using testing::EngineSession;

constexpr int kPhases = 3;
const char* const kPhaseNames[kPhases] = {"baseline", "abuse", "after"};
constexpr uint32_t kEngineBlocks = 32;
constexpr uint32_t kStoreBatch = 8;
constexpr uint32_t kMaxLookup = 16;
constexpr uint32_t kAbuserBlocks = 256;  // its engine blocks, and blocks per abusive call

// What one thread saw in one phase.
struct PhaseStats {
  std::vector<double> lookup_us;
  uint64_t calls = 0, blocks_retrieved = 0, wrong_bytes = 0, retrieve_failed_blocks = 0;
  std::map<std::string, uint64_t> errors;          // by status code name, and call
  std::map<std::string, uint64_t> store_outcomes;  // by StoreOutcome name

  void Merge(const PhaseStats& o) {
    lookup_us.insert(lookup_us.end(), o.lookup_us.begin(), o.lookup_us.end());
    calls += o.calls;
    blocks_retrieved += o.blocks_retrieved;
    wrong_bytes += o.wrong_bytes;
    retrieve_failed_blocks += o.retrieve_failed_blocks;
    for (const auto& [k, v] : o.errors) errors[k] += v;
    for (const auto& [k, v] : o.store_outcomes) store_outcomes[k] += v;
  }
  uint64_t error_count() const {
    uint64_t n = 0;
    for (const auto& [k, v] : errors) n += v;
    return n;
  }
};

struct Shared {
  std::atomic<int> phase{0};
  std::atomic<bool> stop{false};
};

void CountError(PhaseStats& st, const char* call, const absl::Status& s) {
  st.errors[absl::StrCat(call, ":", absl::StatusCodeToString(s.code()))]++;
}

// One well-behaved session: its own key chain, stored from the front, looked up by prefix.
class Worker {
 public:
  Worker(EngineSession session, uint64_t seed)
      : s_(std::move(session)), seed_(seed), rng_(seed), chain_(NewChain()) {}

  void Run(Shared& shared) {
    while (!shared.stop.load()) {
      PhaseStats& st = stats_[shared.phase.load()];
      const int op = std::uniform_int_distribution<int>(0, 9)(rng_);
      if (op < 5) {
        LookupRetrieve(st);
      } else if (op < 8) {
        StoreNext(st);
      } else {
        LookupMiss(st);
      }
    }
  }
  const PhaseStats& stats(int phase) const { return stats_[phase]; }

 private:
  absl::StatusOr<tutti::v1::LookupResponse> TimedLookup(PhaseStats& st,
                                                        absl::Span<const Key> keys) {
    const absl::Time t0 = absl::Now();
    auto r = s_.client->Lookup(keys);
    st.lookup_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    ++st.calls;
    if (!r.ok()) CountError(st, "Lookup", r.status());
    return r;
  }

  void LookupRetrieve(PhaseStats& st) {
    if (stored_ == 0) return LookupMiss(st);
    const uint32_t n = std::min<uint64_t>(kMaxLookup, stored_);
    const uint64_t start = std::uniform_int_distribution<uint64_t>(0, stored_ - n)(rng_);
    auto keys = absl::MakeConstSpan(chain_).subspan(start, n);
    auto r = TimedLookup(st, keys);
    if (!r.ok() || r->hits() == 0) return;
    std::vector<uint32_t> blocks(r->hits());
    for (uint32_t i = 0; i < r->hits(); ++i) {
      blocks[i] = i;
      s_.engine->ZeroBlock(i);
    }
    ++st.calls;
    auto got = s_.client->Retrieve(r->lease_id(), keys.subspan(0, r->hits()), blocks);
    if (!got.ok()) return CountError(st, "Retrieve", got.status());
    st.retrieve_failed_blocks += got->failed.size();
    for (uint32_t i = 0; i < r->hits(); ++i) {
      if (std::binary_search(got->failed.begin(), got->failed.end(), i)) continue;
      ++st.blocks_retrieved;
      st.wrong_bytes += s_.engine->VerifyBlock(i, keys[i]);
    }
  }

  // A fresh chain of keys never stored, so the mix of calls stays the same however long it runs.
  std::vector<Key> NewChain() {
    return hostengine::MakeKeyChain(seed_ * 1000003 + epoch_++, 1 << 14);
  }

  void StoreNext(PhaseStats& st) {
    if (stored_ + kStoreBatch > chain_.size()) {
      chain_ = NewChain();
      stored_ = 0;
    }
    auto keys = absl::MakeConstSpan(chain_).subspan(stored_, kStoreBatch);
    std::vector<uint32_t> blocks(kStoreBatch);
    for (uint32_t i = 0; i < kStoreBatch; ++i) {
      blocks[i] = i;
      s_.engine->FillBlock(i, keys[i]);
    }
    ++st.calls;
    auto r = s_.client->Store(keys, blocks, /*wait_durable=*/true);
    if (!r.ok()) return CountError(st, "Store", r.status());
    for (auto o : *r) st.store_outcomes[tutti::v1::StoreOutcome_Name(o)]++;
    stored_ += kStoreBatch;  // rejected blocks stay missing: lookups then stop short of them
  }

  void LookupMiss(PhaseStats& st) {
    auto keys = hostengine::MakeKeyChain(rng_(), 4);
    (void)TimedLookup(st, keys);
  }

  EngineSession s_;
  const uint64_t seed_;
  uint64_t epoch_ = 0;
  std::mt19937_64 rng_;
  std::vector<Key> chain_;
  uint64_t stored_ = 0;
  PhaseStats stats_[kPhases];
};

// The abusive session: one session, many threads, each doing one kind of abuse.
struct AbuseTally {
  std::atomic<uint64_t> calls{0}, ok{0};
  absl::Mutex mu;
  std::map<std::string, uint64_t> by_outcome ABSL_GUARDED_BY(mu);
  void Count(const std::string& what) {
    absl::MutexLock l(&mu);
    by_outcome[what]++;
  }
};

void AbuseLookups(EngineSession& s, const std::vector<Key>& stored, Shared& shared, AbuseTally& t) {
  while (!shared.stop.load()) {
    t.calls++;
    auto r = s.client->Lookup(stored);  // never released: leases pile up to the limits
    if (r.ok()) {
      t.ok++;
      t.Count(absl::StrCat("Lookup(", stored.size(), " keys):OK hits=", r->hits()));
    } else {
      t.Count(absl::StrCat("Lookup(", stored.size(),
                           " keys):", absl::StatusCodeToString(r.status().code()), ": ",
                           r.status().message().substr(0, 60)));
    }
  }
}

void AbusePartialStores(EngineSession& s, uint64_t seed, Shared& shared, AbuseTally& t) {
  uint64_t round = 0;
  std::vector<uint32_t> blocks(kAbuserBlocks);
  for (uint32_t i = 0; i < blocks.size(); ++i) blocks[i] = i;
  while (!shared.stop.load()) {
    auto keys = hostengine::MakeKeyChain(seed + (++round) * 7919, blocks.size());
    t.calls++;
    auto r = s.client->Store(keys, blocks, /*wait_durable=*/false, /*layer_begin=*/0,
                             /*layer_end=*/1);
    if (!r.ok()) {
      t.Count(absl::StrCat("Store:", absl::StatusCodeToString(r.status().code())));
      continue;
    }
    t.ok++;
    std::map<int, uint64_t> n;
    for (auto o : *r) n[o]++;
    for (const auto& [o, c] : n) {
      absl::MutexLock l(&t.mu);
      t.by_outcome[absl::StrCat(
          "Store(layer 0 of 256):",
          tutti::v1::StoreOutcome_Name(static_cast<tutti::v1::StoreOutcome>(o)))] += c;
    }
  }
}

absl::Status RunAbuser(EngineSession& s, Shared& shared, AbuseTally& t, int threads) {
  // Something to look up: blocks of the abuser's own. One thread looks all of them up per call
  // (to the pin limit), the others one (to the lease limit and past the in-flight limit).
  const auto stored = hostengine::MakeKeyChain(0xab05e, kAbuserBlocks);
  hostengine::StoreOptions so;
  so.batch = 64;
  auto tally = hostengine::StoreKeys(*s.client, *s.engine, stored, so);
  if (!tally.status.ok()) return tally.status;
  std::vector<std::thread> th;
  th.emplace_back([&] { AbuseLookups(s, stored, shared, t); });
  const std::vector<Key> one(stored.begin(), stored.begin() + 1);
  th.emplace_back([&] { AbusePartialStores(s, 0x5eed, shared, t); });
  for (int i = 0; i < threads; ++i) {
    th.emplace_back([&] { AbuseLookups(s, one, shared, t); });
  }
  for (auto& x : th) x.join();
  return absl::OkStatus();
}

struct Sample {
  int64_t t_s;
  int phase;
  uint64_t rss_kb, fds, threads;
};

Sample TakeSample(pid_t pid, absl::Time start, int phase) {
  Sample s{static_cast<int64_t>(absl::ToInt64Seconds(absl::Now() - start)), phase, 0, 0, 0};
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kb = std::stoull(line.substr(6));
    if (line.rfind("Threads:", 0) == 0) s.threads = std::stoull(line.substr(8));
  }
  if (DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str()); d != nullptr) {
    while (dirent* e = readdir(d)) s.fds += e->d_name[0] != '.';
    closedir(d);
  }
  return s;
}

std::string MapText(const std::map<std::string, uint64_t>& m) {
  return absl::StrJoin(m, ", ", absl::PairFormatter("="));
}

int Main(int argc, char** argv) {
  const std::string command = CommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  const int sessions = absl::GetFlag(FLAGS_sessions);
  testing::TuttidConfig config;
  config.capacity_bytes = 256ull << 20;  // 64 sessions x 8-block stores fill it: eviction runs
  config.store_staging_bytes = 64ull << 20;
  config.extra_limits =
      absl::StrCat("max_sessions: ", sessions + 8, " max_sessions_per_user: ", sessions + 8,
                   " max_pinned_blocks_per_session: 4096");
  config.log_level = "warn";
  auto env = testing::TuttidEnv::Create(config);
  if (!env.ok()) return fprintf(stderr, "%s\n", env.status().ToString().c_str()), 2;
  auto daemon = testing::TuttidProcess::Start(**env);
  if (!daemon.ok()) return fprintf(stderr, "%s\n", daemon.status().ToString().c_str()), 2;
  const pid_t pid = (*daemon)->pid();

  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < sessions; ++i) {
    hostengine::EngineIdentity id;
    id.engine_id = absl::StrCat("soak-", i);
    auto s = testing::AttachEngine(**daemon, testing::SmallShape(), kEngineBlocks, id);
    if (!s.ok()) return fprintf(stderr, "attach %d: %s\n", i, s.status().ToString().c_str()), 2;
    workers.push_back(std::make_unique<Worker>(std::move(*s), 1000 + i));
  }
  Shared shared;
  const absl::Time start = absl::Now();
  std::vector<Sample> samples{TakeSample(pid, start, 0)};
  std::vector<std::thread> threads;
  for (auto& w : workers) threads.emplace_back([&shared, &w] { w->Run(shared); });

  const int durations[kPhases] = {absl::GetFlag(FLAGS_baseline_s), absl::GetFlag(FLAGS_abuse_s),
                                  absl::GetFlag(FLAGS_after_s)};
  AbuseTally abuse;
  Shared abuse_ctl;
  std::thread abuser;
  absl::Status abuser_status;
  std::unique_ptr<EngineSession> abusive;
  for (int phase = 0; phase < kPhases; ++phase) {
    shared.phase.store(phase);
    if (phase == 1) {
      hostengine::EngineIdentity id;
      id.engine_id = "abuser";
      auto s = testing::AttachEngine(**daemon, testing::SmallShape(), kAbuserBlocks, id);
      if (!s.ok()) return fprintf(stderr, "attach abuser: %s\n", s.status().ToString().c_str()), 2;
      abusive = std::make_unique<EngineSession>(std::move(*s));
      abuser = std::thread([&] {
        abuser_status = RunAbuser(*abusive, abuse_ctl, abuse, absl::GetFlag(FLAGS_abuser_threads));
      });
    }
    const absl::Time end = absl::Now() + absl::Seconds(durations[phase]);
    while (absl::Now() < end) {
      absl::SleepFor(std::min(absl::Seconds(absl::GetFlag(FLAGS_sample_s)), end - absl::Now()));
      samples.push_back(TakeSample(pid, start, phase));
      const Sample& x = samples.back();
      fprintf(stderr, "t=%llds %s rss=%llu kB fds=%llu threads=%llu\n",
              static_cast<long long>(x.t_s), kPhaseNames[phase],
              static_cast<unsigned long long>(x.rss_kb), static_cast<unsigned long long>(x.fds),
              static_cast<unsigned long long>(x.threads));
    }
    if (phase == 1) {
      abuse_ctl.stop.store(true);
      abuser.join();
      abusive.reset();  // detaches: its leases and staging go with it
    }
  }
  shared.stop.store(true);
  for (auto& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  PhaseStats total[kPhases];
  for (int p = 0; p < kPhases; ++p) {
    for (auto& w : workers) total[p].Merge(w->stats(p));
  }
  workers.clear();
  auto stop_code = (*daemon)->Stop();

  const std::string machine = absl::GetFlag(FLAGS_machine);
  const std::string date = UtcNow();
  std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::app);
  auto emit = [&](const Result& r) {
    const std::string line = JsonLine("soak", r, machine, date, command);
    out << line << "\n";
    printf("%s\n", line.c_str());
  };
  const double base_p50 = hostengine::Quantile(total[0].lookup_us, 0.5);
  const double base_p99 = hostengine::Quantile(total[0].lookup_us, 0.99);
  const double base_err =
      static_cast<double>(total[0].error_count()) / std::max<uint64_t>(1, total[0].calls);
  uint64_t wrong = 0;
  for (int p = 0; p < kPhases; ++p) {
    const PhaseStats& st = total[p];
    const std::string ph = kPhaseNames[p];
    const double err = static_cast<double>(st.error_count()) / std::max<uint64_t>(1, st.calls);
    const std::string base = p == 0 ? "" : "baseline phase, same run";
    const std::string detail = absl::StrCat(
        sessions, " sessions, ", durations[p], " s; lookups ", st.lookup_us.size(), ", calls ",
        st.calls, ", blocks retrieved and verified ", st.blocks_retrieved, ", wrong bytes ",
        st.wrong_bytes, ", blocks reported failed ", st.retrieve_failed_blocks, "; errors {",
        MapText(st.errors), "}; store outcomes {", MapText(st.store_outcomes), "}");
    emit({absl::StrCat(ph, "_lookup_p50_us"), hostengine::Quantile(st.lookup_us, 0.5), "us", base,
          base_p50, detail});
    emit({absl::StrCat(ph, "_lookup_p99_us"), hostengine::Quantile(st.lookup_us, 0.99), "us", base,
          base_p99, std::nullopt});
    emit({absl::StrCat(ph, "_error_rate"), err, "errors/call", base_err > 0 ? base : "", base_err,
          std::nullopt});
    wrong += st.wrong_bytes;
  }
  {
    absl::MutexLock l(&abuse.mu);
    emit({"abuser_calls", static_cast<double>(abuse.calls.load()), "calls", "", 0,
          absl::StrCat("ok ", abuse.ok.load(), "; ", abuser_status.ToString(), "; outcomes {",
                       MapText(abuse.by_outcome), "}")});
  }
  uint64_t rss_min = ~0ull, rss_max = 0, fd_min = ~0ull, fd_max = 0;
  std::vector<std::string> trace;
  for (const Sample& s : samples) {
    rss_min = std::min(rss_min, s.rss_kb);
    rss_max = std::max(rss_max, s.rss_kb);
    fd_min = std::min(fd_min, s.fds);
    fd_max = std::max(fd_max, s.fds);
    trace.push_back(absl::StrCat(s.t_s, "s:", kPhaseNames[s.phase], ":", s.rss_kb, "kB/", s.fds,
                                 "fd/", s.threads, "thr"));
  }
  // Flatness: the last sample against the first after all sessions attached.
  const Sample& first = samples[1 < samples.size() ? 1 : 0];
  const Sample& last = samples.back();
  emit({"rss_kb_last", static_cast<double>(last.rss_kb), "kB", "first sample",
        static_cast<double>(first.rss_kb),
        absl::StrCat("min ", rss_min, " max ", rss_max, "; samples ", absl::StrJoin(trace, " "))});
  emit({"fds_last", static_cast<double>(last.fds), "fds", "first sample",
        static_cast<double>(first.fds), absl::StrCat("min ", fd_min, " max ", fd_max)});
  emit({"seconds", seconds, "s", "", 0,
        absl::StrCat("tuttid stop: ", stop_code.ok() ? absl::StrCat("exit ", *stop_code)
                                                     : stop_code.status().ToString())});
  if (wrong != 0) fprintf(stderr, "WRONG BYTES SERVED: %llu\n", (unsigned long long)wrong);
  return wrong == 0 && stop_code.ok() && *stop_code == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tutti::bench

int main(int argc, char** argv) { return tutti::bench::Main(argc, argv); }

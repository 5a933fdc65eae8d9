// Kill -9 at random moments during stores, many times over one pool: after every restart each
// block ever acknowledged DURABLE still hits and verifies, and nothing that does not verify is
// ever served (blocks in flight at a kill may be present or absent; if present they verify).
//
// Each round: start tuttid (now and then it is killed during start-up and recovery instead),
// check everything so far, then two engines store at once: one with wait_durable (its DURABLE
// answers are promises), one without (captured blocks the writer may or may not finish); kill -9
// after a random number of durable batches plus a random 0-15 ms, so the kill lands mid-stream
// however fast or slow the disk is.
//
// Seeded: the seed is printed; rerun with --test_env=TUTTI_TEST_SEED=<seed>.
#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tutti::testing {
namespace {

constexpr int kRounds = 24;
constexpr uint32_t kDurablePerRound = 160;  // the most the durable storer sends in a round
constexpr uint32_t kCapturedPerRound = 64;  // the most the capture-only storer sends
constexpr uint32_t kBatch = 8;
constexpr uint32_t kEngineBlocks = 32;
constexpr int kMaxDelayMs = 300;

struct Ledger {
  std::vector<Key> acked;  // acknowledged DURABLE in some round: must hit and verify
  std::vector<Key> maybe;  // sent but not promised: may be present; if present, must verify
};

// Stores `keys` batch by batch until they run out or an RPC fails (the daemon died), counting
// finished batches in `progress`. Returns one outcome per key (UNSPECIFIED: not answered).
std::vector<tutti::v1::StoreOutcome> StoreUntilKilled(EngineSession& s,
                                                      const std::vector<Key>& keys,
                                                      bool wait_durable,
                                                      std::atomic<int>& progress) {
  std::vector<tutti::v1::StoreOutcome> outcomes(keys.size(), tutti::v1::STORE_OUTCOME_UNSPECIFIED);
  hostengine::StoreOptions so;
  so.batch = kBatch;
  so.wait_durable = wait_durable;
  so.reject_retries = 1000;
  so.retry_backoff = absl::Milliseconds(5);
  for (size_t i = 0; i < keys.size(); i += kBatch) {
    const size_t n = std::min<size_t>(kBatch, keys.size() - i);
    const auto t =
        hostengine::StoreKeys(*s.client, *s.engine, absl::MakeConstSpan(keys).subspan(i, n), so);
    std::copy(t.outcomes.begin(), t.outcomes.end(), outcomes.begin() + i);
    if (!t.status.ok()) break;
    progress.fetch_add(1);
  }
  return outcomes;
}

// Files the keys of one storer: DURABLE ones as acknowledged; every other key that reached the
// daemon (any answer but DURABLE, or in the call the kill interrupted) as maybe.
void Account(const std::vector<Key>& keys, const std::vector<tutti::v1::StoreOutcome>& outcomes,
             Ledger& ledger) {
  size_t first_open = keys.size();
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto o = outcomes[i];
    if (o == tutti::v1::STORE_DURABLE) {
      ledger.acked.push_back(keys[i]);
    } else if (o != tutti::v1::STORE_OUTCOME_UNSPECIFIED) {
      ledger.maybe.push_back(keys[i]);
    } else if (first_open == keys.size()) {
      first_open = i;
    }
  }
  // The interrupted call: up to one batch, plus its rejected-and-retried blocks, which the
  // outcomes above already filed.
  for (size_t i = first_open; i < std::min<size_t>(keys.size(), first_open + kBatch); ++i) {
    ledger.maybe.push_back(keys[i]);
  }
}

// Checks the whole ledger against a freshly started daemon.
void CheckLedger(TuttidProcess& daemon, const Ledger& ledger, int round) {
  auto s = AttachEngine(daemon, SmallShape(), kEngineBlocks);
  ASSERT_TRUE(s.ok()) << s.status();
  hostengine::RetrieveOptions ro;
  ro.batch = 32;
  ro.shuffle_seed = round;
  const auto acked = hostengine::RetrieveKeys(*s->client, *s->engine, ledger.acked, ro);
  ASSERT_TRUE(acked.status.ok()) << acked.status;
  EXPECT_EQ(acked.hits, ledger.acked.size()) << "round " << round << ": acknowledged blocks lost";
  EXPECT_EQ(acked.misses, 0u) << "round " << round;
  EXPECT_EQ(acked.failed, 0u) << "round " << round << ": acknowledged blocks unreadable";
  EXPECT_EQ(acked.mismatched_blocks, 0u) << "round " << round << ": WRONG DATA SERVED";
  const auto maybe = hostengine::RetrieveKeys(*s->client, *s->engine, ledger.maybe, ro);
  ASSERT_TRUE(maybe.status.ok()) << maybe.status;
  EXPECT_EQ(maybe.mismatched_blocks, 0u) << "round " << round << ": WRONG DATA SERVED";
  EXPECT_EQ(maybe.failed, 0u) << "round " << round << ": a torn block was made visible";
  EXPECT_EQ(maybe.hits + maybe.misses, ledger.maybe.size());
  auto stats = AdminStats(daemon);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->verify_errors(), 0u) << "round " << round;
  EXPECT_EQ(stats->evictions(), 0u) << "the pool must hold every block of this test";
}

// One round: two storers run until the daemon is killed, `batches` durable batches plus
// `delay_ms` into the round (so the kill lands mid-stream however fast the disk is).
void StoreAndKill(TuttidProcess& daemon, uint64_t seed, int round, int batches, int delay_ms,
                  Ledger& ledger) {
  auto durable = AttachEngine(daemon, SmallShape(), kEngineBlocks);
  ASSERT_TRUE(durable.ok()) << durable.status();
  hostengine::EngineIdentity other;
  other.engine_id = "capture-only";
  auto captured = AttachEngine(daemon, SmallShape(), kEngineBlocks, other);
  ASSERT_TRUE(captured.ok()) << captured.status();
  const auto durable_keys = hostengine::MakeKeyChain(seed * 1000 + 2 * round, kDurablePerRound);
  const auto captured_keys =
      hostengine::MakeKeyChain(seed * 1000 + 2 * round + 1, kCapturedPerRound);
  std::vector<tutti::v1::StoreOutcome> dt, ct;
  std::atomic<int> durable_progress{0}, captured_progress{0};
  std::atomic<bool> durable_done{false};
  std::thread d([&] {
    dt = StoreUntilKilled(*durable, durable_keys, true, durable_progress);
    durable_done.store(true);
  });
  std::thread c([&] { ct = StoreUntilKilled(*captured, captured_keys, false, captured_progress); });
  while (durable_progress.load() < batches && !durable_done.load()) {
    absl::SleepFor(absl::Microseconds(200));
  }
  absl::SleepFor(absl::Milliseconds(delay_ms));
  const bool finished_first = durable_done.load();
  daemon.Kill();
  d.join();
  c.join();
  const size_t acked_before = ledger.acked.size();
  Account(durable_keys, dt, ledger);
  Account(captured_keys, ct, ledger);
  fprintf(stderr,
          "round %d: killed %d ms after batch %d: %zu acknowledged this round (%zu in all), "
          "%zu maybe in all%s\n",
          round, delay_ms, batches, ledger.acked.size() - acked_before, ledger.acked.size(),
          ledger.maybe.size(), finished_first ? " (the storer had finished)" : "");
}

TEST(CrashTest, KillNineDuringStoresNeverLosesAcknowledgedOrServesWrongBlocks) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  TuttidConfig config;
  config.capacity_bytes = 256ull << 20;  // room for every block of the test: no eviction
  config.object_bytes = 4096;
  config.max_objects = 8;
  config.checkpoint_every = 200;  // checkpoints happen between and during kills too
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();

  Ledger ledger;
  std::uniform_int_distribution<int> delay_ms(0, kMaxDelayMs);
  std::uniform_int_distribution<int> one_in_five(0, 4);
  std::uniform_int_distribution<int> batch_count(0, kDurablePerRound / kBatch - 2);
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0 && one_in_five(rng) == 0) {  // kill during start-up and recovery
      auto early = TuttidProcess::Spawn(**env);
      ASSERT_TRUE(early.ok()) << early.status();
      const int delay = delay_ms(rng) / 4;
      absl::SleepFor(absl::Milliseconds(delay));
      (*early)->Kill();
      fprintf(stderr, "round %d: killed during start-up after %d ms\n", round, delay);
    }
    auto daemon = TuttidProcess::Start(**env);
    ASSERT_TRUE(daemon.ok()) << "round " << round << ": " << daemon.status();
    CheckLedger(**daemon, ledger, round);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "seed " << seed << "; daemon log:\n" << (*daemon)->LogTail();
      return;
    }
    StoreAndKill(**daemon, seed, round, batch_count(rng), delay_ms(rng) / 20, ledger);
  }
  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  CheckLedger(**daemon, ledger, kRounds);
  EXPECT_GT(ledger.acked.size(), 0u) << "no store was ever acknowledged: the test proved nothing";
  auto code = (*daemon)->Stop();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << (*daemon)->LogTail();
  if (::testing::Test::HasFailure()) {
    fprintf(stderr, "seed was %llu\n", static_cast<unsigned long long>(seed));
  }
}

}  // namespace
}  // namespace tutti::testing

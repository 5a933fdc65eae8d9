// Kill -9 at random moments during stores, many times over one pool: after every restart each
// block ever acknowledged DURABLE still hits and verifies, and nothing that does not verify is
// ever served (blocks in flight at the kill may be present or absent; if present they verify).
//
// Seeded: the seed is printed; rerun with --test_env=TUTTI_TEST_SEED=<seed>.
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/hostengine/content.h"
#include "client/hostengine/workload.h"
#include "gtest/gtest.h"
#include "tests/integration/harness.h"

namespace tutti::testing {
namespace {

using hostengine::KeyResult;

constexpr int kRounds = 24;
constexpr uint32_t kBlocksPerRound = 96;  // the most a storer sends before the kill
constexpr uint32_t kBatch = 8;
constexpr uint32_t kEngineBlocks = 32;

struct Ledger {
  std::vector<Key> acked;     // acknowledged DURABLE in some round
  std::vector<Key> inflight;  // sent in the call the kill interrupted
};

// What one storer thread did before the daemon died (or before it ran out of blocks).
struct RoundResult {
  hostengine::StoreTally tally;
  std::vector<Key> keys;
};

// Stores `keys` in batches of kBatch with wait_durable, until an RPC fails.
RoundResult StoreUntilKilled(EngineSession& s, std::vector<Key> keys) {
  RoundResult r;
  r.keys = std::move(keys);
  hostengine::StoreOptions so;
  so.batch = kBatch;
  so.wait_durable = true;
  so.reject_retries = 1000;
  r.tally = hostengine::StoreKeys(*s.client, *s.engine, r.keys, so);
  return r;
}

// Adds the round's acknowledged keys to the ledger and returns the keys that were in flight:
// those of the first batch without an outcome, if the storer stopped at an error.
void Account(const RoundResult& r, Ledger& ledger) {
  ledger.inflight.clear();
  size_t first_open = r.keys.size();
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const auto o = r.tally.outcomes[i];
    if (o == tutti::v1::STORE_DURABLE) ledger.acked.push_back(r.keys[i]);
    if (o == tutti::v1::STORE_OUTCOME_UNSPECIFIED && first_open == r.keys.size()) first_open = i;
    // A rejected or failed block was never promised; it is "in flight" for checking purposes.
    if (o == tutti::v1::STORE_REJECTED_FULL || o == tutti::v1::STORE_FAILED) {
      ledger.inflight.push_back(r.keys[i]);
    }
  }
  for (size_t i = first_open; i < std::min(r.keys.size(), first_open + kBatch); ++i) {
    ledger.inflight.push_back(r.keys[i]);
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
  const auto maybe = hostengine::RetrieveKeys(*s->client, *s->engine, ledger.inflight, ro);
  ASSERT_TRUE(maybe.status.ok()) << maybe.status;
  EXPECT_EQ(maybe.mismatched_blocks, 0u) << "round " << round << ": WRONG DATA SERVED";
  EXPECT_EQ(maybe.failed, 0u) << "round " << round << ": a torn block was made visible";
  EXPECT_EQ(maybe.hits + maybe.misses, ledger.inflight.size());
  auto stats = AdminStats(daemon);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->verify_errors(), 0u) << "round " << round;
}

TEST(CrashTest, KillNineDuringStoresNeverLosesAcknowledgedOrServesWrongBlocks) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  TuttidConfig config;
  config.capacity_bytes = 128ull << 20;  // room for every round's blocks: no eviction
  config.object_bytes = 4096;
  config.max_objects = 8;
  config.checkpoint_every = 200;  // checkpoints happen between kills too
  auto env = TuttidEnv::Create(config);
  ASSERT_TRUE(env.ok()) << env.status();

  Ledger ledger;
  std::uniform_int_distribution<int> delay_ms(0, 400);
  for (int round = 0; round < kRounds; ++round) {
    auto daemon = TuttidProcess::Start(**env);
    ASSERT_TRUE(daemon.ok()) << "round " << round << ": " << daemon.status();
    CheckLedger(**daemon, ledger, round);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "seed " << seed << "; daemon log:\n" << (*daemon)->LogTail();
      return;
    }
    auto s = AttachEngine(**daemon, SmallShape(), kEngineBlocks);
    ASSERT_TRUE(s.ok()) << s.status();
    auto keys = hostengine::MakeKeyChain(seed * 1000 + round, kBlocksPerRound);
    RoundResult result;
    std::thread storer([&] { result = StoreUntilKilled(*s, std::move(keys)); });
    const int delay = delay_ms(rng);
    absl::SleepFor(absl::Milliseconds(delay));
    (*daemon)->Kill();
    storer.join();
    Account(result, ledger);
    fprintf(stderr, "round %d: killed after %d ms; %zu acknowledged so far, %zu in flight\n",
            round, delay, ledger.acked.size(), ledger.inflight.size());
    s->client.reset();  // its Detach fails quickly: the daemon is gone
  }
  auto daemon = TuttidProcess::Start(**env);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  CheckLedger(**daemon, ledger, kRounds);
  EXPECT_GT(ledger.acked.size(), 0u) << "no store was ever acknowledged: the test proved nothing";
  auto code = (*daemon)->Stop();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  if (::testing::Test::HasFailure()) fprintf(stderr, "seed was %llu\n", (unsigned long long)seed);
}

}  // namespace
}  // namespace tutti::testing

// Power cuts with torn writes, in process: a BlockStore over the fault-injecting memory backend
// (daemon/io/memory_backend.h) with a pool of several files, many rounds of
//   open -> verify everything so far -> store (some calls waiting for durability, some not) with
//   injected EIO on pool writes, syncs and reads -> power cut at a random moment -> drop the store
//   -> restart the disk keeping a random subset of the unsynced pages (kTear)
// and after every reopen: each block acknowledged kDurable before a cut hits and verifies byte for
// byte, or was reported failed by a read (an injected EIO), or was evicted for capacity; no byte
// that differs from what was stored is ever handed to a sink.
//
// Eviction accounting as in crash_test.cc: the index evicts its least recently used unpinned
// block, so a key with fewer than half the slots touched (stored or looked up) after it cannot
// have been evicted and must hit unless a read of it failed. The verification after a reopen
// looks keys up oldest first, which restores the LRU order the restart lost.
//
// What it does not cut: the journal and checkpoint live in a real state directory, which the
// memory backend does not cover; they keep every byte written, synced or not.
//
// Rounds: $TUTTI_POWER_CUT_ROUNDS (default 300, the CI run: seconds). Seeded: $TUTTI_TEST_SEED.
// Prints one "power cut summary" line.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/hostengine/content.h"
#include "common/clock.h"
#include "daemon/io/memory_backend.h"
#include "daemon/store/block_store.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kLayers = 4;
constexpr uint32_t kParts = 2;
constexpr uint32_t kObjects = kParts * kLayers;
constexpr uint32_t kFrame = 4096;
constexpr uint32_t kFiles = 3;               // pool files ("directories"): slots span all three
constexpr uint64_t kCapacity = 12ull << 20;  // a few hundred slots: the run evicts
constexpr uint32_t kBatch = 4;
constexpr uint32_t kMaxBatchesPerRound = 24;
constexpr int kDefaultRounds = 300;

int Rounds() {
  const char* env = getenv("TUTTI_POWER_CUT_ROUNDS");
  return env != nullptr && atoi(env) > 0 ? atoi(env) : kDefaultRounds;
}

uint64_t Seed() {
  const char* env = getenv("TUTTI_TEST_SEED");
  const uint64_t seed = env != nullptr ? strtoull(env, nullptr, 0)
                                       : static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  fprintf(stderr, "test seed: %llu (rerun with TUTTI_TEST_SEED=%llu)\n",
          static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

tutti::v1::Namespace TestNamespace() {
  tutti::v1::Namespace ns;
  ns.set_model_id("power-cut");
  ns.set_hash_scheme("test");
  ns.set_tp_size(1);
  auto* l = ns.mutable_layout();
  l->set_num_layers(kLayers);
  l->set_kv_heads(1);
  l->set_head_dim(64);
  l->set_dtype_bytes(2);
  l->set_block_tokens(16);  // 2 KiB objects
  l->set_format(tutti::v1::KV_FORMAT_SEPARATE);
  return ns;
}

struct Tally {
  uint64_t acked = 0, verified = 0, read_failed = 0, evicted = 0, lost = 0, wrong_bytes = 0;
  uint64_t cuts = 0, injected = 0, store_failed = 0;
};

// Every key stored, with its last touch on one clock of touches.
struct Ledger {
  struct Entry {
    bool acked = false;
    uint64_t last_touch = 0;
  };
  absl::flat_hash_map<Key, Entry> keys;
  uint64_t clock = 0;
};

class PowerCutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/power_cut_", getpid());
    fs::remove_all(root_);
    fs::create_directories(root_ + "/state");
    auto layout = pool::PoolLayout::Compute(kCapacity, kFiles, kFrame, kObjects);
    ASSERT_TRUE(layout.ok()) << layout.status();
    options_.layout = *layout;
    options_.state_dir = root_ + "/state";
    options_.store_staging_bytes = 32 * kObjects * kFrame;
    options_.retrieve_staging_bytes = 32 * kObjects * kFrame;
    options_.write_batch_blocks = 4;
    options_.checkpoint_every = 64;  // checkpoints between and across cuts
    auto disk = io::MemoryDisk::Create(std::vector<uint64_t>(kFiles, layout->file_bytes()));
    ASSERT_TRUE(disk.ok()) << disk.status();
    disk_ = *disk;
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(root_);
  }

  void Open() {
    auto store = BlockStore::Open(options_, io::MemoryBackend::CreateOn(disk_), &clock_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(store).value();
    auto ns = store_->RegisterNamespace(TestNamespace());
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
    auto info = store_->GetNamespace(ns_);
    ASSERT_TRUE(info.ok());
    object_len_ = info->object_len;
  }

  // Injects, each with some probability, an EIO on the next writes / syncs / reads of a random
  // pool file.
  void InjectFaults(std::mt19937_64& rng, bool reads) {
    std::uniform_int_distribution<uint32_t> file(0, kFiles - 1), count(1, 3), pct(0, 99);
    if (!reads && pct(rng) < 30) {
      disk_->FailNext(file(rng), io::Op::kWrite, count(rng), EIO);
      ++tally_.injected;
    }
    if (!reads && pct(rng) < 15) {
      disk_->FailNextSync(file(rng), 1, EIO);
      ++tally_.injected;
    }
    if (reads && pct(rng) < 30) {
      disk_->FailNext(file(rng), io::Op::kRead, count(rng), EIO);
      ++tally_.injected;
    }
  }

  // Reads every layer of pinned `key`; counts wrong bytes. Returns false if the read failed.
  bool ReadAndCheck(const Key& key) {
    bool failed = false;
    std::vector<uint8_t> want(object_len_);
    const Key keys[1] = {key};
    absl::Status s = store_->Read(ns_, keys, 0, kLayers, [&](const datapath::LayerObjects& got) {
      const absl::Span<const engine::CopyOp> ops = got.copies;
      const absl::Span<const uint32_t> bad = got.failed_items;
      failed = failed || !bad.empty();
      for (const engine::CopyOp& op : ops) {
        hostengine::FillObject(key, op.object / kParts, op.object % kParts, absl::MakeSpan(want));
        for (uint32_t i = 0; i < object_len_; ++i) tally_.wrong_bytes += op.staging[i] != want[i];
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
    return s.ok() && !failed;
  }

  // Verifies the whole ledger against the reopened store, least recently touched first.
  void Verify(int round, uint64_t protect) {
    std::vector<std::pair<Key, Ledger::Entry>> order(ledger_.keys.begin(), ledger_.keys.end());
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.second.last_touch < b.second.last_touch;
    });
    const uint64_t now = ledger_.clock;
    const uint64_t wrong_before = tally_.wrong_bytes;
    for (const auto& [key, e] : order) {
      const Key keys[1] = {key};
      const uint64_t touch = ledger_.clock++;
      if (store_->LookupAndPin(ns_, keys) == 1) {
        const bool ok = ReadAndCheck(key);
        store_->Unpin(ns_, keys);
        if (ok) {
          ledger_.keys[key].last_touch = touch;
          tally_.verified += e.acked;
          continue;
        }
        tally_.read_failed += e.acked;  // reported failed: it left the index
      } else if (e.acked && now - e.last_touch < protect) {
        ++tally_.lost;
        ADD_FAILURE() << "round " << round << ": acknowledged block lost, touched "
                      << now - e.last_touch << " touches ago (protected below " << protect << ")";
      } else {
        tally_.evicted += e.acked;
      }
      ledger_.keys.erase(key);
    }
    EXPECT_EQ(tally_.wrong_bytes, wrong_before) << "round " << round << ": WRONG BYTES SERVED";
  }

  // Stores fresh keys in batches until `batches` are done or the power is cut; returns the keys
  // and outcomes of every call made.
  void StoreUntilCut(uint64_t first_key, uint32_t batches, std::atomic<uint32_t>& progress,
                     std::vector<std::pair<std::vector<Key>, std::vector<CaptureOutcome>>>& out) {
    auto gather = [&](const std::vector<Key>& keys) {
      return [this, &keys](absl::Span<const engine::CopyOp> ops) {
        for (const engine::CopyOp& op : ops) {
          hostengine::FillObject(keys[op.block], op.object / kParts, op.object % kParts,
                                 absl::MakeSpan(op.staging, object_len_));
        }
        return absl::OkStatus();
      };
    };
    for (uint32_t b = 0; b < batches; ++b) {
      std::vector<Key> keys = hostengine::MakeKeyChain(first_key + b, kBatch);
      auto outcomes = store_->Capture(ns_, keys, 0, kLayers, gather(keys), /*wait=*/b % 3 != 2);
      if (!outcomes.ok()) break;
      out.emplace_back(std::move(keys), std::move(*outcomes));
      progress.fetch_add(1);
    }
  }

  // One round's stores and the cut: the cut lands after a random number of batches plus a
  // random few hundred microseconds, mid-stream.
  void StoreAndCut(std::mt19937_64& rng, int round) {
    InjectFaults(rng, /*reads=*/false);
    const uint32_t batches = std::uniform_int_distribution<uint32_t>(1, kMaxBatchesPerRound)(rng);
    const uint32_t cut_after = std::uniform_int_distribution<uint32_t>(0, batches)(rng);
    const int delay_us = std::uniform_int_distribution<int>(0, 800)(rng);
    std::atomic<uint32_t> progress{0};
    std::atomic<bool> done{false};
    std::vector<std::pair<std::vector<Key>, std::vector<CaptureOutcome>>> calls;
    const uint64_t first_key = (static_cast<uint64_t>(round) << 20) ^ rng();
    std::thread storer([&] {
      StoreUntilCut(first_key, batches, progress, calls);
      done.store(true);
    });
    while (progress.load() < cut_after && !done.load()) absl::SleepFor(absl::Microseconds(50));
    absl::SleepFor(absl::Microseconds(delay_us));
    disk_->PowerCut();
    ++tally_.cuts;
    storer.join();
    for (const auto& [keys, outcomes] : calls) {
      const uint64_t touch = ledger_.clock;
      ledger_.clock += keys.size();
      for (size_t i = 0; i < keys.size(); ++i) {
        Ledger::Entry& e = ledger_.keys[keys[i]];
        e.last_touch = touch + i;
        if (outcomes[i] == CaptureOutcome::kDurable) {
          e.acked = true;
          ++tally_.acked;
        }
        tally_.store_failed += outcomes[i] == CaptureOutcome::kFailed;
      }
    }
    store_.reset();  // its final writes and checkpoint meet a disk that is off
    disk_->Restart(io::MemoryDisk::CrashMode::kTear, rng());
  }

  std::string root_;
  StoreOptions options_;
  std::shared_ptr<io::MemoryDisk> disk_;
  ManualClock clock_;
  std::unique_ptr<BlockStore> store_;
  NamespaceId ns_ = 0;
  uint32_t object_len_ = 0;
  Ledger ledger_;
  Tally tally_;
};

TEST_F(PowerCutTest, TornPoolWritesAndEioNeverLoseAcknowledgedBlocksOrServeWrongBytes) {
  const uint64_t seed = Seed();
  const int rounds = Rounds();
  const absl::Time start = absl::Now();
  std::mt19937_64 rng(seed);
  uint64_t protect = 0;
  for (int round = 0; round <= rounds; ++round) {
    Open();
    if (::testing::Test::HasFatalFailure()) return;
    if (protect == 0) protect = store_->Stats().slots_total / 2;
    InjectFaults(rng, /*reads=*/true);
    Verify(round, protect);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "seed " << seed << ", round " << round;
      return;
    }
    if (round < rounds) StoreAndCut(rng, round);
  }
  store_.reset();
  EXPECT_GT(tally_.acked, 0u) << "nothing was acknowledged: the test proved nothing";
  EXPECT_GT(tally_.verified, 0u);
  EXPECT_GT(tally_.evicted, 0u) << "nothing was evicted: the pool was never full";
  fprintf(stderr,
          "power cut summary: seed %llu, %d rounds, %u pool files, %llu cuts with torn writes, "
          "%llu faults injected, %llu blocks acknowledged durable, %llu acknowledged blocks "
          "verified over all checks, %llu reported failed on read, %llu evicted for capacity, "
          "%llu store outcomes failed, %llu lost, %llu wrong bytes, %.1f s\n",
          static_cast<unsigned long long>(seed), rounds, kFiles,
          static_cast<unsigned long long>(tally_.cuts),
          static_cast<unsigned long long>(tally_.injected),
          static_cast<unsigned long long>(tally_.acked),
          static_cast<unsigned long long>(tally_.verified),
          static_cast<unsigned long long>(tally_.read_failed),
          static_cast<unsigned long long>(tally_.evicted),
          static_cast<unsigned long long>(tally_.store_failed),
          static_cast<unsigned long long>(tally_.lost),
          static_cast<unsigned long long>(tally_.wrong_bytes),
          absl::ToDoubleSeconds(absl::Now() - start));
}

}  // namespace
}  // namespace tutti::store

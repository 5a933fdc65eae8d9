#include "client/hostengine/workload.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace tutti::hostengine {
namespace {

using tutti::v1::StoreOutcome;

void CountOutcome(StoreOutcome outcome, uint64_t block_bytes, StoreTally& tally) {
  switch (outcome) {
    case tutti::v1::STORE_CAPTURED:
      ++tally.captured;
      tally.bytes += block_bytes;
      break;
    case tutti::v1::STORE_DURABLE:
      ++tally.durable;
      tally.bytes += block_bytes;
      break;
    case tutti::v1::STORE_ALREADY_PRESENT:
      ++tally.already_present;
      break;
    case tutti::v1::STORE_REJECTED_FULL:
      ++tally.rejected_full;
      break;
    case tutti::v1::STORE_DECLINED:  // the admission policy's choice, not a failure
      ++tally.declined;
      break;
    case tutti::v1::STORE_IN_DRAM:  // dram_front: in DRAM only, not durable; not a failure
      ++tally.in_dram;
      break;
    default:
      ++tally.failed;
      break;
  }
}

// Stores keys[first, first + count) from `blocks`, retrying rejected ones. Returns false on an
// RPC error (recorded in the tally).
bool StoreBatch(EngineClient& client, absl::Span<const Key> keys, size_t first,
                std::vector<uint32_t> blocks, const StoreOptions& options, StoreTally& tally) {
  std::vector<size_t> pending(blocks.size());
  std::iota(pending.begin(), pending.end(), first);
  for (uint32_t attempt = 0;; ++attempt) {
    std::vector<Key> batch_keys;
    for (size_t k : pending) batch_keys.push_back(keys[k]);
    const absl::Time t0 = absl::Now();
    auto outcomes = client.Store(batch_keys, blocks, options.wait_durable);
    tally.rpc_time += absl::Now() - t0;
    if (!outcomes.ok()) {
      tally.status = outcomes.status();
      return false;
    }
    std::vector<size_t> again;
    std::vector<uint32_t> again_blocks;
    for (size_t i = 0; i < pending.size(); ++i) {
      const StoreOutcome o = (*outcomes)[i];
      tally.outcomes[pending[i]] = o;
      if (o == tutti::v1::STORE_REJECTED_FULL && attempt < options.reject_retries) {
        again.push_back(pending[i]);
        again_blocks.push_back(blocks[i]);
      }
    }
    if (again.empty()) return true;
    pending = std::move(again);
    blocks = std::move(again_blocks);
    absl::SleepFor(options.retry_backoff);
  }
}

// Retrieves the `hits` leading keys of keys[pos..] under `lease` into the next engine blocks of
// `order`, and classifies them. Returns false on an RPC error (recorded in the tally).
bool RetrieveHits(EngineClient& client, HostEngine& engine, absl::Span<const Key> keys, size_t pos,
                  uint32_t hits, uint64_t lease, const std::vector<uint32_t>& order, size_t& cursor,
                  bool verify, RetrieveTally& tally) {
  std::vector<uint32_t> targets(hits);
  for (uint32_t i = 0; i < hits; ++i) {
    targets[i] = order[cursor++ % order.size()];
    engine.ZeroBlock(targets[i]);
  }
  const absl::Time t0 = absl::Now();
  auto result = client.Retrieve(lease, keys.subspan(pos, hits), targets);
  tally.rpc_time += absl::Now() - t0;
  if (!result.ok()) {
    tally.status = result.status();
    (void)client.Release(lease);
    return false;
  }
  const uint32_t layers = engine.shape().layers;
  bool in_order = result->layers.size() == layers;
  for (size_t i = 0; in_order && i < layers; ++i) in_order = result->layers[i] == i;
  if (!in_order) ++tally.progress_errors;
  const uint64_t block_bytes = engine.shape().block_bytes();
  for (uint32_t i = 0; i < hits; ++i) {
    KeyResult& r = tally.results[pos + i];
    if (std::binary_search(result->failed.begin(), result->failed.end(), i)) {
      r = KeyResult::kFailed;
      ++tally.failed;
      continue;
    }
    tally.bytes += block_bytes;
    const uint64_t bad = verify ? engine.VerifyBlock(targets[i], keys[pos + i]) : 0;
    r = bad == 0 ? KeyResult::kHit : KeyResult::kMismatch;
    ++(bad == 0 ? tally.hits : tally.mismatched_blocks);
    tally.mismatched_bytes += bad;
  }
  return true;
}

}  // namespace

StoreTally StoreKeys(EngineClient& client, HostEngine& engine, absl::Span<const Key> keys,
                     const StoreOptions& options) {
  StoreTally tally;
  tally.outcomes.assign(keys.size(), tutti::v1::STORE_OUTCOME_UNSPECIFIED);
  const size_t batch = std::clamp<size_t>(options.batch, 1, engine.num_blocks());
  for (size_t start = 0; start < keys.size(); start += batch) {
    const size_t count = std::min(batch, keys.size() - start);
    std::vector<uint32_t> blocks(count);
    for (size_t j = 0; j < count; ++j) {
      blocks[j] = static_cast<uint32_t>((start + j) % engine.num_blocks());
      engine.FillBlock(blocks[j], keys[start + j]);
    }
    if (!StoreBatch(client, keys, start, std::move(blocks), options, tally)) break;
  }
  const uint64_t block_bytes = engine.shape().block_bytes();
  for (StoreOutcome o : tally.outcomes) {
    if (o != tutti::v1::STORE_OUTCOME_UNSPECIFIED) CountOutcome(o, block_bytes, tally);
  }
  return tally;
}

RetrieveTally RetrieveKeys(EngineClient& client, HostEngine& engine, absl::Span<const Key> keys,
                           const RetrieveOptions& options) {
  RetrieveTally tally;
  tally.results.assign(keys.size(), KeyResult::kNotTried);
  std::vector<uint32_t> order(engine.num_blocks());
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(options.shuffle_seed));
  size_t cursor = 0;
  const size_t batch = std::clamp<size_t>(options.batch, 1, engine.num_blocks());
  size_t pos = 0;
  while (pos < keys.size()) {
    const size_t count = std::min(batch, keys.size() - pos);
    const absl::Time t0 = absl::Now();
    auto lookup = client.Lookup(keys.subspan(pos, count));
    tally.lookup_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    if (!lookup.ok()) {
      tally.status = lookup.status();
      break;
    }
    const uint32_t hits = std::min<uint32_t>(lookup->hits(), count);
    if (hits > 0 && !RetrieveHits(client, engine, keys, pos, hits, lookup->lease_id(), order,
                                  cursor, options.verify, tally)) {
      break;
    }
    if (hits < count) {
      tally.results[pos + hits] = KeyResult::kMiss;
      ++tally.misses;
      pos += hits + 1;
    } else {
      pos += count;
    }
  }
  return tally;
}

double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(q * values.size());
  const size_t idx = rank < 1 ? 0 : std::min(values.size() - 1, static_cast<size_t>(rank) - 1);
  return values[idx];
}

}  // namespace tutti::hostengine

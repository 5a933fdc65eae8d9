// The store and retrieve workloads of `tuttictl bench`, shared with the daemon-level tests:
// batches of deterministic blocks stored through a HostEngine's blocks, then looked up, retrieved
// into other (shuffled, zeroed) engine blocks, and verified byte for byte.
//
// Thread-safety: one workload at a time per HostEngine (they write its blocks).
#ifndef TUTTI_CLIENT_HOSTENGINE_WORKLOAD_H_
#define TUTTI_CLIENT_HOSTENGINE_WORKLOAD_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/hostengine/engine_client.h"
#include "client/hostengine/host_engine.h"
#include "common/types.h"

namespace tutti::hostengine {

struct StoreOptions {
  uint32_t batch = 64;           // blocks per Store call; <= engine blocks and max_blocks_per_call
  bool wait_durable = true;      // the numbers then mean durable
  uint32_t reject_retries = 50;  // retries of blocks rejected for full staging
  absl::Duration retry_backoff = absl::Milliseconds(20);
};

struct StoreTally {
  // Final outcome per key, in key order; STORE_OUTCOME_UNSPECIFIED for keys never stored (the
  // workload stopped at an error).
  std::vector<tutti::v1::StoreOutcome> outcomes;
  uint64_t captured = 0, durable = 0, already_present = 0, rejected_full = 0, failed = 0;
  uint64_t declined = 0;  // STORE_DECLINED: tuttid's admission policy did not write them
  uint64_t in_dram = 0;   // STORE_IN_DRAM: kept in tuttid's DRAM only (dram_front), not durable
  uint64_t bytes = 0;       // block bytes of captured and durable blocks
  absl::Duration rpc_time;  // time spent inside Store calls
  absl::Status status;      // the first RPC error; the workload stops there
};

// Stores `keys` in batches: batch b's blocks are filled into engine blocks
// (b * batch + j) % num_blocks and stored. Blocks rejected for full staging are retried.
StoreTally StoreKeys(EngineClient& client, HostEngine& engine, absl::Span<const Key> keys,
                     const StoreOptions& options);

struct RetrieveOptions {
  uint32_t batch = 64;        // keys per Lookup and Retrieve; <= engine blocks
  bool verify = true;         // compare every byte of every retrieved block
  uint64_t shuffle_seed = 1;  // picks the (shuffled) engine blocks retrieved into
};

enum class KeyResult : uint8_t {
  kNotTried,  // the workload stopped before this key
  kMiss,      // Lookup did not find it
  kFailed,    // found, but the Retrieve stream reported it failed
  kHit,       // retrieved (and verified, with verify)
  kMismatch,  // retrieved, but its bytes differ from the expected content
};

struct RetrieveTally {
  std::vector<KeyResult> results;  // per key, in key order
  uint64_t hits = 0, misses = 0, failed = 0, mismatched_blocks = 0, mismatched_bytes = 0;
  uint64_t progress_errors = 0;   // progress streams whose layers were not 0..L-1 in order
  uint64_t bytes = 0;             // block bytes retrieved (not failed)
  std::vector<double> lookup_us;  // latency of each Lookup call
  absl::Duration rpc_time;        // time spent inside Retrieve calls
  absl::Status status;            // the first RPC error; the workload stops there
};

// Looks up `keys` in batches (after a miss, the lookup goes on with the next key, so every key is
// classified), retrieves the hits into zeroed engine blocks taken from a shuffled order, and
// verifies them.
RetrieveTally RetrieveKeys(EngineClient& client, HostEngine& engine, absl::Span<const Key> keys,
                           const RetrieveOptions& options);

// The q-th quantile (0..1) of `values` (nearest rank); 0 for an empty vector.
double Quantile(std::vector<double> values, double q);

}  // namespace tutti::hostengine

#endif  // TUTTI_CLIENT_HOSTENGINE_WORKLOAD_H_

// The store's figures in the daemon's stats registry (common/stats.h): every tutti_* family the
// block store counts (lookups, traffic, the I/O scheduler, errors, capacity, the write backlog,
// read bandwidth), each with its help and its Admin.Stats field. A figure the store counts is
// added here, and nowhere else: /metrics, Admin.Stats and tuttictl stats read the registry.
#ifndef TUTTI_DAEMON_STORE_STORE_STATS_H_
#define TUTTI_DAEMON_STORE_STORE_STATS_H_

#include <array>
#include <functional>

#include "common/stats.h"
#include "daemon/datapath/bandwidth.h"
#include "daemon/store/block_store.h"

namespace tutti::store {

// The read bandwidth estimate of each tier, by datapath::Tier.
using TierBandwidths = std::array<datapath::TierBandwidth, datapath::kNumTiers>;

// Registers the store's families, read from `stats` and `bandwidth` (called once per
// collection each; thread-safe as the registry needs). The per-namespace families are per-tenant.
void RegisterStoreStats(std::function<StoreStats()> stats,
                        std::function<TierBandwidths()> bandwidth, stats::Registry* registry);
// The same, read from `store` (BlockStore::Stats, read_bandwidth()), which must outlive the
// registry's use.
void RegisterStoreStats(const BlockStore* store, stats::Registry* registry);

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_STORE_STATS_H_

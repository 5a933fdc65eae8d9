// cuda mode's layer copier in the stats registry (common/stats.h): the layers it placed into
// engines' GPU blocks and gathered out of them, and those the copy engines moved alone.
#ifndef TUTTI_DAEMON_SERVER_GPU_LAYER_STATS_H_
#define TUTTI_DAEMON_SERVER_GPU_LAYER_STATS_H_

#include <cstdint>
#include <functional>

#include "common/stats.h"

namespace tutti::server {

// Layers the GPU copier placed and gathers it did, and those the copy engines moved alone.
struct GpuLayerCounts {
  uint64_t layers = 0;
  uint64_t by_copy_engine = 0;
  uint64_t gathers = 0;
  uint64_t gathers_by_copy_engine = 0;
  // Retrieve batches the GPU verifier copied to the GPU as they arrived, the groups it copied
  // them in, and their seconds summed from arrival to copies enqueued and from then to their
  // bounce slots given back (gpu::ArrivalCounters).
  uint64_t arrivals = 0;
  uint64_t arrival_groups = 0;
  double arrival_pickup_seconds = 0;
  double arrival_copy_release_seconds = 0;
};

// tutti_gpu_layers_total and tutti_gpu_gathers_total, by path, and the copies on arrival's
// tutti_gpu_check_arrivals_total, tutti_gpu_check_arrival_groups_total and
// tutti_gpu_check_arrival_seconds_total, read from `counts` at each collection (empty: host
// mode, zeros).
void RegisterGpuLayerStats(std::function<GpuLayerCounts()> counts, stats::Registry* registry);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_GPU_LAYER_STATS_H_

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
};

// tutti_gpu_layers_total and tutti_gpu_gathers_total, by path, read from `counts` at each
// collection (empty: host mode, zeros).
void RegisterGpuLayerStats(std::function<GpuLayerCounts()> counts, stats::Registry* registry);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_GPU_LAYER_STATS_H_

#include "daemon/server/gpu_layer_stats.h"

#include <algorithm>
#include <utility>

namespace tutti::server {

void RegisterGpuLayerStats(std::function<GpuLayerCounts()> counts, stats::Registry* registry) {
  if (!counts) counts = [] { return GpuLayerCounts{}; };
  registry->AddGroup<GpuLayerCounts>(std::move(counts))
      .Add({"tutti_gpu_layers_total", "Layers placed into engines' GPU blocks (retrieves), by "
            "how: copy_engine (the copy engines alone) or kernel (a scatter kernel).",
            stats::Type::kCounter, {"path"}, "gpu_layers"},
           [](const GpuLayerCounts& g, stats::Samples* out) {
             out->Add({"copy_engine"}, g.by_copy_engine, "gpu_layers_copy_engine");
             out->Add({"kernel"}, g.layers - std::min(g.by_copy_engine, g.layers));
           })
      .Add({"tutti_gpu_gathers_total", "Layers gathered from engines' GPU blocks (stores), by "
            "how.", stats::Type::kCounter, {"path"}, "gpu_gathers"},
           [](const GpuLayerCounts& g, stats::Samples* out) {
             out->Add({"copy_engine"}, g.gathers_by_copy_engine, "gpu_gathers_copy_engine");
             out->Add({"kernel"}, g.gathers - std::min(g.gathers_by_copy_engine, g.gathers));
           });
}

}  // namespace tutti::server

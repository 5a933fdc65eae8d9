#include "daemon/server/gpu_layer_stats.h"

#include <algorithm>
#include <utility>

namespace tutti::server {

void RegisterGpuLayerStats(std::function<GpuLayerCounts()> counts, stats::Registry* registry) {
  if (!counts) counts = [] { return GpuLayerCounts{}; };
  registry->AddGroup<GpuLayerCounts>(std::move(counts))
      .Add({"tutti_gpu_layers_total",
            "Layers placed into engines' GPU blocks (retrieves), by "
            "how: copy_engine (the copy engines alone) or kernel (a scatter kernel).",
            stats::Type::kCounter,
            {"path"},
            "gpu_layers"},
           [](const GpuLayerCounts& g, stats::Samples* out) {
             out->Add({"copy_engine"}, g.by_copy_engine, "gpu_layers_copy_engine");
             out->Add({"kernel"}, g.layers - std::min(g.by_copy_engine, g.layers));
           })
      .Add({"tutti_gpu_gathers_total",
            "Layers gathered from engines' GPU blocks (stores), by "
            "how.",
            stats::Type::kCounter,
            {"path"},
            "gpu_gathers"},
           [](const GpuLayerCounts& g, stats::Samples* out) {
             out->Add({"copy_engine"}, g.gathers_by_copy_engine, "gpu_gathers_copy_engine");
             out->Add({"kernel"}, g.gathers - std::min(g.gathers_by_copy_engine, g.gathers));
           })
      .Counter(
          "tutti_gpu_check_arrivals_total",
          "Retrieve batches copied to the GPU as they arrived (before their checks).",
          [](const GpuLayerCounts& g) { return static_cast<double>(g.arrivals); },
          "gpu_check_arrivals")
      .Counter(
          "tutti_gpu_check_arrival_groups_total",
          "Groups those batches were copied in, each given back after its last copy.",
          [](const GpuLayerCounts& g) { return static_cast<double>(g.arrival_groups); },
          "gpu_check_arrival_groups")
      .Add({"tutti_gpu_check_arrival_seconds_total",
            "Those batches' time summed: from arrival "
            "until the verifier's thread enqueued their copies (pickup), and from then until "
            "their bounce slots went back (copy_release: the copies, then CUDA's host "
            "function).",
            stats::Type::kCounter,
            {"part"}},
           [](const GpuLayerCounts& g, stats::Samples* out) {
             out->Add({"pickup"}, g.arrival_pickup_seconds, "gpu_check_arrival_pickup_seconds");
             out->Add({"copy_release"}, g.arrival_copy_release_seconds,
                      "gpu_check_arrival_copy_release_seconds");
           });
}

}  // namespace tutti::server

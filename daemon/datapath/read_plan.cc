#include "daemon/datapath/read_plan.h"

#include <algorithm>
#include <tuple>

namespace tutti::datapath {
namespace {

// One object to read, before sorting.
struct Wanted {
  pool::Location loc;
  uint32_t item;
  uint32_t part;
};

bool Before(const Wanted& a, const Wanted& b) {
  return std::tie(a.loc.file, a.loc.offset, a.item, a.part) <
         std::tie(b.loc.file, b.loc.offset, b.item, b.part);
}

std::vector<Wanted> WantedObjects(const ObjectLocator& locate, const PlanRequest& r) {
  std::vector<Wanted> wanted;
  for (uint32_t i = 0; i < r.items.size(); ++i) {
    if (!r.items[i].slot.has_value()) continue;
    for (uint32_t p = 0; p < r.parts; ++p) {
      wanted.push_back(Wanted{locate(*r.items[i].slot, r.layer * r.parts + p), i, p});
    }
  }
  std::sort(wanted.begin(), wanted.end(), Before);
  return wanted;
}

// Whether `w` can extend `io` (the last I/O planned) by one frame.
bool Extends(const PlannedIo& io, const Wanted& w, uint32_t read_len, uint32_t max_read_bytes) {
  return w.loc.file == io.file && w.loc.offset == io.offset + io.len &&
         uint64_t{io.len} + read_len <= max_read_bytes;
}

}  // namespace

LayerPlan PlanLayerAt(const ObjectLocator& locate, uint32_t frame_bytes,
                      const PlanRequest& request) {
  LayerPlan plan;
  plan.read_len = RoundUp4K(request.object_len);
  plan.object_of.assign(request.items.size() * request.parts, kNoObject);
  // Merged bytes are the objects only when each object fills its frame exactly.
  const bool mergeable = plan.read_len == frame_bytes;
  for (const Wanted& w : WantedObjects(locate, request)) {
    const uint32_t index = static_cast<uint32_t>(plan.objects.size());
    if (plan.ios.empty() || !mergeable ||
        !Extends(plan.ios.back(), w, plan.read_len, request.max_read_bytes)) {
      plan.ios.push_back(PlannedIo{w.loc.file, w.loc.offset, 0, plan.staging_bytes, index, 0});
    }
    PlannedIo& io = plan.ios.back();
    plan.objects.push_back(PlannedObject{w.item, w.part, static_cast<uint32_t>(plan.ios.size() - 1),
                                         io.staging_offset + io.len});
    plan.object_of[w.item * request.parts + w.part] = index;
    io.len += plan.read_len;
    ++io.num_objects;
    plan.staging_bytes += plan.read_len;
  }
  return plan;
}

LayerPlan PlanLayer(const pool::PoolLayout& layout, const PlanRequest& request) {
  return PlanLayerAt(
      [&layout](uint64_t slot, uint32_t object) { return layout.ObjectLocation(slot, object); },
      layout.object_bytes(), request);
}

}  // namespace tutti::datapath

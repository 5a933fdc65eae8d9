// Step 1 of a Retrieve's data path (prepare): which I/Os read one layer of a set of blocks from
// the pool, and where in that layer's staging each object lands.
//
// PlanLayer is a pure function of the pool's layout: it sorts the layer's objects by (file,
// offset) and merges objects lying in adjacent frames of one file into one I/O of at most
// max_read_bytes, when each object fills its frame (RoundUp4K(object_len) == frame bytes) so the
// merged bytes are exactly those objects. Otherwise every object is one I/O of its rounded length,
// as before merging existed. Whatever the layout makes adjacent is merged; nothing else is
// assumed of it. An object is never split: one larger than max_read_bytes is one I/O of its own.
//
// The layer's staging is one contiguous range, laid out in I/O order: I/O i reads into
// [ios[i].staging_offset, ios[i].staging_offset + ios[i].len), the I/Os back to back from 0, and
// staging_bytes is their sum (the number of objects read x the rounded object length).
//
// Thread-safety: stateless; safe from any thread.
#ifndef TUTTI_DAEMON_DATAPATH_READ_PLAN_H_
#define TUTTI_DAEMON_DATAPATH_READ_PLAN_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "common/align.h"
#include "daemon/pool/layout.h"

namespace tutti::datapath {

inline constexpr uint32_t kNoObject = UINT32_MAX;

// One block of the read: its slot, or nullopt when it is not read from the pool (served from the
// DRAM tier, or already failed).
struct PlanItem {
  std::optional<uint64_t> slot;
};

struct PlanRequest {
  absl::Span<const PlanItem> items;
  uint32_t layer = 0;
  uint32_t parts = 0;       // objects per layer: object (layer * parts + part) of each slot
  uint32_t object_len = 0;  // bytes of an object; read rounded up to 4 KiB
  uint32_t max_read_bytes = 1u << 20;  // a multiple of 4096, >= 4096
};

// One read of the pool.
struct PlannedIo {
  uint32_t file = 0;
  uint64_t offset = 0;          // in the file; 4 KiB aligned
  uint32_t len = 0;             // 4 KiB multiple
  uint64_t staging_offset = 0;  // into the layer's staging
  uint32_t first_object = 0;    // index into LayerPlan::objects
  uint32_t num_objects = 0;     // consecutive in LayerPlan::objects
};

// One object the plan reads.
struct PlannedObject {
  uint32_t item = 0;
  uint32_t part = 0;
  uint32_t io = 0;              // index into LayerPlan::ios
  uint64_t staging_offset = 0;  // into the layer's staging; within its I/O
};

struct LayerPlan {
  std::vector<PlannedIo> ios;          // sorted by (file, offset)
  std::vector<PlannedObject> objects;  // in I/O order
  // Per (item, part), at item * parts + part: index into `objects`, or kNoObject for an item
  // that is not read.
  std::vector<uint32_t> object_of;
  uint64_t staging_bytes = 0;
  uint32_t read_len = 0;  // RoundUp4K(object_len): the bytes of each object an I/O must deliver
};

// Where object `object` of slot `slot` lives: PoolLayout::ObjectLocation, or a test's own.
using ObjectLocator = std::function<pool::Location(uint64_t slot, uint32_t object)>;

// Plans `request` over `layout`. Preconditions: every slot < layout.num_slots(), (layer + 1) *
// parts <= layout.max_objects(), RoundUp4K(object_len) <= layout.object_bytes(),
// max_read_bytes a positive multiple of 4096.
LayerPlan PlanLayer(const pool::PoolLayout& layout, const PlanRequest& request);
// The same over any locator whose frames are `frame_bytes` apart (4 KiB aligned offsets).
LayerPlan PlanLayerAt(const ObjectLocator& locate, uint32_t frame_bytes,
                      const PlanRequest& request);

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_READ_PLAN_H_

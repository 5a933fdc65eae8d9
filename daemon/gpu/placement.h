// The GPU side of engine placements: the alignment the copy kernel needs and the copy descriptors
// that move objects (staging addresses translated by gpu/staging_map.h). Pure arithmetic, kept
// apart from CUDA so CI tests it without a GPU.
//
// Object j of engine block b (j = layer * parts + part) lives at
//   region_base[placements[j].region] + placements[j].offset + b * placements[j].block_stride
// and is object_len bytes long (daemon/engine/placement.h). The three KV formats:
//   fused K and V per layer, [2, blocks, ...]: region l; K at offset 0, V at blocks * object_len;
//   separate K and V per layer: regions 2l and 2l+1, offset 0;
//   one MLA latent per layer: region l, offset 0 (parts = 1);
// and block-major variants ([blocks, 2, ...]: stride 2 * object_len, V at offset object_len).
//
// Thread-safety: the functions are pure.
#ifndef TUTTI_DAEMON_GPU_PLACEMENT_H_
#define TUTTI_DAEMON_GPU_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/engine/engine_memory.h"
#include "daemon/engine/placement.h"
#include "gpu/copy_kernel.h"
#include "gpu/staging_map.h"

namespace tutti::gpu {

struct EngineLayout {
  uint32_t num_blocks = 0;  // valid engine block indices are [0, num_blocks)
  uint32_t object_len = 0;  // bytes per object
  std::vector<engine::ObjectPlacement> placements;  // one per object, layer-major
};

// engine::ValidatePlacements (every object of every block inside its region, no overlap, with
// num_objects = placements.size()), and then the copy kernel's alignment: object_len, every offset
// and every block_stride multiples of kCopyAlign. INVALID_ARGUMENT naming the field otherwise.
absl::Status ValidateLayout(const EngineLayout& layout, const std::vector<uint64_t>& region_sizes);

// Device address of object `object` of engine block `block` (the formula above) given the
// regions' addresses `region_bases`; null when either index is out of range.
uint8_t* EngineObjectAddress(const EngineLayout& layout, absl::Span<uint8_t* const> region_bases,
                             uint32_t block, uint32_t object);

enum class CopyDirection { kToEngine, kFromEngine };

// Fills `out` (cleared first; its capacity is kept across calls) with one descriptor per op:
// staging -> engine object for kToEngine (Scatter; from op.device_copy where it is set), the
// reverse for kFromEngine (Gather). With `groups`, also one group per descriptor for
// Device::CopyByCopyEngine: descriptors share a group only when they lie in the same engine region
// and the same staging region (each one from a device copy has a group of its own).
// `region_bases` are the device addresses of the layout's regions. INVALID_ARGUMENT naming the op
// if a block or object index is out of range or its staging range is outside `staging` or
// unaligned. Preconditions: ValidateLayout(layout, sizes of the regions) succeeded.
absl::Status BuildCopyDescs(absl::Span<const engine::CopyOp> ops, const EngineLayout& layout,
                            absl::Span<uint8_t* const> region_bases, const StagingMap& staging,
                            CopyDirection direction, std::vector<CopyDesc>* out,
                            std::vector<uint32_t>* groups = nullptr);

}  // namespace tutti::gpu

#endif  // TUTTI_DAEMON_GPU_PLACEMENT_H_

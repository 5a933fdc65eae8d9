// The GPU side of engine placements: the alignment the copy kernel needs, staging address
// translation and the copy descriptors that move objects. Pure arithmetic, kept apart from CUDA so
// CI tests it without a GPU.
//
// Object j of engine block b (j = layer * parts + part) lives at
//   region_base[placements[j].region] + placements[j].offset + b * placements[j].block_stride
// and is object_len bytes long (daemon/engine/placement.h). The three KV formats:
//   fused K and V per layer, [2, blocks, ...]: region l; K at offset 0, V at blocks * object_len;
//   separate K and V per layer: regions 2l and 2l+1, offset 0;
//   one MLA latent per layer: region l, offset 0 (parts = 1);
// and block-major variants ([blocks, 2, ...]: stride 2 * object_len, V at offset object_len).
//
// Thread-safety: the functions are pure; a StagingMap is immutable once created.
#ifndef TUTTI_GPU_PLACEMENT_H_
#define TUTTI_GPU_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/engine/engine_memory.h"
#include "daemon/engine/placement.h"
#include "gpu/copy_kernel.h"

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

// Staging memory as kernels see it: `len` bytes at host address `host` are at `device` in the
// device's address space (equal for registered memory on Hopper; different in general).
struct StagingRegion {
  uint8_t* host = nullptr;
  uint64_t len = 0;
  uint8_t* device = nullptr;
};

// Translates staging host addresses (what CopyOp::staging holds) to device addresses.
class StagingMap {
 public:
  // INVALID_ARGUMENT if a region is empty, null, not 16-byte aligned, or overlaps another.
  static absl::StatusOr<StagingMap> Create(absl::Span<const StagingRegion> regions);
  StagingMap() = default;

  // The device address of [host, host + len), or nullptr when that range is not wholly inside
  // one region. O(log regions).
  uint8_t* ToDevice(const uint8_t* host, uint64_t len) const;

 private:
  std::vector<StagingRegion> regions_;  // sorted by host address
};

enum class CopyDirection { kToEngine, kFromEngine };

// Fills `out` (cleared first; its capacity is kept across calls) with one descriptor per op:
// staging -> engine object for kToEngine (Scatter; from op.device_copy where it is set), the
// reverse for kFromEngine (Gather).
// `region_bases` are the device addresses of the layout's regions. INVALID_ARGUMENT naming the op
// if a block or object index is out of range or its staging range is outside `staging` or
// unaligned. Preconditions: ValidateLayout(layout, sizes of the regions) succeeded.
absl::Status BuildCopyDescs(absl::Span<const engine::CopyOp> ops, const EngineLayout& layout,
                            absl::Span<uint8_t* const> region_bases, const StagingMap& staging,
                            CopyDirection direction, std::vector<CopyDesc>* out);

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_PLACEMENT_H_

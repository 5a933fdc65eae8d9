// The GPU-initiated read path's plan (what the read kernel executes) and its construction from the
// plan tuttid makes per layer (daemon/datapath/read_plan.h): each PlannedIo becomes one NVMe read
// of namespace LBAs, and each object it carries one piece copied to its engine block.
//
// Thread-safety: stateless functions; a GpuPlan is a plain value.
#ifndef TUTTI_BENCH_NVME_GPU_GPU_PLAN_H_
#define TUTTI_BENCH_NVME_GPU_GPU_PLAN_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "daemon/datapath/read_plan.h"
#include "bench/nvme_gpu/plan_types.h"

namespace tutti::io::nvme::gpu {

// A plan of several layers: every I/O names its layer (< num_layers) and its pieces.
struct GpuPlan {
  std::vector<GpuReadIo> ios;
  std::vector<GpuPiece> pieces;
  uint32_t num_layers = 0;
};

// Where byte `offset` of pool file `file` lives on the namespace, as an LBA (the pool on the raw
// namespace: daemon/pool/FORMAT.md).
using LbaOf = std::function<uint64_t(uint32_t file, uint64_t offset)>;
// The engine memory byte offset of object (item, part) of the layer being appended.
using DestinationOf = std::function<uint64_t(uint32_t item, uint32_t part)>;

// Appends layer `layer` of `plan` to `out` (num_layers grows to layer + 1 if needed): one read per
// PlannedIo of len >> lba_shift blocks from lba_of(file, offset), its objects as pieces of
// `object_len` bytes from their place in the I/O to dest_of(item, part). INVALID_ARGUMENT (and
// `out` unchanged) when an I/O's offset or length is not a whole number of LBAs, an object falls
// outside its I/O, or object_len or a destination is not a multiple of 16.
absl::Status AppendLayerPlan(const datapath::LayerPlan& plan, uint32_t layer, uint32_t object_len,
                             uint32_t lba_shift, const LbaOf& lba_of, const DestinationOf& dest_of,
                             GpuPlan* out);

}  // namespace tutti::io::nvme::gpu

#endif  // TUTTI_BENCH_NVME_GPU_GPU_PLAN_H_

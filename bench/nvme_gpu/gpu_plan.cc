#include "bench/nvme_gpu/gpu_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tutti::io::nvme::gpu {

absl::Status AppendLayerPlan(const datapath::LayerPlan& plan, uint32_t layer, uint32_t object_len,
                             uint32_t lba_shift, const LbaOf& lba_of, const DestinationOf& dest_of,
                             GpuPlan* out) {
  const uint64_t lba_mask = (uint64_t{1} << lba_shift) - 1;
  if (object_len % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU plan: object_len ", object_len, " is not a multiple of 16"));
  }
  GpuPlan add;
  for (size_t i = 0; i < plan.ios.size(); ++i) {
    const datapath::PlannedIo& io = plan.ios[i];
    if ((io.offset & lba_mask) != 0 || (io.len & lba_mask) != 0 || io.len == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GPU plan: layer ", layer, " I/O ", i, " (file ", io.file, " offset ", io.offset, " len ",
          io.len, ") is not whole LBAs of ", 1u << lba_shift, " bytes"));
    }
    GpuReadIo r;
    r.slba = lba_of(io.file, io.offset);
    r.blocks = io.len >> lba_shift;
    r.layer = layer;
    r.first_piece = static_cast<uint32_t>(out->pieces.size() + add.pieces.size());
    r.num_pieces = io.num_objects;
    for (uint32_t k = 0; k < io.num_objects; ++k) {
      const datapath::PlannedObject& o = plan.objects[io.first_object + k];
      const uint64_t src = o.staging_offset - io.staging_offset;
      const uint64_t dst = dest_of(o.item, o.part);
      if (o.staging_offset < io.staging_offset || src + object_len > io.len || dst % 16 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("GPU plan: layer ", layer, " object (item ", o.item, ", part ", o.part,
                         "): outside its I/O or destination ", dst, " not a multiple of 16"));
      }
      add.pieces.push_back(GpuPiece{static_cast<uint32_t>(src), object_len, dst});
    }
    add.ios.push_back(r);
  }
  out->ios.insert(out->ios.end(), add.ios.begin(), add.ios.end());
  out->pieces.insert(out->pieces.end(), add.pieces.begin(), add.pieces.end());
  out->num_layers = std::max(out->num_layers, layer + 1);
  return absl::OkStatus();
}

}  // namespace tutti::io::nvme::gpu

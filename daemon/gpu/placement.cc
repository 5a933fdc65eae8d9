#include "daemon/gpu/placement.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tutti::gpu {
namespace {

bool Aligned(uint64_t v) { return v % kCopyAlign == 0; }

// BuildCopyDescs' groups: this bit and the descriptor's index, for one that merges with none.
constexpr uint32_t kOwnGroup = 0x80000000u;

}  // namespace

absl::Status ValidateLayout(const EngineLayout& layout, const std::vector<uint64_t>& region_sizes) {
  RETURN_IF_ERROR(engine::ValidatePlacements(region_sizes, layout.placements, layout.num_blocks,
                                             static_cast<uint32_t>(layout.placements.size()),
                                             layout.object_len));
  if (!Aligned(layout.object_len)) {
    return absl::InvalidArgumentError(absl::StrCat("object_len = ", layout.object_len,
                                                   ": must be a multiple of ", kCopyAlign,
                                                   " for the copy kernel"));
  }
  for (size_t j = 0; j < layout.placements.size(); ++j) {
    const engine::ObjectPlacement& p = layout.placements[j];
    if (!Aligned(p.offset) || !Aligned(p.block_stride)) {
      return absl::InvalidArgumentError(absl::StrCat("placements[", j, "]: offset ", p.offset,
                                                     " and block_stride ", p.block_stride,
                                                     " must be multiples of ", kCopyAlign));
    }
  }
  return absl::OkStatus();
}

uint8_t* EngineObjectAddress(const EngineLayout& layout, absl::Span<uint8_t* const> region_bases,
                             uint32_t block, uint32_t object) {
  if (block >= layout.num_blocks || object >= layout.placements.size()) return nullptr;
  const engine::ObjectPlacement& p = layout.placements[object];
  return region_bases[p.region] + p.offset + block * p.block_stride;
}

absl::Status BuildCopyDescs(absl::Span<const engine::CopyOp> ops, const EngineLayout& layout,
                            absl::Span<uint8_t* const> region_bases, const StagingMap& staging,
                            CopyDirection direction, std::vector<CopyDesc>* out,
                            std::vector<uint32_t>* groups) {
  out->clear();
  out->reserve(ops.size());
  if (groups != nullptr) groups->clear();
  const uint32_t len = layout.object_len;
  for (size_t i = 0; i < ops.size(); ++i) {
    const engine::CopyOp& op = ops[i];
    uint8_t* engine = EngineObjectAddress(layout, region_bases, op.block, op.object);
    if (engine == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("op ", i, ": block ", op.block, " object ", op.object, " out of range"));
    }
    if (direction == CopyDirection::kToEngine && op.device_copy != nullptr) {
      // A scatter's checked copy in GPU memory (CopyOp::device_copy) is read in place.
      if (!Aligned(reinterpret_cast<uintptr_t>(op.device_copy))) {
        return absl::InvalidArgumentError(absl::StrCat("op ", i, ": device copy unaligned"));
      }
      out->push_back(CopyDesc{op.device_copy, engine});
      if (groups != nullptr) groups->push_back(kOwnGroup | static_cast<uint32_t>(i));
      continue;
    }
    uint32_t staging_region = 0;
    uint8_t* stage = staging.ToDevice(op.staging, len, &staging_region);
    if (stage == nullptr || !Aligned(reinterpret_cast<uintptr_t>(stage))) {
      return absl::InvalidArgumentError(
          absl::StrCat("op ", i, ": staging address outside registered staging or unaligned"));
    }
    if (direction == CopyDirection::kToEngine) {
      out->push_back(CopyDesc{stage, engine});
    } else {
      out->push_back(CopyDesc{engine, stage});
    }
    if (groups != nullptr) {
      // Engine regions (two a layer at most) and staging regions (a few) stay far below these
      // bounds; past them a descriptor gets a group of its own, which only forgoes merging.
      const uint32_t region = layout.placements[op.object].region;
      groups->push_back(region < 0x8000 && staging_region < 0x10000
                            ? region << 16 | staging_region
                            : kOwnGroup | static_cast<uint32_t>(i));
    }
  }
  return absl::OkStatus();
}

}  // namespace tutti::gpu

#include "daemon/engine/placement.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tutti::engine {
namespace {

// The end (exclusive) of the last block's object of `p`, or false on overflow.
bool PlacementEnd(const ObjectPlacement& p, uint32_t num_blocks, uint32_t object_len,
                  uint64_t* end) {
  uint64_t last_block_offset = 0;
  if (__builtin_mul_overflow(uint64_t{num_blocks - 1}, p.block_stride, &last_block_offset)) {
    return false;
  }
  uint64_t v = 0;
  if (__builtin_add_overflow(p.offset, last_block_offset, &v)) return false;
  return !__builtin_add_overflow(v, uint64_t{object_len}, end);
}

absl::Status CheckOne(size_t i, const ObjectPlacement& p, const std::vector<uint64_t>& sizes,
                      uint32_t num_blocks, uint32_t object_len) {
  if (p.region >= sizes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("placements[", i, "].region = ", p.region,
                                                   ": only ", sizes.size(), " regions"));
  }
  if (num_blocks > 1 && p.block_stride < object_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("placements[", i, "].block_stride = ", p.block_stride,
                     ": must be at least the object size ", object_len, " (blocks would overlap)"));
  }
  uint64_t end = 0;
  if (!PlacementEnd(p, num_blocks, object_len, &end) || end > sizes[p.region]) {
    return absl::InvalidArgumentError(
        absl::StrCat("placements[", i, "]: offset ", p.offset, " + (num_blocks ", num_blocks,
                     " - 1) x block_stride ", p.block_stride, " + object size ", object_len,
                     " runs past the end of region ", p.region, " (", sizes[p.region], " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlacements(const std::vector<uint64_t>& region_sizes,
                                const std::vector<ObjectPlacement>& placements, uint32_t num_blocks,
                                uint32_t num_objects, uint32_t object_len) {
  if (num_blocks == 0) return absl::InvalidArgumentError("num_blocks must be at least 1");
  if (num_objects == 0 || object_len == 0) {
    return absl::InvalidArgumentError("the layout has no objects (or objects of 0 bytes)");
  }
  if (placements.size() != num_objects) {
    return absl::InvalidArgumentError(
        absl::StrCat("placements: ", placements.size(), " given, the layout has ", num_objects,
                     " objects per block (layers x parts, layer-major)"));
  }
  for (size_t i = 0; i < placements.size(); ++i) {
    RETURN_IF_ERROR(CheckOne(i, placements[i], region_sizes, num_blocks, object_len));
  }
  return absl::OkStatus();
}

}  // namespace tutti::engine

#include "client/hostengine/kv_shape.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tutti::hostengine {

absl::Status KvShape::Validate() const {
  const struct {
    const char* name;
    uint32_t value;
  } fields[] = {{"layers", layers},
                {"kv_heads", kv_heads},
                {"head_dim", head_dim},
                {"dtype_bytes", dtype_bytes},
                {"block_tokens", block_tokens}};
  for (const auto& f : fields) {
    if (f.value == 0) return absl::InvalidArgumentError(absl::StrCat(f.name, " must be > 0"));
  }
  if (format != tutti::v1::KV_FORMAT_FUSED && format != tutti::v1::KV_FORMAT_SEPARATE &&
      format != tutti::v1::KV_FORMAT_MLA) {
    return absl::InvalidArgumentError("format must be FUSED, SEPARATE or MLA");
  }
  if (object_len() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("object size %d bytes is too large", object_len()));
  }
  return absl::OkStatus();
}

tutti::v1::KvLayout KvShape::ToProto() const {
  tutti::v1::KvLayout out;
  out.set_num_layers(layers);
  out.set_kv_heads(kv_heads);
  out.set_head_dim(head_dim);
  out.set_dtype_bytes(dtype_bytes);
  out.set_block_tokens(block_tokens);
  out.set_format(format);
  return out;
}

std::vector<tutti::v1::ObjectPlacement> KvShape::Placements(uint32_t num_blocks) const {
  std::vector<tutti::v1::ObjectPlacement> out;
  out.reserve(num_objects());
  for (uint32_t l = 0; l < layers; ++l) {
    for (uint32_t p = 0; p < parts(); ++p) {
      tutti::v1::ObjectPlacement placement;
      placement.set_region(0);
      placement.set_offset(ObjectOffset(num_blocks, 0, l, p));
      placement.set_block_stride(object_len());
      out.push_back(placement);
    }
  }
  return out;
}

std::string KvShape::Describe() const {
  const char* fmt = format == tutti::v1::KV_FORMAT_MLA        ? "mla"
                    : format == tutti::v1::KV_FORMAT_SEPARATE ? "separate"
                                                              : "fused";
  const uint64_t len = object_len();
  const std::string size =
      len % 1024 == 0 ? absl::StrFormat("%d KiB", len / 1024) : absl::StrFormat("%d-byte", len);
  return absl::StrFormat(
      "%d layers x %d kv heads x %d dim, %d-byte dtype, %s, %d-token blocks, "
      "%s objects",
      layers, kv_heads, head_dim, dtype_bytes, fmt, block_tokens, size);
}

}  // namespace tutti::hostengine

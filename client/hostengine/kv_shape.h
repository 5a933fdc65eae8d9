// The shape of a host-mode engine's paged KV cache and where each object of each block lives in
// it: the vLLM-style layout tuttictl bench and the daemon-level tests present to tuttid.
//
// One shared-memory region holds every layer. For each layer l there is one span of
//   parts x num_blocks x object_len bytes,
// parts being 2 (K and V) for KV_FORMAT_FUSED and KV_FORMAT_SEPARATE, 1 for KV_FORMAT_MLA. Object
// (layer l, part p) of engine block b is at
//   l * layer_bytes + p * num_blocks * object_len + b * object_len,
// which is vLLM's [2, num_blocks, block_tokens, kv_heads, head_dim] tensor per layer.
//
// Thread-safety: a plain value type.
#ifndef TUTTI_CLIENT_HOSTENGINE_KV_SHAPE_H_
#define TUTTI_CLIENT_HOSTENGINE_KV_SHAPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tutti/v1/kvcache.pb.h"

namespace tutti::hostengine {

struct KvShape {
  uint32_t layers = 32;
  uint32_t kv_heads = 8;
  uint32_t head_dim = 128;
  uint32_t dtype_bytes = 2;
  uint32_t block_tokens = 16;
  tutti::v1::KvFormat format = tutti::v1::KV_FORMAT_FUSED;

  // Llama-3-8B with bf16 and 16-token blocks: 32 KiB objects, 2 MiB blocks.
  static KvShape Llama3_8B() { return KvShape{}; }

  // INVALID_ARGUMENT naming the field when a field is zero or the format is unspecified or the
  // object size does not fit 32 bits.
  absl::Status Validate() const;

  uint32_t parts() const { return format == tutti::v1::KV_FORMAT_MLA ? 1 : 2; }
  uint32_t num_objects() const { return layers * parts(); }
  uint64_t object_len() const { return uint64_t{block_tokens} * kv_heads * head_dim * dtype_bytes; }
  uint64_t block_bytes() const { return object_len() * num_objects(); }
  uint64_t layer_bytes(uint32_t num_blocks) const {
    return uint64_t{parts()} * num_blocks * object_len();
  }
  uint64_t region_bytes(uint32_t num_blocks) const { return layer_bytes(num_blocks) * layers; }
  // Byte offset of object (layer, part) of `block` in the region. Preconditions: in range.
  uint64_t ObjectOffset(uint32_t num_blocks, uint32_t block, uint32_t layer, uint32_t part) const {
    return layer * layer_bytes(num_blocks) + (uint64_t{part} * num_blocks + block) * object_len();
  }

  tutti::v1::KvLayout ToProto() const;
  // Placements in the order AttachRequest wants them (layer-major, index layer * parts + part),
  // all in region 0.
  std::vector<tutti::v1::ObjectPlacement> Placements(uint32_t num_blocks) const;
  // "32x8x128 bf16 fused, 16-token blocks, 32 KiB objects" for humans.
  std::string Describe() const;
};

}  // namespace tutti::hostengine

#endif  // TUTTI_CLIENT_HOSTENGINE_KV_SHAPE_H_

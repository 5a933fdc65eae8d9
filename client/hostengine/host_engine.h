// A host-mode "engine": a paged KV cache of `num_blocks` engine blocks in one POSIX shared-memory
// region shaped as KvShape describes, with helpers to fill blocks with the deterministic content
// of content.h, zero them, verify them, and describe them to tuttid in an AttachRequest.
//
// Used by `tuttictl bench` and the daemon-level tests, so both exercise tuttid the same way.
//
// Thread-safety: distinct blocks may be filled, zeroed and verified from different threads.
#ifndef TUTTI_CLIENT_HOSTENGINE_HOST_ENGINE_H_
#define TUTTI_CLIENT_HOSTENGINE_HOST_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "client/hostengine/kv_shape.h"
#include "common/shm_region.h"
#include "common/types.h"
#include "tutti/v1/kvcache.pb.h"

namespace tutti::hostengine {

// Who the engine says it is at Attach; together with the shape this is its namespace.
struct EngineIdentity {
  std::string engine_id = "tuttictl-bench";
  std::string model_id = "bench-llama3-8b";
  std::string hash_scheme = "tutti-bench-v1";
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
};

class HostEngine {
 public:
  // Validates `shape`, creates the shm region (see ShmRegion::Create for errors) of
  // shape.region_bytes(num_blocks). INVALID_ARGUMENT if num_blocks is 0.
  static absl::StatusOr<std::unique_ptr<HostEngine>> Create(const KvShape& shape,
                                                            uint32_t num_blocks,
                                                            std::string_view shm_prefix);

  const KvShape& shape() const { return shape_; }
  uint32_t num_blocks() const { return num_blocks_; }
  ShmRegion& region() { return *region_; }

  // Object (layer, part) of engine block `block`. Preconditions: all in range.
  uint8_t* Object(uint32_t block, uint32_t layer, uint32_t part) const {
    return region_->data() + shape_.ObjectOffset(num_blocks_, block, layer, part);
  }

  // Writes the content of `key` into every object of engine block `block`.
  void FillBlock(uint32_t block, const Key& key);
  // Zeroes every object of engine block `block`.
  void ZeroBlock(uint32_t block);
  // Returns how many bytes of layers [layer_begin, layer_end) of engine block `block` differ from
  // the content of `key`. layer_end = 0 means all layers.
  uint64_t VerifyBlock(uint32_t block, const Key& key, uint32_t layer_begin = 0,
                       uint32_t layer_end = 0) const;

  // An AttachRequest naming this engine's region (as the first descriptor of the handoff:
  // fds()), placements, block count and namespace; the credential is EngineClient::Attach's.
  tutti::v1::AttachRequest MakeAttachRequest(const EngineIdentity& id) const;
  // The descriptors to hand over with MakeAttachRequest's request, in fd_index order.
  std::vector<int> fds() const { return {region_->fd()}; }

 private:
  HostEngine(const KvShape& shape, uint32_t num_blocks, std::unique_ptr<ShmRegion> region)
      : shape_(shape), num_blocks_(num_blocks), region_(std::move(region)) {}

  const KvShape shape_;
  const uint32_t num_blocks_;
  std::unique_ptr<ShmRegion> region_;
};

}  // namespace tutti::hostengine

#endif  // TUTTI_CLIENT_HOSTENGINE_HOST_ENGINE_H_

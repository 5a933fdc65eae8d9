#include "client/hostengine/host_engine.h"

#include <cstring>

#include "client/hostengine/content.h"
#include "common/status_macros.h"

namespace tutti::hostengine {

absl::StatusOr<std::unique_ptr<HostEngine>> HostEngine::Create(const KvShape& shape,
                                                               uint32_t num_blocks,
                                                               std::string_view shm_prefix) {
  RETURN_IF_ERROR(shape.Validate());
  if (num_blocks == 0) return absl::InvalidArgumentError("num_blocks must be > 0");
  ASSIGN_OR_RETURN(auto region, ShmRegion::Create(shm_prefix, shape.region_bytes(num_blocks)));
  return std::unique_ptr<HostEngine>(new HostEngine(shape, num_blocks, std::move(region)));
}

void HostEngine::FillBlock(uint32_t block, const Key& key) {
  const size_t len = shape_.object_len();
  for (uint32_t l = 0; l < shape_.layers; ++l) {
    for (uint32_t p = 0; p < shape_.parts(); ++p) {
      FillObject(key, l, p, absl::MakeSpan(Object(block, l, p), len));
    }
  }
}

void HostEngine::ZeroBlock(uint32_t block) {
  const size_t len = shape_.object_len();
  for (uint32_t l = 0; l < shape_.layers; ++l) {
    for (uint32_t p = 0; p < shape_.parts(); ++p) std::memset(Object(block, l, p), 0, len);
  }
}

uint64_t HostEngine::VerifyBlock(uint32_t block, const Key& key, uint32_t layer_begin,
                                 uint32_t layer_end) const {
  if (layer_end == 0 || layer_end > shape_.layers) layer_end = shape_.layers;
  const size_t len = shape_.object_len();
  uint64_t bad = 0;
  for (uint32_t l = layer_begin; l < layer_end; ++l) {
    for (uint32_t p = 0; p < shape_.parts(); ++p) {
      bad += CountObjectMismatches(key, l, p, absl::MakeConstSpan(Object(block, l, p), len));
    }
  }
  return bad;
}

tutti::v1::AttachRequest HostEngine::MakeAttachRequest(const EngineIdentity& id) const {
  tutti::v1::AttachRequest req;
  req.set_engine_id(id.engine_id);
  tutti::v1::Namespace* ns = req.mutable_namespace_();
  ns->set_model_id(id.model_id);
  *ns->mutable_layout() = shape_.ToProto();
  ns->set_tp_rank(id.tp_rank);
  ns->set_tp_size(id.tp_size);
  ns->set_hash_scheme(id.hash_scheme);
  tutti::v1::HostShmRegion* shm = req.add_regions()->mutable_host_shm();
  shm->set_name(region_->name());
  shm->set_size_bytes(region_->size());
  shm->set_fd_index(0);
  for (const auto& placement : shape_.Placements(num_blocks_)) *req.add_placements() = placement;
  req.set_num_blocks(num_blocks_);
  return req;
}

}  // namespace tutti::hostengine

#include "daemon/store/dram_tier.h"

#include <cstring>
#include <vector>

namespace tutti::store {

DramTier::DramTier(absl::Span<uint8_t> region, uint64_t chunk_bytes)
    : chunk_bytes_(chunk_bytes), region_(region.data()) {
  if (chunk_bytes > 0 && region.size() >= chunk_bytes) {
    chunks_ = std::make_shared<FramePool>(region, static_cast<uint32_t>(chunk_bytes));
    policy_ = MakeEvictionPolicy(static_cast<uint32_t>(chunks_->total_frames()));
    key_of_.resize(chunks_->total_frames());
  }
}

void DramTier::Insert(NamespaceId ns, const Key& key, uint64_t epoch, uint32_t object_len,
                      absl::Span<uint8_t* const> objects) {
  if (uint64_t{object_len} * objects.size() > chunk_bytes_) return;
  uint8_t* chunk = TakeChunk();
  if (chunk == nullptr) return;
  FillChunk(chunk, object_len, objects);
  InsertChunk(ns, key, epoch, object_len, static_cast<uint32_t>(objects.size()), chunk);
}

void DramTier::FillChunk(uint8_t* chunk, uint32_t object_len, absl::Span<uint8_t* const> objects) {
  for (size_t i = 0; i < objects.size(); ++i) {
    std::memcpy(chunk + i * object_len, objects[i], object_len);
  }
}

uint8_t* DramTier::TakeChunk() {
  if (chunks_ == nullptr) return nullptr;
  std::vector<uint8_t*> chunk;
  while (!chunks_->TryTake(1, &chunk)) {
    if (!EvictOne()) return nullptr;  // every chunk is held by a reader
  }
  return chunk[0];
}

void DramTier::GiveBack(uint8_t* chunk) { chunks_->Give({chunk}); }

std::shared_ptr<DramBlock> MakeDramBlock(std::shared_ptr<FramePool> pool, NamespaceId ns,
                                         const Key& key, uint64_t epoch, uint32_t object_len,
                                         uint32_t num_objects, uint8_t* chunk) {
  std::shared_ptr<DramBlock> block(new DramBlock, [pool](DramBlock* b) {
    pool->Give({b->data});
    delete b;
  });
  block->ns = ns;
  block->key = key;
  block->epoch = epoch;
  block->object_len = object_len;
  block->num_objects = num_objects;
  block->data = chunk;
  return block;
}

void DramTier::InsertChunk(NamespaceId ns, const Key& key, uint64_t epoch, uint32_t object_len,
                           uint32_t num_objects, uint8_t* chunk) {
  Erase(ns, key);
  std::shared_ptr<DramBlock> block =
      MakeDramBlock(chunks_, ns, key, epoch, object_len, num_objects, chunk);
  MapKey mk{ns, key};
  const uint32_t id = ChunkId(chunk);
  key_of_[id] = mk;
  policy_->Insert(id);
  map_.emplace(mk, std::move(block));
}

std::shared_ptr<const DramBlock> DramTier::Find(NamespaceId ns, const Key& key, uint64_t epoch) {
  auto it = map_.find(MapKey{ns, key});
  if (it == map_.end() || it->second->epoch != epoch) return nullptr;
  policy_->Touch(ChunkId(it->second->data));
  return it->second;
}

void DramTier::Erase(NamespaceId ns, const Key& key) {
  auto it = map_.find(MapKey{ns, key});
  if (it == map_.end()) return;
  policy_->Erase(ChunkId(it->second->data));
  map_.erase(it);  // the chunk returns when the last reader lets go
}

bool DramTier::EvictOne() {
  const uint32_t id = policy_->Victim([](uint32_t) { return true; });
  if (id == EvictionPolicy::kNone) return false;
  const MapKey mk = key_of_[id];
  Erase(mk.first, mk.second);
  return true;
}

uint64_t DramTier::CountNamespace(NamespaceId ns) const {
  uint64_t n = 0;
  for (const auto& [k, block] : map_) n += (k.first == ns);
  return n;
}

}  // namespace tutti::store

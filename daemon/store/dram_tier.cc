#include "daemon/store/dram_tier.h"

#include <cstring>
#include <vector>

namespace tutti::store {

DramTier::DramTier(absl::Span<uint8_t> region, uint64_t chunk_bytes) : chunk_bytes_(chunk_bytes) {
  if (chunk_bytes > 0 && region.size() >= chunk_bytes) {
    chunks_ = std::make_shared<FramePool>(region, static_cast<uint32_t>(chunk_bytes));
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
    if (lru_.empty()) return nullptr;  // every chunk is held by a reader
    EvictOne();
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
  auto lru_it = lru_.insert(lru_.end(), mk);
  map_.emplace(mk, Node{std::move(block), lru_it});
}

std::shared_ptr<const DramBlock> DramTier::Find(NamespaceId ns, const Key& key, uint64_t epoch) {
  auto it = map_.find(MapKey{ns, key});
  if (it == map_.end() || it->second.block->epoch != epoch) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return it->second.block;
}

void DramTier::Erase(NamespaceId ns, const Key& key) {
  auto it = map_.find(MapKey{ns, key});
  if (it == map_.end()) return;
  lru_.erase(it->second.lru);
  map_.erase(it);  // the chunk returns when the last reader lets go
}

void DramTier::EvictOne() {
  const MapKey mk = lru_.front();
  Erase(mk.first, mk.second);
}

uint64_t DramTier::CountNamespace(NamespaceId ns) const {
  uint64_t n = 0;
  for (const auto& [k, node] : map_) n += (k.first == ns);
  return n;
}

}  // namespace tutti::store

#include "daemon/store/dram_front.h"

#include <vector>

namespace tutti::store {

DramFront::DramFront(absl::Span<uint8_t> region, uint64_t chunk_bytes, uint64_t max_blocks)
    : chunk_bytes_(chunk_bytes), max_blocks_(max_blocks) {
  if (chunk_bytes > 0 && max_blocks > 0 && region.size() >= chunk_bytes) {
    chunks_ = std::make_shared<FramePool>(region, static_cast<uint32_t>(chunk_bytes));
  }
}

uint8_t* DramFront::TakeChunk(uint64_t* dropped) {
  if (chunks_ == nullptr) return nullptr;
  std::vector<uint8_t*> chunk;
  while (!chunks_->TryTake(1, &chunk)) {
    if (!EvictOne()) return nullptr;
    ++*dropped;
  }
  return chunk[0];
}

void DramFront::GiveBack(uint8_t* chunk) { chunks_->Give({chunk}); }

void DramFront::Insert(NamespaceId ns, const Key& key, uint32_t object_len, uint32_t num_objects,
                       uint8_t* chunk, uint64_t* dropped) {
  while (lru_.size() >= max_blocks_ && EvictOne()) ++*dropped;
  std::shared_ptr<DramBlock> block =
      MakeDramBlock(chunks_, ns, key, /*epoch=*/0, object_len, num_objects, chunk);
  const MapKey mk{ns, key};
  auto lru_it = lru_.insert(lru_.end(), mk);
  map_.emplace(mk, Node{Entry{std::move(block), 0, false}, lru_it});
}

DramFront::Entry* DramFront::Find(NamespaceId ns, const Key& key) {
  auto it = map_.find(MapKey{ns, key});
  return it == map_.end() ? nullptr : &it->second.entry;
}

std::shared_ptr<const DramBlock> DramFront::BeginPromotion(NamespaceId ns, const Key& key) {
  Node& n = map_.at(MapKey{ns, key});
  lru_.erase(n.lru);
  n.lru = lru_.end();
  n.entry.promoting = true;
  return n.entry.data;
}

uint32_t DramFront::EndPromotion(NamespaceId ns, const Key& key) {
  auto it = map_.find(MapKey{ns, key});
  if (it == map_.end()) return 0;
  const uint32_t pins = it->second.entry.pins;
  if (!it->second.entry.promoting) lru_.erase(it->second.lru);
  map_.erase(it);  // the chunk returns when the last reader (and the writer) let go
  return pins;
}

bool DramFront::EvictOne() {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    auto node = map_.find(*it);
    if (node->second.entry.pins > 0) continue;
    lru_.erase(it);
    map_.erase(node);
    return true;
  }
  return false;
}

uint64_t DramFront::EraseNamespace(NamespaceId ns) {
  uint64_t n = 0;
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto node = map_.find(*it);
    if ((ns != 0 && it->first != ns) || node->second.entry.pins > 0) {
      ++it;
      continue;
    }
    map_.erase(node);
    it = lru_.erase(it);
    ++n;
  }
  return n;
}

uint64_t DramFront::CountNamespace(NamespaceId ns) const {
  uint64_t n = 0;
  for (const auto& [k, node] : map_) n += (k.first == ns);
  return n;
}

}  // namespace tutti::store

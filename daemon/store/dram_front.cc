#include "daemon/store/dram_front.h"

#include <vector>

namespace tutti::store {

DramFront::DramFront(absl::Span<uint8_t> region, uint64_t chunk_bytes, uint64_t max_blocks)
    : chunk_bytes_(chunk_bytes), max_blocks_(max_blocks), base_(region.data()) {
  if (chunk_bytes > 0 && max_blocks > 0 && region.size() >= chunk_bytes) {
    chunks_ = std::make_shared<FramePool>(region, static_cast<uint32_t>(chunk_bytes));
    const uint32_t n = static_cast<uint32_t>(region.size() / chunk_bytes);
    order_ = MakeEvictionPolicy(n);
    key_of_chunk_.resize(n);
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
  while (kept_ >= max_blocks_ && EvictOne()) ++*dropped;
  std::shared_ptr<DramBlock> block =
      MakeDramBlock(chunks_, ns, key, /*epoch=*/0, object_len, num_objects, chunk);
  const MapKey mk{ns, key};
  const auto id = static_cast<uint32_t>(static_cast<uint64_t>(chunk - base_) / chunk_bytes_);
  key_of_chunk_[id] = mk;
  order_->Insert(id);
  ++kept_;
  map_.emplace(mk, Node{Entry{std::move(block), 0, false}, id});
}

DramFront::Entry* DramFront::Find(NamespaceId ns, const Key& key) {
  auto it = map_.find(MapKey{ns, key});
  return it == map_.end() ? nullptr : &it->second.entry;
}

void DramFront::Unorder(const Node& n) {
  order_->Erase(n.chunk);
  --kept_;
}

std::shared_ptr<const DramBlock> DramFront::BeginPromotion(NamespaceId ns, const Key& key) {
  Node& n = map_.at(MapKey{ns, key});
  Unorder(n);
  n.entry.promoting = true;
  return n.entry.data;
}

uint32_t DramFront::EndPromotion(NamespaceId ns, const Key& key) {
  auto it = map_.find(MapKey{ns, key});
  if (it == map_.end()) return 0;
  const uint32_t pins = it->second.entry.pins;
  if (!it->second.entry.promoting) Unorder(it->second);
  map_.erase(it);  // the chunk returns when the last reader (and the writer) let go
  return pins;
}

bool DramFront::EvictOne() {
  if (order_ == nullptr) return false;
  const uint32_t victim = order_->Victim(
      [this](uint32_t id) { return map_.at(key_of_chunk_[id]).entry.pins == 0; });
  if (victim == EvictionPolicy::kNone) return false;
  auto node = map_.find(key_of_chunk_[victim]);
  Unorder(node->second);
  map_.erase(node);
  return true;
}

uint64_t DramFront::EraseNamespace(NamespaceId ns) {
  std::vector<MapKey> gone;
  for (const auto& [k, node] : map_) {
    if ((ns == 0 || k.first == ns) && !node.entry.promoting && node.entry.pins == 0) {
      gone.push_back(k);
    }
  }
  for (const MapKey& k : gone) {
    auto node = map_.find(k);
    Unorder(node->second);
    map_.erase(node);
  }
  return gone.size();
}

uint64_t DramFront::CountNamespace(NamespaceId ns) const {
  uint64_t n = 0;
  for (const auto& [k, node] : map_) n += (k.first == ns);
  return n;
}

}  // namespace tutti::store

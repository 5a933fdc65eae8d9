#include "daemon/store/dram_tier.h"

#include <cstring>

namespace tutti::store {

void DramTier::Insert(NamespaceId ns, const Key &key, uint64_t epoch, uint32_t object_len,
                      absl::Span<uint8_t *const> objects) {
  const uint64_t bytes = uint64_t{object_len} * objects.size();
  if (capacity_ == 0 || bytes > capacity_) return;
  Erase(ns, key);
  while (used_ + bytes > capacity_ && !lru_.empty()) EvictOne();
  auto block = std::make_shared<DramBlock>();
  block->ns = ns;
  block->key = key;
  block->epoch = epoch;
  block->object_len = object_len;
  block->num_objects = static_cast<uint32_t>(objects.size());
  block->data.reset(new uint8_t[bytes]);
  for (size_t i = 0; i < objects.size(); ++i) {
    std::memcpy(block->data.get() + i * object_len, objects[i], object_len);
  }
  MapKey mk{ns, key};
  auto lru_it = lru_.insert(lru_.end(), mk);
  map_.emplace(mk, Node{std::move(block), lru_it});
  used_ += bytes;
}

std::shared_ptr<const DramBlock> DramTier::Find(NamespaceId ns, const Key &key, uint64_t epoch) {
  auto it = map_.find(MapKey{ns, key});
  if (it == map_.end() || it->second.block->epoch != epoch) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return it->second.block;
}

void DramTier::Erase(NamespaceId ns, const Key &key) {
  auto it = map_.find(MapKey{ns, key});
  if (it == map_.end()) return;
  used_ -= it->second.block->bytes();
  lru_.erase(it->second.lru);
  map_.erase(it);
}

void DramTier::EvictOne() {
  const MapKey mk = lru_.front();
  Erase(mk.first, mk.second);
}

uint64_t DramTier::CountNamespace(NamespaceId ns) const {
  uint64_t n = 0;
  for (const auto &[k, node] : map_) n += (k.first == ns);
  return n;
}

}  // namespace tutti::store

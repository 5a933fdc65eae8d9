#include "daemon/store/index.h"

#include <algorithm>

namespace tutti::store {

Index::Index(uint64_t num_slots, uint32_t max_objects)
    : max_objects_(max_objects),
      slot_owner_(num_slots, nullptr),
      slot_taken_(num_slots, 0),
      checksums_(num_slots * max_objects, 0) {
  free_.reserve(num_slots);
  // Hand out low slots first: pops come from the back.
  for (uint64_t s = num_slots; s > 0; --s) free_.push_back(s - 1);
}

Entry* Index::Find(NamespaceId ns, const Key& key) const {
  auto it = map_.find(MapKey{ns, key});
  return it == map_.end() ? nullptr : it->second.get();
}

Entry* Index::Insert(NamespaceId ns, const Key& key, uint64_t slot, uint64_t epoch,
                     uint32_t object_len, absl::Span<const uint64_t> checksums) {
  auto e = std::make_unique<Entry>();
  e->ns = ns;
  e->key = key;
  e->slot = slot;
  e->epoch = epoch;
  e->object_len = object_len;
  e->num_objects = static_cast<uint32_t>(std::min<size_t>(checksums.size(), max_objects_));
  std::copy_n(checksums.begin(), e->num_objects, &checksums_[slot * max_objects_]);
  Entry* raw = e.get();
  raw->lru = lru_.insert(lru_.end(), raw);
  slot_owner_[slot] = raw;
  map_.emplace(MapKey{ns, key}, std::move(e));
  return raw;
}

void Index::Remove(Entry* e) {
  lru_.erase(e->lru);
  if (slot_owner_[e->slot] == e) slot_owner_[e->slot] = nullptr;
  map_.erase(MapKey{e->ns, e->key});  // destroys *e
}

void Index::Touch(Entry* e) { lru_.splice(lru_.end(), lru_, e->lru); }

Entry* Index::Victim() const {
  for (Entry* e : lru_) {
    if (e->pins == 0) return e;
  }
  return nullptr;
}

bool Index::TakeSlot(uint64_t* slot) {
  if (free_.empty()) return false;
  *slot = free_.back();
  free_.pop_back();
  slot_taken_[*slot] = 1;
  return true;
}

void Index::ReleaseSlot(uint64_t slot) {
  if (!slot_taken_[slot]) return;
  slot_taken_[slot] = 0;
  free_.push_back(slot);
}

bool Index::ClaimSlot(uint64_t slot) {
  if (slot_taken_[slot]) return false;
  slot_taken_[slot] = 1;
  return true;
}

void Index::RebuildFreeList() {
  free_.clear();
  for (uint64_t s = slot_taken_.size(); s > 0; --s) {
    if (!slot_taken_[s - 1]) free_.push_back(s - 1);
  }
}

}  // namespace tutti::store

#include "daemon/store/index.h"

#include <algorithm>
#include <iterator>

namespace tutti::store {

Index::Index(uint64_t num_slots, uint32_t max_objects)
    : max_objects_(max_objects),
      slot_owner_(num_slots, nullptr),
      slot_taken_(num_slots, 0),
      checksums_(num_slots * max_objects, 0) {
  if (num_slots > 0) AddRun(0, num_slots);
  free_count_ = num_slots;
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

void Index::AddRun(uint64_t start, uint64_t length) {
  runs_.emplace(start, length);
  by_length_.emplace(length, start);
}

void Index::EraseRun(absl::btree_map<uint64_t, uint64_t>::iterator run) {
  by_length_.erase({run->second, run->first});
  runs_.erase(run);
}

void Index::TakeFromRun(absl::btree_map<uint64_t, uint64_t>::iterator run, uint64_t n,
                        std::vector<uint64_t>* out) {
  const uint64_t start = run->first, length = run->second;
  EraseRun(run);
  if (n < length) AddRun(start + n, length - n);
  for (uint64_t s = start; s < start + n; ++s) {
    slot_taken_[s] = 1;
    out->push_back(s);
  }
  free_count_ -= n;
}

std::vector<uint64_t> Index::TakeSlots(uint64_t n) {
  std::vector<uint64_t> out;
  out.reserve(std::min(n, free_count_));
  while (out.size() < n && !by_length_.empty()) {
    const uint64_t want = n - out.size();
    if (by_length_.begin()->first < want) {  // no run is long enough: the longest, whole
      TakeFromRun(runs_.find(by_length_.begin()->second), by_length_.begin()->first, &out);
      continue;
    }
    auto run = runs_.begin();
    while (run->second < want) ++run;  // ends: some run is long enough
    TakeFromRun(run, want, &out);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool Index::TakeSlot(uint64_t* slot) {
  const std::vector<uint64_t> one = TakeSlots(1);
  if (one.empty()) return false;
  *slot = one[0];
  return true;
}

// Puts taken `slot` back, merging it with the free runs on either side.
void Index::FreeRun(uint64_t slot) {
  uint64_t start = slot, length = 1;
  auto next = runs_.find(slot + 1);
  if (next != runs_.end()) {
    length += next->second;
    EraseRun(next);
  }
  auto after = runs_.lower_bound(slot);
  if (after != runs_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == slot) {
      start = prev->first;
      length += prev->second;
      EraseRun(prev);
    }
  }
  AddRun(start, length);
  ++free_count_;
}

// Takes free `slot` out of the run holding it, splitting the run.
void Index::RemoveFree(uint64_t slot) {
  auto run = std::prev(runs_.upper_bound(slot));  // exists: slot is free
  const uint64_t start = run->first, length = run->second;
  EraseRun(run);
  if (slot > start) AddRun(start, slot - start);
  if (slot + 1 < start + length) AddRun(slot + 1, start + length - slot - 1);
  --free_count_;
}

void Index::ReleaseSlot(uint64_t slot) {
  if (!slot_taken_[slot]) return;
  slot_taken_[slot] = 0;
  FreeRun(slot);
}

bool Index::ClaimSlot(uint64_t slot) {
  if (slot_taken_[slot]) return false;
  slot_taken_[slot] = 1;
  RemoveFree(slot);
  return true;
}

void Index::RebuildFreeList() {
  runs_.clear();
  by_length_.clear();
  free_count_ = 0;
  const uint64_t n = slot_taken_.size();
  for (uint64_t s = 0; s < n;) {
    if (slot_taken_[s]) {
      ++s;
      continue;
    }
    uint64_t end = s;
    while (end < n && !slot_taken_[end]) ++end;
    AddRun(s, end - s);
    free_count_ += end - s;
    s = end;
  }
}

}  // namespace tutti::store

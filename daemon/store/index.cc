#include "daemon/store/index.h"

#include <algorithm>
#include <cassert>
#include <iterator>
#include <utility>

namespace tutti::store {

Index::Index(uint64_t num_slots, uint32_t max_objects)
    : num_slots_(num_slots),
      max_objects_(max_objects),
      entries_(new Entry[num_slots + 1]),
      set_(0, SlotHash{entries_.get()}, SlotEq{entries_.get()}),
      slot_taken_(num_slots, 0),
      checksums_(num_slots * max_objects, 0) {
  for (uint64_t s = 0; s < num_slots; ++s) {
    entries_[s].lru_prev = entries_[s].lru_next = Entry::kUnused;
  }
  Entry& head = entries_[num_slots];
  head.lru_prev = head.lru_next = static_cast<uint32_t>(num_slots);
  set_.reserve(num_slots);  // never rehashed: recovery and filling cost no growth
  if (num_slots > 0) AddRun(0, num_slots);
  free_count_ = num_slots;
}

Entry* Index::Find(NamespaceId ns, const Key& key) const {
  auto it = set_.find(KeyRef{ns, &key});
  return it == set_.end() ? nullptr : &entries_[*it];
}

Entry* Index::Insert(NamespaceId ns, const Key& key, uint64_t slot, uint64_t epoch,
                     uint32_t object_len, absl::Span<const uint64_t> checksums) {
  Entry* e = &entries_[slot];
  assert(e->lru_next == Entry::kUnused && "Insert into a slot that holds an entry");
  e->ns = ns;
  e->key = key;
  e->slot = static_cast<uint32_t>(slot);
  e->epoch = epoch;
  e->last_use = ++use_clock_;
  e->object_len = object_len;
  e->num_objects = static_cast<uint32_t>(std::min<size_t>(checksums.size(), max_objects_));
  e->pins = 0;
  std::copy_n(checksums.begin(), e->num_objects, &checksums_[slot * max_objects_]);
  LinkAtTail(e);
  set_.insert(static_cast<uint32_t>(slot));
  ++ns_entries_[ns];
  return e;
}

void Index::Remove(Entry* e) {
  set_.erase(static_cast<uint32_t>(e->slot));  // hashes *e: before it is cleared
  auto count = ns_entries_.find(e->ns);
  if (--count->second == 0) ns_entries_.erase(count);
  Unlink(e);
  e->lru_prev = e->lru_next = Entry::kUnused;
}

void Index::Unlink(Entry* e) {
  entries_[e->lru_prev].lru_next = e->lru_next;
  entries_[e->lru_next].lru_prev = e->lru_prev;
}

void Index::LinkAtTail(Entry* e) {
  Entry& head = entries_[num_slots_];
  const uint32_t self = static_cast<uint32_t>(e - entries_.get());
  e->lru_prev = head.lru_prev;
  e->lru_next = static_cast<uint32_t>(num_slots_);
  entries_[head.lru_prev].lru_next = self;
  head.lru_prev = self;
}

void Index::Touch(Entry* e) {
  e->last_use = ++use_clock_;
  if (entries_[num_slots_].lru_prev == e->slot) return;  // most recent already
  Unlink(e);
  LinkAtTail(e);
}

void Index::SetLastUse(Entry* e, uint64_t last_use) {
  // The list stays in last_use order while each entry set is the most recent one and not older
  // than the one before it (a checkpoint written in use order, or none).
  const Entry& prev = entries_[e->lru_prev];
  if (entries_[num_slots_].lru_prev != e->slot ||
      (e->lru_prev != num_slots_ && prev.last_use > last_use)) {
    lru_ordered_ = false;
  }
  e->last_use = last_use;
  use_clock_ = std::max(use_clock_, last_use);
}

void Index::OrderByLastUse() {
  if (lru_ordered_) return;  // Insert and Touch keep it so
  lru_ordered_ = true;
  std::vector<std::pair<uint64_t, uint32_t>> order;  // (last_use, slot)
  order.reserve(size());
  ForEach([&](const Entry* e) { order.emplace_back(e->last_use, e->slot); });
  std::sort(order.begin(), order.end());
  const uint32_t head = static_cast<uint32_t>(num_slots_);
  uint32_t prev = head;
  for (const auto& [last_use, slot] : order) {
    entries_[slot].lru_prev = prev;
    entries_[prev].lru_next = slot;
    prev = slot;
  }
  entries_[prev].lru_next = head;
  entries_[head].lru_prev = prev;
}

Entry* Index::Victim() const {
  for (uint32_t s = entries_[num_slots_].lru_next; s != num_slots_; s = entries_[s].lru_next) {
    if (entries_[s].pins == 0) return &entries_[s];
  }
  return nullptr;
}

void Index::AddRun(uint64_t start, uint64_t length) const {
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
  EnsureRuns();
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

void Index::ReleaseSlot(uint64_t slot) {
  if (!slot_taken_[slot]) return;
  slot_taken_[slot] = 0;
  if (runs_stale_) {
    ++free_count_;  // the runs are recomputed anyway
  } else {
    FreeRun(slot);
  }
}

bool Index::ClaimSlot(uint64_t slot) {
  if (slot_taken_[slot]) return false;
  slot_taken_[slot] = 1;
  --free_count_;
  runs_stale_ = true;
  return true;
}

uint64_t Index::free_runs() const {
  EnsureRuns();
  return runs_.size();
}

void Index::RebuildFreeList() {
  runs_stale_ = true;
  EnsureRuns();
}

void Index::EnsureRuns() const {
  if (!runs_stale_) return;
  runs_stale_ = false;
  runs_.clear();
  by_length_.clear();
  const uint64_t n = slot_taken_.size();
  for (uint64_t s = 0; s < n;) {
    if (slot_taken_[s]) {
      ++s;
      continue;
    }
    uint64_t end = s;
    while (end < n && !slot_taken_[end]) ++end;
    AddRun(s, end - s);
    s = end;
  }
}

}  // namespace tutti::store

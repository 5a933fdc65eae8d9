#include "daemon/store/index.h"

#include <algorithm>
#include <cassert>
#include <iterator>
#include <utility>

namespace tutti::store {

Index::Index(uint64_t num_slots, uint32_t max_objects)
    : num_slots_(num_slots),
      max_objects_(max_objects),
      entries_(new Entry[num_slots]),
      policy_(MakeEvictionPolicy(static_cast<uint32_t>(num_slots))),
      set_(0, SlotHash{entries_.get()}, SlotEq{entries_.get()}),
      slot_state_(num_slots, 0),
      checksums_(num_slots * max_objects, 0) {
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
  assert(AtSlot(slot) == nullptr && "Insert into a slot that holds an entry");
  e->ns = ns;
  e->key = key;
  e->slot = static_cast<uint32_t>(slot);
  e->epoch = epoch;
  newest_slot_ = static_cast<uint32_t>(slot);
  clock_before_newest_ = use_clock_;
  e->last_use = ++use_clock_;
  e->object_len = object_len;
  e->num_objects = static_cast<uint32_t>(std::min<size_t>(checksums.size(), max_objects_));
  e->pins = 0;
  std::copy_n(checksums.begin(), e->num_objects, &checksums_[slot * max_objects_]);
  slot_state_[slot] |= kHoldsEntry;
  policy_->Insert(static_cast<uint32_t>(slot));
  set_.insert(static_cast<uint32_t>(slot));
  ++ns_entries_[ns];
  return e;
}

void Index::Remove(Entry* e) {
  set_.erase(static_cast<uint32_t>(e->slot));  // hashes *e: before it is cleared
  auto count = ns_entries_.find(e->ns);
  if (--count->second == 0) ns_entries_.erase(count);
  policy_->Erase(e->slot);
  slot_state_[e->slot] &= ~kHoldsEntry;
}

void Index::Touch(Entry* e) {
  newest_slot_ = e->slot;
  clock_before_newest_ = use_clock_;
  e->last_use = ++use_clock_;
  policy_->Touch(e->slot);
}

void Index::SetLastUse(Entry* e, uint64_t last_use) {
  // The uses stay in last_use order while each entry set is the newest one and not older than
  // any other (a checkpoint written in use order, or none).
  if (e->slot != newest_slot_ || last_use < clock_before_newest_) uses_ordered_ = false;
  e->last_use = last_use;
  use_clock_ = std::max(use_clock_, last_use);
}

void Index::OrderByLastUse() {
  if (uses_ordered_) return;  // Insert and Touch keep it so
  uses_ordered_ = true;
  std::vector<std::pair<uint64_t, uint32_t>> order;  // (last_use, slot)
  order.reserve(size());
  ForEach([&](const Entry* e) { order.emplace_back(e->last_use, e->slot); });
  std::sort(order.begin(), order.end());
  for (const auto& [last_use, slot] : order) policy_->Erase(slot);
  for (const auto& [last_use, slot] : order) policy_->Insert(slot);
}

Entry* Index::Victim() const {
  return VictimWhere([](const Entry&) { return true; });
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
    slot_state_[s] |= kTaken;
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
  if ((slot_state_[slot] & kTaken) == 0) return;
  slot_state_[slot] &= ~kTaken;
  if (runs_stale_) {
    ++free_count_;  // the runs are recomputed anyway
  } else {
    FreeRun(slot);
  }
}

bool Index::ClaimSlot(uint64_t slot) {
  if ((slot_state_[slot] & kTaken) != 0) return false;
  slot_state_[slot] |= kTaken;
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
  const uint64_t n = slot_state_.size();
  auto taken = [&](uint64_t s) { return (slot_state_[s] & kTaken) != 0; };
  for (uint64_t s = 0; s < n;) {
    if (taken(s)) {
      ++s;
      continue;
    }
    uint64_t end = s;
    while (end < n && !taken(end)) ++end;
    AddRun(s, end - s);
    s = end;
  }
}

}  // namespace tutti::store

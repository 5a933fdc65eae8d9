// Least recently used first: the store's eviction policy (eviction_policy.cc chooses it). The
// held ids form a list in order of their last Insert or Touch, linked through two arrays of ids
// (8 bytes per id, allocated once), so each call is O(1) and Victim walks from the least recently
// used end past the ids that are not eligible.
#ifndef TUTTI_DAEMON_STORE_LRU_POLICY_H_
#define TUTTI_DAEMON_STORE_LRU_POLICY_H_

#include <cstdint>
#include <memory>

#include "daemon/store/eviction_policy.h"

namespace tutti::store {

class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(uint32_t capacity)
      : head_(capacity), prev_(new uint32_t[capacity + 1]), next_(new uint32_t[capacity + 1]) {
    for (uint32_t id = 0; id < capacity; ++id) prev_[id] = next_[id] = kNone;
    prev_[head_] = next_[head_] = head_;
  }

  void Insert(uint32_t id) override { LinkAtTail(id); }
  void Touch(uint32_t id) override {
    if (prev_[head_] == id) return;  // most recent already
    Unlink(id);
    LinkAtTail(id);
  }
  void Erase(uint32_t id) override {
    Unlink(id);
    prev_[id] = next_[id] = kNone;
  }
  uint32_t Victim(absl::FunctionRef<bool(uint32_t)> eligible) const override {
    for (uint32_t id = next_[head_]; id != head_; id = next_[id]) {
      if (eligible(id)) return id;
    }
    return kNone;
  }
  bool Holds(uint32_t id) const override { return next_[id] != kNone; }

 private:
  void Unlink(uint32_t id) {
    next_[prev_[id]] = next_[id];
    prev_[next_[id]] = prev_[id];
  }
  void LinkAtTail(uint32_t id) {  // the most recently used end
    prev_[id] = prev_[head_];
    next_[id] = head_;
    next_[prev_[head_]] = id;
    prev_[head_] = id;
  }

  // The list's head, one past the last id: next_[head_] is the least recently used id, prev_[head_]
  // the most recently used; both are head_ when nothing is held.
  const uint32_t head_;
  // Neighbours of each held id; kNone for an id not held.
  std::unique_ptr<uint32_t[]> prev_, next_;
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_LRU_POLICY_H_

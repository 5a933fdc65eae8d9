// The in-memory index: (namespace, key) -> slot, recency, pins, and slot
// ownership. Recency is the eviction policy's (eviction_policy.h, over slot
// numbers); which slots hold an entry, and which are free, is the index's own
// slot state, not the policy's. Free slots are kept as runs of consecutive slots, so that the
// blocks of one store batch can go into consecutive slots (pool format 2 puts
// one layer's objects of consecutive slots next to each other on disk).
//
// Memory is sized by the pool, not by the blocks in it, and allocated once: an
// Entry of 56 bytes per slot (the entry of slot s lives at s), the policy's
// (the LRU list's links: 8 bytes per slot), the checksum table (8 bytes x
// max_objects per slot), a byte of slot state, and a hash set of slot numbers
// (4 bytes per bucket plus a control byte, reserved for every slot), about 80
// bytes per slot plus the checksums: no allocation per block, and a lookup
// touches the hash set, the entry and the policy's links. (docs/operations.md,
// "Sizing memory and start-up for a large pool", has the figures measured by
// bench/scale.)
//
// Not thread-safe: BlockStore guards it with its mutex. Entries are owned by
// the index; a pointer to one names the block in its slot until Remove (after
// that it names whatever block is inserted in that slot next).
#ifndef TUTTI_DAEMON_STORE_INDEX_H_
#define TUTTI_DAEMON_STORE_INDEX_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "daemon/store/eviction_policy.h"

namespace tutti::store {

struct Entry {
  NamespaceId ns = 0;
  Key key;
  uint64_t epoch = 0;
  // The index's use clock when the block was last inserted or touched: the
  // policy saw the uses in order of it. Kept in the checkpoint, so that a
  // restart rebuilds the same order (Index::SetLastUse, OrderByLastUse).
  uint64_t last_use = 0;
  uint32_t slot = 0;  // < Index::kMaxSlots
  uint32_t object_len = 0;
  uint32_t num_objects = 0;
  uint32_t pins = 0;
};
static_assert(sizeof(Entry) == 56, "an entry per slot: docs/operations.md counts 56 bytes");

class Index {
 public:
  // The most slots an index holds (slot numbers are kept in 32 bits).
  static constexpr uint64_t kMaxSlots = EvictionPolicy::kNone - 1;

  // An index over `num_slots` slots of up to `max_objects` objects each.
  // Precondition: num_slots <= kMaxSlots (BlockStore::Open refuses larger pools).
  Index(uint64_t num_slots, uint32_t max_objects);
  // The hash set points into entries_: neither copied nor moved.
  Index(const Index&) = delete;
  Index& operator=(const Index&) = delete;

  // Null if absent.
  Entry* Find(NamespaceId ns, const Key& key) const;

  // Adds a visible entry in `slot`, which must have been taken with TakeSlot
  // (or be free during recovery: see ClaimSlot). Stores `checksums` (one per
  // object) for the slot. Preconditions: the key is absent, the slot holds no
  // entry.
  Entry* Insert(NamespaceId ns, const Key& key, uint64_t slot, uint64_t epoch, uint32_t object_len,
                absl::Span<const uint64_t> checksums);
  // Removes the entry; its slot is NOT freed (free it with ReleaseSlot once
  // that is safe). Precondition: e->pins == 0.
  void Remove(Entry* e);

  // Marks `e` used (its last_use is the use clock's next value; the policy is
  // told).
  void Touch(Entry* e);
  // Recovery: sets `e`'s last_use as a checkpoint recorded it, and moves the use
  // clock past it, so that entries inserted after it count as more recent. The
  // policy is not told: call OrderByLastUse once every entry is in.
  void SetLastUse(Entry* e, uint64_t last_use);
  // Gives the policy the entries again in ascending last_use (ties: by slot), as
  // if they had been used in that order. Costs O(n log n) in the entries, and 16
  // bytes per entry while it runs, unless every SetLastUse since the last call
  // set the newest entry's last use to one not older than any other (then
  // nothing: the policy saw the uses in order already).
  void OrderByLastUse();
  // The use clock: the last value given to an entry's last_use.
  uint64_t use_clock() const { return use_clock_; }
  // The policy's first victim among the unpinned entries, or null if all are
  // pinned.
  Entry* Victim() const;
  // The policy's first victim among the unpinned entries for which
  // pred(const Entry&) is true, or null. With LRU: walks from the least recently
  // used end, O(entries older than the one found).
  template <typename Pred>
  Entry* VictimWhere(Pred pred) const {
    const uint32_t s = policy_->Victim([&](uint32_t slot) {
      return entries_[slot].pins == 0 && pred(static_cast<const Entry&>(entries_[slot]));
    });
    return s == EvictionPolicy::kNone ? nullptr : &entries_[s];
  }

  // Takes a free slot (the lowest one); false if none is free.
  bool TakeSlot(uint64_t* slot);
  // Takes min(n, free_slots()) free slots, returned in ascending order: the
  // lowest n consecutive free slots if there are n in a row; else the longest
  // run of free slots whole (the lowest of equally long ones), and so on with
  // what is still wanted, until n are taken or none is free. Costs O(log runs)
  // per run taken, plus a walk over the runs below the one chosen.
  std::vector<uint64_t> TakeSlots(uint64_t n);
  // Returns a slot to the free slots; no-op if it is free already.
  void ReleaseSlot(uint64_t slot);
  // During recovery: marks `slot` taken, in O(1). Returns false if it already
  // was. The free runs are recomputed once, in O(slots), by RebuildFreeList or
  // at the first call that needs them after claims (TakeSlot(s), free_runs()).
  bool ClaimSlot(uint64_t slot);
  void RebuildFreeList();
  // Entry occupying `slot`, or null.
  Entry* AtSlot(uint64_t slot) const {
    return (slot_state_[slot] & kHoldsEntry) != 0 ? &entries_[slot] : nullptr;
  }

  absl::Span<const uint64_t> Checksums(const Entry& e) const {
    return {&checksums_[e.slot * max_objects_], e.num_objects};
  }

  uint64_t size() const { return set_.size(); }
  uint64_t num_slots() const { return num_slots_; }
  uint64_t free_slots() const { return free_count_; }
  // Runs of consecutive free slots (for tests and stats).
  uint64_t free_runs() const;
  // Entries of namespace `ns`, in O(1).
  uint64_t CountNamespace(NamespaceId ns) const {
    auto it = ns_entries_.find(ns);
    return it == ns_entries_.end() ? 0 : it->second;
  }

  // Calls fn(Entry*) for every entry, in slot order; fn must not insert or
  // remove. Costs O(num_slots()).
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (uint64_t s = 0; s < num_slots_; ++s) {
      if (Entry* e = AtSlot(s)) fn(e);
    }
  }

 private:
  // A lookup key; the set's elements are slot numbers whose (ns, key) is in entries_.
  struct KeyRef {
    NamespaceId ns;
    const Key* key;
  };
  static size_t HashOf(NamespaceId ns, const Key& key) {
    return absl::Hash<std::pair<NamespaceId, uint64_t>>{}({ns ^ key.hi(), key.lo()});
  }
  struct SlotHash {
    using is_transparent = void;
    const Entry* entries;
    size_t operator()(uint32_t slot) const { return HashOf(entries[slot].ns, entries[slot].key); }
    size_t operator()(const KeyRef& k) const { return HashOf(k.ns, *k.key); }
  };
  struct SlotEq {
    using is_transparent = void;
    const Entry* entries;
    bool operator()(uint32_t a, uint32_t b) const { return a == b; }
    bool operator()(const KeyRef& k, uint32_t slot) const {
      return entries[slot].ns == k.ns && entries[slot].key == *k.key;
    }
    bool operator()(uint32_t slot, const KeyRef& k) const { return (*this)(k, slot); }
  };

  // Recomputes the runs if claims made them stale.
  void EnsureRuns() const;

  const uint64_t num_slots_;
  const uint32_t max_objects_;
  // num_slots_: entry s is slot s's, valid while AtSlot(s).
  std::unique_ptr<Entry[]> entries_;
  // Over the slots that hold an entry: told of every Insert, Touch and Remove.
  std::unique_ptr<EvictionPolicy> policy_;
  absl::flat_hash_set<uint32_t, SlotHash, SlotEq> set_;
  absl::flat_hash_map<NamespaceId, uint64_t> ns_entries_;
  // Taking a slot out of the free runs, or putting it back: the runs' only editors.
  void AddRun(uint64_t start, uint64_t length) const;
  void EraseRun(absl::btree_map<uint64_t, uint64_t>::iterator run);
  void FreeRun(uint64_t slot);  // slot was taken
  // Takes the first `n` slots of `run` (n <= its length), appending them to `out`.
  void TakeFromRun(absl::btree_map<uint64_t, uint64_t>::iterator run, uint64_t n,
                   std::vector<uint64_t>* out);

  struct LongerFirst {
    bool operator()(const std::pair<uint64_t, uint64_t>& a,
                    const std::pair<uint64_t, uint64_t>& b) const {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    }
  };

  uint64_t use_clock_ = 0;
  // False once SetLastUse may have made the order the policy saw the uses in
  // differ from last_use order.
  bool uses_ordered_ = true;
  // The slot last inserted or touched (kNone if none since the index was made),
  // and the use clock just before: every other entry's last_use is at most that.
  uint32_t newest_slot_ = EvictionPolicy::kNone;
  uint64_t clock_before_newest_ = 0;
  // A byte per slot: kTaken while the slot is not free (taken, claimed, or
  // holding an entry until ReleaseSlot), kHoldsEntry between Insert and Remove.
  static constexpr uint8_t kTaken = 1, kHoldsEntry = 2;
  std::vector<uint8_t> slot_state_;
  uint64_t free_count_ = 0;
  // The free slots: exactly the slots s without kTaken, as maximal runs,
  // unless runs_stale_ (ClaimSlot skips them; EnsureRuns recomputes them).
  mutable bool runs_stale_ = false;
  mutable absl::btree_map<uint64_t, uint64_t> runs_;  // start -> length
  // (length, start)
  mutable absl::btree_set<std::pair<uint64_t, uint64_t>, LongerFirst> by_length_;
  std::vector<uint64_t> checksums_;  // num_slots x max_objects
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_INDEX_H_

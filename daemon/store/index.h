// The in-memory index: (namespace, key) -> slot, recency, pins, and slot
// ownership. Free slots are kept as runs of consecutive slots, so that the
// blocks of one store batch can go into consecutive slots (pool format 2 puts
// one layer's objects of consecutive slots next to each other on disk).
//
// Not thread-safe: BlockStore guards it with its mutex. Entries are owned by
// the index; pointers to them stay valid until Remove.
#ifndef TUTTI_DAEMON_STORE_INDEX_H_
#define TUTTI_DAEMON_STORE_INDEX_H_

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "daemon/common/types.h"

namespace tutti::store {

struct Entry {
  NamespaceId ns = 0;
  Key key;
  uint64_t slot = 0;
  uint64_t epoch = 0;
  uint32_t object_len = 0;
  uint32_t num_objects = 0;
  uint32_t pins = 0;
  std::list<Entry*>::iterator lru;
};

class Index {
 public:
  // An index over `num_slots` slots of up to `max_objects` objects each.
  Index(uint64_t num_slots, uint32_t max_objects);

  // Null if absent.
  Entry* Find(NamespaceId ns, const Key& key) const;

  // Adds a visible entry in `slot`, which must have been taken with TakeSlot
  // (or be free during recovery: see ClaimSlot). Stores `checksums` (one per
  // object) for the slot. Precondition: the key is absent.
  Entry* Insert(NamespaceId ns, const Key& key, uint64_t slot, uint64_t epoch, uint32_t object_len,
                absl::Span<const uint64_t> checksums);
  // Removes the entry; its slot is NOT freed (free it with ReleaseSlot once
  // that is safe). Precondition: e->pins == 0.
  void Remove(Entry* e);

  // Marks `e` most recently used.
  void Touch(Entry* e);
  // The least recently used unpinned entry, or null if all are pinned.
  Entry* Victim() const;

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
  // During recovery: marks `slot` taken. Returns false if it already was. Call
  // RebuildFreeList once recovery is done, before any TakeSlot (the free runs
  // are kept up to date anyway; RebuildFreeList recomputes them).
  bool ClaimSlot(uint64_t slot);
  void RebuildFreeList();
  // Entry occupying `slot`, or null.
  Entry* AtSlot(uint64_t slot) const { return slot_owner_[slot]; }

  absl::Span<const uint64_t> Checksums(const Entry& e) const {
    return {&checksums_[e.slot * max_objects_], e.num_objects};
  }

  uint64_t size() const { return map_.size(); }
  uint64_t num_slots() const { return slot_owner_.size(); }
  uint64_t free_slots() const { return free_count_; }
  // Runs of consecutive free slots (for tests and stats).
  uint64_t free_runs() const { return runs_.size(); }

  // Calls fn(Entry*) for every entry; fn must not insert or remove.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const auto& [k, e] : map_) fn(e.get());
  }

 private:
  struct MapKey {
    NamespaceId ns;
    Key key;
    friend bool operator==(const MapKey& a, const MapKey& b) {
      return a.ns == b.ns && a.key == b.key;
    }
    template <typename H>
    friend H AbslHashValue(H h, const MapKey& k) {
      return H::combine(std::move(h), k.ns, k.key);
    }
  };

  const uint32_t max_objects_;
  absl::flat_hash_map<MapKey, std::unique_ptr<Entry>> map_;
  std::list<Entry*> lru_;  // front: least recently used
  std::vector<Entry*> slot_owner_;
  // Taking a slot out of the free runs, or putting it back: the runs' only editors.
  void AddRun(uint64_t start, uint64_t length);
  void EraseRun(absl::btree_map<uint64_t, uint64_t>::iterator run);
  void FreeRun(uint64_t slot);    // slot was taken
  void RemoveFree(uint64_t slot);  // slot was free
  // Takes the first `n` slots of `run` (n <= its length), appending them to `out`.
  void TakeFromRun(absl::btree_map<uint64_t, uint64_t>::iterator run, uint64_t n,
                   std::vector<uint64_t>* out);

  struct LongerFirst {
    bool operator()(const std::pair<uint64_t, uint64_t>& a,
                    const std::pair<uint64_t, uint64_t>& b) const {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    }
  };

  std::vector<uint8_t> slot_taken_;
  // The free slots: exactly the slots s with !slot_taken_[s], as maximal runs.
  absl::btree_map<uint64_t, uint64_t> runs_;  // start -> length
  absl::btree_set<std::pair<uint64_t, uint64_t>, LongerFirst> by_length_;  // (length, start)
  uint64_t free_count_ = 0;
  std::vector<uint64_t> checksums_;  // num_slots x max_objects
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_INDEX_H_

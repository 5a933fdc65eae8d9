// The in-memory index: (namespace, key) -> slot, recency, pins, and slot
// ownership.
//
// Not thread-safe: BlockStore guards it with its mutex. Entries are owned by
// the index; pointers to them stay valid until Remove.
#ifndef TUTTI_DAEMON_STORE_INDEX_H_
#define TUTTI_DAEMON_STORE_INDEX_H_

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

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

  // Takes a free slot; false if none is free.
  bool TakeSlot(uint64_t* slot);
  // Returns a slot to the free list.
  void ReleaseSlot(uint64_t slot);
  // During recovery: marks `slot` taken. Returns false if it already was. Call
  // RebuildFreeList once recovery is done, before any TakeSlot.
  bool ClaimSlot(uint64_t slot);
  void RebuildFreeList();
  // Entry occupying `slot`, or null.
  Entry* AtSlot(uint64_t slot) const { return slot_owner_[slot]; }

  absl::Span<const uint64_t> Checksums(const Entry& e) const {
    return {&checksums_[e.slot * max_objects_], e.num_objects};
  }

  uint64_t size() const { return map_.size(); }
  uint64_t num_slots() const { return slot_owner_.size(); }
  uint64_t free_slots() const { return free_.size(); }

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
  std::vector<uint8_t> slot_taken_;
  std::vector<uint64_t> free_;
  std::vector<uint64_t> checksums_;  // num_slots x max_objects
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_INDEX_H_

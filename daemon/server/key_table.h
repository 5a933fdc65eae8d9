// Repeated keys in a request's chain (a Lookup's 2048 keys, a Store's or Retrieve's blocks):
// an open-addressing table of the chain's indices, sized once per call (a power of two at least
// twice the keys: 16 KiB of 4-byte slots for 2048 keys), linear probing, and a key compared as
// two 64-bit words. It replaced an absl::flat_hash_set<Key> whose reserve and inserts were the
// most of a 2048-key Lookup's argument checks (issue 21 section 4).
//
// The probe position mixes both halves of the key with a seed fixed per process (from
// absl::Hash, itself seeded per process): a client cannot choose keys that collide on purpose.
//
// Thread-safety: FindDuplicate is a pure function; a KeyTable is owned by one thread.
#ifndef TUTTI_DAEMON_SERVER_KEY_TABLE_H_
#define TUTTI_DAEMON_SERVER_KEY_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "daemon/common/types.h"

namespace tutti::server {

// The first repetition in a chain: keys[index] == keys[first], first < index, and keys[0, index)
// are distinct.
struct Duplicate {
  size_t index = 0;
  size_t first = 0;
};

// The first key of `keys` that repeats an earlier one, or nullopt when all are distinct.
// O(n) expected; at most 2^32 - 2 keys.
std::optional<Duplicate> FindDuplicate(absl::Span<const Key> keys);

// The table behind FindDuplicate: the distinct keys of a chain, each by its index in it. The
// chain must outlive the table and stay unchanged while it is used.
class KeyTable {
 public:
  // Room for `capacity` keys of `chain` (nothing inserted yet).
  KeyTable(absl::Span<const Key> chain, size_t capacity);

  // Inserts chain[i] unless an equal key is in; returns the index of that key (then nothing is
  // inserted), or i. Precondition: i < chain.size(), fewer than `capacity` keys inserted.
  size_t Insert(size_t i);

  // The index of a key equal to `key` among those inserted, or nullopt.
  std::optional<size_t> Find(const Key& key) const;

  size_t size() const { return size_; }
  // Slots of the table (a power of two, at least twice the capacity; 4 bytes each).
  size_t slots() const { return slots_.size(); }

 private:
  size_t Home(const Key& key) const;

  absl::Span<const Key> chain_;
  std::vector<uint32_t> slots_;  // 0: empty; else 1 + the index of a key in chain_
  size_t mask_ = 0;
  int shift_ = 0;
  size_t size_ = 0;
};

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_KEY_TABLE_H_

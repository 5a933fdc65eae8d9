// The optional host-DRAM tier: whole blocks kept in memory in front of the SSD
// pool, least recently used out first, bounded by a byte capacity. It caches
// only blocks that are durable in the pool (the store inserts at commit and
// erases on eviction), so it never holds the only copy.
//
// Not thread-safe: BlockStore guards it. Blocks handed out by Find stay valid
// while the caller holds the shared_ptr, even after Erase.
#ifndef TUTTI_DAEMON_STORE_DRAM_TIER_H_
#define TUTTI_DAEMON_STORE_DRAM_TIER_H_

#include <cstdint>
#include <list>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "daemon/common/types.h"

namespace tutti::store {

struct DramBlock {
  NamespaceId ns = 0;
  Key key;
  uint64_t epoch = 0;
  uint32_t object_len = 0;
  uint32_t num_objects = 0;
  std::unique_ptr<uint8_t[]> data;  // num_objects x object_len
  const uint8_t *object(uint32_t i) const { return data.get() + uint64_t{i} * object_len; }
  uint64_t bytes() const { return uint64_t{num_objects} * object_len; }
};

class DramTier {
 public:
  explicit DramTier(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Copies the block's objects in, evicting least recently used blocks to make
  // room. Does nothing if the tier is off or the block alone exceeds the
  // capacity.
  void Insert(NamespaceId ns, const Key &key, uint64_t epoch, uint32_t object_len,
              absl::Span<uint8_t *const> objects);
  // The block if cached with this epoch (and marks it recently used), else
  // null.
  std::shared_ptr<const DramBlock> Find(NamespaceId ns, const Key &key, uint64_t epoch);
  void Erase(NamespaceId ns, const Key &key);

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  // Blocks of `ns` in the tier.
  uint64_t CountNamespace(NamespaceId ns) const;

 private:
  using MapKey = std::pair<NamespaceId, Key>;
  struct Node {
    std::shared_ptr<DramBlock> block;
    std::list<MapKey>::iterator lru;
  };
  void EvictOne();

  const uint64_t capacity_;
  uint64_t used_ = 0;
  absl::flat_hash_map<MapKey, Node> map_;
  std::list<MapKey> lru_;  // front: least recently used
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_DRAM_TIER_H_

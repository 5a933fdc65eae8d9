// The DRAM front (pool.admission "dram_front", docs/admission.md): blocks that the admission
// policy did not write to the SSD at their first sight, kept in host DRAM only, evicted in the
// order of the store's eviction policy (eviction_policy.h, over chunk numbers, as the DRAM tier;
// Lookups do not touch kept blocks, so with LRU the least recently inserted goes first). A kept block is found by Lookup and served from DRAM like a DRAM-tier hit;
// its second sight promotes it: the store writes it to the SSD, and from BeginPromotion on it is
// outside the front's bound and its eviction order, until EndPromotion once it is published (or
// failed). A block evicted before its second sight is dropped (nothing of it is anywhere else).
// Nothing here is durable: after a restart the front is empty.
//
// Memory: one region (BlockStore::dram_region()), cut into chunks of one block each; nothing is
// allocated per block but the map entry. The region may hold more chunks than max_blocks: blocks
// being promoted keep theirs until written, so new blocks need not push older ones out for them.
//
// Not thread-safe: BlockStore guards it. Block data handed out (Entry::data, BeginPromotion) stays
// valid while the caller holds the shared_ptr, even after the block left the front; its chunk
// returns when the last holder lets go (that release is thread-safe).
#ifndef TUTTI_DAEMON_STORE_DRAM_FRONT_H_
#define TUTTI_DAEMON_STORE_DRAM_FRONT_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "daemon/store/dram_tier.h"
#include "daemon/store/eviction_policy.h"
#include "daemon/store/staging.h"

namespace tutti::store {

class DramFront {
 public:
  struct Entry {
    std::shared_ptr<DramBlock> data;
    uint32_t pins = 0;        // Lookups' pins: a pinned block is never evicted
    bool promoting = false;   // being written to the SSD (BeginPromotion .. EndPromotion)
  };

  // A front of at most `max_blocks` kept blocks (promoting ones not counted) over `region`
  // (which must outlive the front and every block it hands out), one block per `chunk_bytes`.
  // A region smaller than a chunk, or max_blocks == 0, turns it off (every TakeChunk is null).
  DramFront(absl::Span<uint8_t> region, uint64_t chunk_bytes, uint64_t max_blocks);

  // A free chunk for a new block; if none is free, evicts the policy's unpinned kept victims
  // until one is (each counted in *dropped). Null when none can be freed (every
  // chunk held by promotions, pins or readers). Give it back (GiveBack) or Insert it.
  uint8_t* TakeChunk(uint64_t* dropped);
  void GiveBack(uint8_t* chunk);
  // Keeps the block in `chunk` (filled: num_objects objects of object_len bytes, back to back)
  // as the most recent, evicting the policy's unpinned kept victims while max_blocks are kept
  // (counted in *dropped). Precondition: (ns, key) is not in the front; chunk from TakeChunk.
  void Insert(NamespaceId ns, const Key& key, uint32_t object_len, uint32_t num_objects,
              uint8_t* chunk, uint64_t* dropped);

  // The block of (ns, key), kept or promoting, or null. Valid until the next non-const call.
  Entry* Find(NamespaceId ns, const Key& key);
  // Takes a kept block out of the bound and the eviction order: it stays findable (and pinnable)
  // until EndPromotion. Returns its data. Precondition: Find gives a block not promoting.
  std::shared_ptr<const DramBlock> BeginPromotion(NamespaceId ns, const Key& key);
  // Forgets a promoting block; returns its pins (now the caller's to account for).
  uint32_t EndPromotion(NamespaceId ns, const Key& key);
  // Drops the unpinned kept blocks of `ns` (0: of every namespace); returns how many.
  uint64_t EraseNamespace(NamespaceId ns);

  bool enabled() const { return chunks_ != nullptr; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  uint64_t max_blocks() const { return max_blocks_; }
  uint64_t kept() const { return kept_; }               // in the bound
  uint64_t blocks() const { return map_.size(); }        // kept and promoting
  uint64_t CountNamespace(NamespaceId ns) const;         // kept and promoting, of `ns`

 private:
  using MapKey = std::pair<NamespaceId, Key>;
  struct Node {
    Entry entry;
    uint32_t chunk = 0;  // its chunk's number in the region: its id in order_
  };
  // Evicts the policy's first unpinned kept block; false when there is none.
  bool EvictOne();
  // Takes a kept block out of order_ (promotion, eviction, erasure).
  void Unorder(const Node& n);

  const uint64_t chunk_bytes_;
  const uint64_t max_blocks_;
  const uint8_t* const base_;          // the region's start: chunk numbers count from it
  std::shared_ptr<FramePool> chunks_;  // shared with the blocks' deleters
  absl::flat_hash_map<MapKey, Node> map_;
  // The kept blocks, by chunk number (promoting ones are not in it), and whose each chunk is.
  std::unique_ptr<EvictionPolicy> order_;
  std::vector<MapKey> key_of_chunk_;
  uint64_t kept_ = 0;
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_DRAM_FRONT_H_

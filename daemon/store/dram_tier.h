// The optional host-DRAM tier: whole blocks kept in memory in front of the SSD pool, evicted in
// the order of the store's eviction policy (eviction_policy.h, over chunk numbers: the same
// policy as the pool's, least recently used first). It caches only blocks that are durable in the pool (the store inserts at
// commit and erases on eviction), so it never holds the only copy.
//
// Its memory is one region allocated at start (BlockStore::dram_region()), cut into chunks of one
// block each, so a GPU daemon can register it once and copy DRAM hits with the copy engine; nothing
// is allocated per block.
//
// Not thread-safe: BlockStore guards it. Blocks handed out by Find stay valid while the caller
// holds the shared_ptr, even after Erase: their chunk returns to the tier when the last holder lets
// go (that release is thread-safe).
#ifndef TUTTI_DAEMON_STORE_DRAM_TIER_H_
#define TUTTI_DAEMON_STORE_DRAM_TIER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "daemon/store/eviction_policy.h"
#include "daemon/store/staging.h"

namespace tutti::store {

struct DramBlock {
  NamespaceId ns = 0;
  Key key;
  uint64_t epoch = 0;
  uint32_t object_len = 0;
  uint32_t num_objects = 0;
  uint8_t* data = nullptr;  // num_objects x object_len, in the tier's region
  const uint8_t* object(uint32_t i) const { return data + uint64_t{i} * object_len; }
};

// A block over `chunk` (taken from `pool`) whose chunk goes back to `pool` when its last holder
// lets go (thread-safe).
std::shared_ptr<DramBlock> MakeDramBlock(std::shared_ptr<FramePool> pool, NamespaceId ns,
                                         const Key& key, uint64_t epoch, uint32_t object_len,
                                         uint32_t num_objects, uint8_t* chunk);

class DramTier {
 public:
  // A tier over `region` (which must outlive the tier and every block it hands out), one block per
  // `chunk_bytes`. A region smaller than a chunk turns the tier off.
  DramTier(absl::Span<uint8_t> region, uint64_t chunk_bytes);

  // Copies the block's objects in, evicting the policy's victims to make room. Does nothing
  // if the tier is off, the block exceeds a chunk, or every chunk is held by readers.
  void Insert(NamespaceId ns, const Key& key, uint64_t epoch, uint32_t object_len,
              absl::Span<uint8_t* const> objects);

  // The same in three steps, so the caller can copy without holding its lock: TakeChunk (under
  // the lock: may evict) returns a free chunk, or null if the tier is off or every chunk is held
  // by readers; the caller fills it with the block's objects, back to back; InsertChunk (under the
  // lock) caches it, or GiveBack returns it unused. Precondition: the block fits in a chunk.
  uint8_t* TakeChunk();
  // Fills a chunk: `objects`, each `object_len` bytes, back to back.
  static void FillChunk(uint8_t* chunk, uint32_t object_len, absl::Span<uint8_t* const> objects);
  void InsertChunk(NamespaceId ns, const Key& key, uint64_t epoch, uint32_t object_len,
                   uint32_t num_objects, uint8_t* chunk);
  void GiveBack(uint8_t* chunk);
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  // The block if cached with this epoch (and tells the policy it was used), else null.
  std::shared_ptr<const DramBlock> Find(NamespaceId ns, const Key& key, uint64_t epoch);
  void Erase(NamespaceId ns, const Key& key);

  uint64_t capacity() const {
    return chunks_ == nullptr ? 0 : chunks_->total_frames() * chunk_bytes_;
  }
  // Bytes of the chunks that hold cached blocks.
  uint64_t used() const { return map_.size() * chunk_bytes_; }
  // Blocks of `ns` in the tier.
  uint64_t CountNamespace(NamespaceId ns) const;

 private:
  using MapKey = std::pair<NamespaceId, Key>;
  // The chunk's number in the region: the policy's id for the block in it.
  uint32_t ChunkId(const uint8_t* chunk) const {
    return static_cast<uint32_t>((chunk - region_) / chunk_bytes_);
  }
  // Evicts the policy's victim; false if the tier caches nothing.
  bool EvictOne();

  const uint64_t chunk_bytes_;
  uint8_t* const region_;
  std::shared_ptr<FramePool> chunks_;  // shared with the blocks' deleters
  absl::flat_hash_map<MapKey, std::shared_ptr<DramBlock>> map_;
  // Over the chunks of the blocks in map_ (a chunk still held by a reader after Erase is not).
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<MapKey> key_of_;  // chunk number -> its block's key, while in map_
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_DRAM_TIER_H_

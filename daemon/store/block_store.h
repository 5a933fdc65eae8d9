// The block store: namespaces, the key -> slot index, pins, the DRAM tier,
// capture of stores into staging, the writer that makes them durable, and
// layer-wise reads with verification.
//
// Lifecycle of a block: Capture copies it into store staging (the engine may
// reuse its memory); the writer thread picks a slot (evicting the least
// recently used unpinned block if the pool is full), writes objects and header,
// syncs, journals a Put and syncs the journal; only then is the key visible to
// LookupAndPin. A crash at any point loses at most blocks not yet visible; a
// block whose bytes do not verify on read (checksum seeded by namespace, key,
// epoch and object index) is reported failed and counted, never served.
//
// Thread-safety: every public method is thread-safe. Internally one writer
// thread owns slot allocation, writes and the journal; reads run on the
// caller's thread and the I/O backend's.
#ifndef TUTTI_DAEMON_STORE_BLOCK_STORE_H_
#define TUTTI_DAEMON_STORE_BLOCK_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/common/clock.h"
#include "daemon/common/types.h"
#include "daemon/io/io_backend.h"
#include "daemon/pool/layout.h"
#include "tutti/v1/kvcache.pb.h"

namespace tutti::store {

struct StoreOptions {
  std::string state_dir;    // journal and checkpoint live here; must exist
  pool::PoolLayout layout;  // of the pool files the backend has open, in order
  uint64_t dram_bytes = 0;  // DRAM tier capacity; 0 = off
  // Staging for captured blocks not yet written, counted in bytes: a block takes
  // num_objects x its object size rounded up to 4 KiB (at least one slot's worth is kept).
  uint64_t store_staging_bytes = 256ull << 20;
  // The most store staging one owner (Capture's `owner`, a session) holds at a time, partial and
  // queued blocks together; 0: three quarters of store_staging_bytes, so the others always keep a
  // quarter. Never below one block of the pool's largest shape (max_objects x object_bytes), so
  // every owner can store. Owner 0 is not capped.
  uint64_t max_staging_bytes_per_owner = 0;
  // A partially captured block (some layers still missing) whose last layer arrived this long ago
  // is dropped and its staging freed (checked by the writer when idle, at least every 500 ms, and
  // by any Capture that finds staging short).
  int64_t pending_ttl_ms = 5000;
  uint64_t retrieve_staging_bytes = 256ull << 20;
  uint32_t checkpoint_every = 65536;  // journal records between checkpoints
  uint32_t max_namespaces = 1024;     // RegisterNamespace refuses new ones past it
  uint32_t write_batch_blocks = 64;   // blocks per writer batch (one sync pair each)
  // Slots whose entries a checkpoint copies under the store's lock at a time, so lookups wait
  // for one chunk's copy at most; 0: the whole checkpoint encoded and written under one hold, as
  // before chunking (bench/checkpoint_bench compares them).
  uint64_t checkpoint_chunk_slots = 1024;
};

// What happened to one block of a Capture. Both rejections copy nothing and are worth retrying
// later: kRejectedFull when store staging as a whole is full, kRejectedOwnerLimit when the
// caller's owner already holds StoreOptions::max_staging_bytes_per_owner.
enum class CaptureOutcome {
  kCaptured,
  kDurable,
  kAlreadyPresent,
  kRejectedFull,
  kFailed,
  kRejectedOwnerLimit,
};

// One object to copy out of staging into the engine (retrieve). `item` indexes
// the keys of Read.
struct ScatterOp {
  uint32_t item;
  uint32_t object;  // layer * parts + part
  const uint8_t* src;
};

// One object to copy from the engine into staging (store).
struct GatherOp {
  uint32_t item;
  uint32_t object;
  uint8_t* dst;
};

struct NamespaceInfo {
  NamespaceId id = 0;
  tutti::v1::Namespace descriptor;
  uint32_t num_objects = 0;  // layers x parts
  uint32_t parts = 0;        // 2 (K and V) or 1 (MLA)
  uint32_t object_len = 0;   // bytes
  uint64_t blocks = 0;       // durable blocks on SSD
  uint64_t blocks_dram = 0;
};

struct StoreStats {
  uint64_t slots_total = 0, slots_used = 0, slot_bytes = 0;
  uint64_t dram_capacity = 0, dram_used = 0;
  uint64_t lookups = 0, lookup_hits = 0, lookup_misses = 0;
  uint64_t blocks_retrieved = 0, blocks_stored = 0, bytes_read = 0, bytes_written = 0;
  uint64_t evictions = 0, verify_errors = 0, io_errors = 0, store_rejected = 0, store_failed = 0;
  // Of store_rejected: blocks refused for their owner's cap (kRejectedOwnerLimit).
  uint64_t store_rejected_owner_limit = 0;
  // Partial blocks dropped: expired (pending_ttl_ms); or their owner gone (DropPending) or the
  // copy of the call that made them failed.
  uint64_t pending_expired = 0, pending_dropped = 0;
  // Store staging in bytes: in use now, and the whole.
  uint64_t store_staging_used = 0, store_staging_bytes = 0;
  uint64_t dram_hits = 0;
  std::vector<NamespaceInfo> namespaces;
};

class BlockStore {
 public:
  // Recovers the index from the journal in options.state_dir, checks it against
  // the pool, and starts the writer thread. `backend` must have
  // layout.num_files() files of layout.file_bytes(). `clock` must outlive the
  // store. Errors: DATA_LOSS for a corrupt checkpoint, INVALID_ARGUMENT for
  // options that do not fit the backend or a pending_ttl_ms <= 0.
  static absl::StatusOr<std::unique_ptr<BlockStore>> Open(const StoreOptions& options,
                                                          std::unique_ptr<io::IoBackend> backend,
                                                          Clock* clock);
  // Flushes (writes every captured block), checkpoints and stops the writer.
  ~BlockStore();

  // Validates `ns` and checks that this pool can hold its blocks, registering
  // nothing: FAILED_PRECONDITION if its objects are larger than the pool's
  // object_bytes or more than max_objects per block; INVALID_ARGUMENT for a
  // layout with a zero field, an overflowing size or an unknown format.
  absl::StatusOr<NamespaceInfo> CheckNamespace(const tutti::v1::Namespace& ns) const;
  // Returns the id of `ns`, registering (and journaling) it on first sight.
  // CheckNamespace's errors; RESOURCE_EXHAUSTED when max_namespaces are
  // kept already.
  absl::StatusOr<NamespaceId> RegisterNamespace(const tutti::v1::Namespace& ns);
  // NOT_FOUND for an unknown id.
  absl::StatusOr<NamespaceInfo> GetNamespace(NamespaceId id) const;

  // Returns how many leading `keys` are present (durable), and pins those: a
  // pinned block is never evicted or overwritten. Each pin must be dropped by
  // one Unpin of the same key.
  uint32_t LookupAndPin(NamespaceId ns, absl::Span<const Key> keys);
  void Unpin(NamespaceId ns, absl::Span<const Key> keys);

  // Reads objects of layers [layer_begin, layer_end) of pinned `keys` and calls
  // `sink` once per layer, in layer order, with that layer's objects of every
  // item not failed so far and the items that failed in this layer (I/O error,
  // short read, checksum or key mismatch: counted, logged, and never passed to
  // the sink). The `src` pointers are valid only during the call. A sink error
  // stops the read and is returned. Preconditions: keys pinned by the caller, 0
  // <= layer_begin < layer_end <= layers of `ns`. Errors: NOT_FOUND unknown
  // namespace, FAILED_PRECONDITION key not pinned, INVALID_ARGUMENT bad layer
  // range.
  using LayerSink = std::function<absl::Status(uint32_t layer, absl::Span<const ScatterOp> objects,
                                               absl::Span<const uint32_t> failed_items)>;
  absl::Status Read(NamespaceId ns, absl::Span<const Key> keys, uint32_t layer_begin,
                    uint32_t layer_end, const LayerSink& sink);

  // Captures layers [layer_begin, layer_end) of each key for `owner` (a
  // session id; 0: no owner, not capped): reserves staging (a block's first
  // call takes staging for the whole block, charged to that call's owner),
  // calls `gather` once with every object to copy, and returns one outcome per
  // key. A key's block is queued for writing once all its layers are captured
  // (over one or more calls); a partial block whose last layer came more than
  // StoreOptions::pending_ttl_ms ago is dropped. Blocks refused staging are
  // kRejectedFull or kRejectedOwnerLimit (which limit). With wait_durable,
  // returns after the queued blocks are durable (kDurable) or failed
  // (kFailed). A gather error fails the whole call (nothing queued). Errors:
  // NOT_FOUND unknown namespace, INVALID_ARGUMENT bad layer range, or the
  // gatherer's.
  using Gatherer = std::function<absl::Status(absl::Span<const GatherOp> ops)>;
  absl::StatusOr<std::vector<CaptureOutcome>> Capture(NamespaceId ns, absl::Span<const Key> keys,
                                                      uint32_t layer_begin, uint32_t layer_end,
                                                      const Gatherer& gather, bool wait_durable,
                                                      uint64_t owner = 0);

  // Drops every partially captured block of `owner` (> 0) and frees its
  // staging: for a session that went away. Blocks a Capture is copying into now
  // are dropped when that call ends; blocks already queued for writing are
  // written. Returns how many blocks were dropped or marked.
  uint64_t DropPending(uint64_t owner);

  // Makes every block captured so far durable (or failed). For shutdown and
  // tests.
  void Flush();

  // Evicts every unpinned block of `ns` (0: of every namespace). Returns
  // evicted and skipped (pinned) counts.
  std::pair<uint64_t, uint64_t> Evict(NamespaceId ns);

  StoreStats Stats() const;

  // The pinned-memory candidates: staging the I/O backend reads into and writes
  // from. Stable for the store's life. A GPU device registers it for mapped
  // access.
  absl::Span<uint8_t> staging_region() const;
  // The DRAM tier's memory (empty when the tier is off): the source of DRAM-tier hits, handed to
  // LayerSink. Stable for the store's life; a GPU daemon registers it like staging_region().
  absl::Span<uint8_t> dram_region() const;

  class Impl;

 private:
  explicit BlockStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_BLOCK_STORE_H_

// The block store: namespaces, the key -> slot index, pins, the DRAM tier,
// capture of stores into staging, the writer that makes them durable, and the
// store side of Retrieves: their sources prepared (PrepareRead) and their results
// accounted (PreparedRead::Finish). The reads themselves are a transfer of the
// datapath (datapath::RunRetrieve) through the reader the store owns (reader()).
//
// Lifecycle of a block: Capture copies it into store staging (the engine may
// reuse its memory); the writer thread picks a slot (evicting the least
// recently used unpinned block if the pool is full), writes objects and header,
// syncs, journals a Put and syncs the journal; only then is the key visible to
// LookupAndPin. A crash at any point loses at most blocks not yet visible; a
// block whose bytes do not verify on read (checksum seeded by namespace, key,
// epoch and object index) or cannot be read (I/O error, short read) is reported
// failed and counted, never served, and leaves the index (a journaled Delete),
// so a later Lookup misses and a later Capture stores it again.
//
// If the journal file or the state directory is removed or replaced while the
// store runs, durability is lost: every later block fails (kFailed), nothing is
// acknowledged durable again, and Stats() says so (durability_lost); a restart
// is needed.
//
// Thread-safety: every public method is thread-safe. Internally one writer
// thread owns slot allocation and pool writes, and one committer thread their
// pool syncs, journal commits and publication; the journal is shared by them,
// Evict, RegisterNamespace and failed reads, none of which waits for another's
// pool writes or pool syncs (block_store_impl.h states the rules); reads run on
// the caller's thread and the I/O backend's.
#ifndef TUTTI_DAEMON_STORE_BLOCK_STORE_H_
#define TUTTI_DAEMON_STORE_BLOCK_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/types.h"
#include "daemon/datapath/bandwidth.h"
#include "daemon/datapath/layer_reader.h"
#include "daemon/datapath/retrieve_transfer.h"
#include "daemon/datapath/scheduler.h"
#include "daemon/datapath/verifier.h"
#include "daemon/io/io_backend.h"
#include "daemon/pool/layout.h"
#include "daemon/store/events.h"
#include "tutti/v1/kvcache.pb.h"

namespace tutti::store {

struct StoreOptions {
  // Journal, checkpoint and the state lock live here; must exist. One store at
  // a time: the lock is held for the store's life.
  std::string state_dir;
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
  // Adjacent objects of one layer are read in one I/O of at most this many bytes (a multiple of
  // 4096, >= 4096; datapath.max_read_bytes).
  uint32_t max_read_bytes = 1u << 20;
  // Retrieve reads of one device posted (and checked) together: datapath.read_post_bytes.
  uint32_t read_post_bytes = 1u << 20;
  // Threads computing object checksums for reads and writes (datapath.checksum_threads); 0: run
  // them on the thread of the transfer.
  uint32_t checksum_threads = 0;
  // Journal records between checkpoints. A failed checkpoint is retried after
  // a back-off (1 s, doubling to 5 min, on the store's clock); meanwhile the
  // journal keeps growing in its current file.
  uint32_t checkpoint_every = 65536;
  uint32_t max_namespaces = 1024;  // RegisterNamespace refuses new ones past it
  // Namespaces one user (NamespaceScope::uid) may register (limits.max_namespaces_per_user).
  uint32_t max_namespaces_per_user = 64;
  // The share of the pool's slots one owner's blocks may hold (limits.pool_share_per_user; 1.0:
  // no bound). The owner of a block is its namespace's owner_uid, or kSharedOwner for a shared
  // namespace (all shared namespaces count as one owner). Past the share, the writer gives that
  // owner's new block the slot of the owner's own least recently used unpinned block; where it has
  // none, the block is refused (kRejectedShare). Precondition: in (0, 1].
  double pool_share_per_user = 1.0;
  uint32_t write_batch_blocks = 64;   // blocks per writer batch (one sync pair each)
  // Writer batches whose writes are posted and not all completed, at most
  // (datapath.write_batches_in_flight); batches written and waiting for their commit do not
  // count. Precondition: >= 1.
  uint32_t write_batches_in_flight = 16;
  // Slots whose entries a checkpoint copies under the store's lock at a time, so lookups wait
  // for one chunk's copy at most; 0: the whole checkpoint encoded and written under one hold, as
  // before chunking (bench/checkpoint_bench compares them).
  uint64_t checkpoint_chunk_slots = 1024;
  // Priors of the read bandwidth meter (datapath.*_read_prior_bytes_per_sec).
  datapath::BandwidthOptions bandwidth;
  // The write backlog: blocks fully captured and queued for the writer (or being written), not
  // yet durable. While it holds max_write_backlog_bytes (0: store_staging_bytes) or more, or its
  // oldest block has waited max_write_backlog_age_ms (on the store's clock) or longer, Capture
  // refuses new blocks at once (kRejectedBacklog; kRejectedFull where staging is full too);
  // blocks already begun are still taken, so the backlog may pass the byte bound by those.
  uint64_t max_write_backlog_bytes = 0;
  int64_t max_write_backlog_age_ms = 10000;
  // The I/O scheduler's write caps per pool file (datapath/scheduler.h): while it has reads in
  // flight, and without.
  uint64_t write_bytes_in_flight_while_reading = 1ull << 20;
  uint64_t max_write_bytes_in_flight = 64ull << 20;
  // IoSchedulerOptions::max_read_bytes_in_flight (datapath.max_read_bytes_in_flight, its default
  // worked out by tuttid's start: here what 64 reads of 1 MiB hold); 0: reads go at once and
  // Retrieves do not take turns.
  uint64_t max_read_bytes_in_flight = 64ull << 20;
  // IoSchedulerOptions::write_latency_target_us (datapath.write_latency_target_ms); 0: off.
  int64_t write_latency_target_us = 0;
  // The block events (events.h, BlockStore::events): the pool's id (PoolIdOf of its uuid; 0: a
  // random one, for a pool that lives only as long as this start), each namespace's ring size
  // (limits.max_pending_events) and the events kept for all namespaces together
  // (limits.max_pending_events_total).
  uint64_t pool_id = 0;
  uint32_t max_pending_events = 65536;
  uint64_t max_pending_events_total = 1ull << 20;
  // Which new blocks of a Store are written to the pool (admission.h; pool.admission): "all",
  // "second_sight" or "dram_front". Declined blocks are kDeclined, or with "dram_front" kept in
  // the DRAM front (kInDram; see Capture). admission_ghost_blocks: the ghost bound in keys; 0:
  // 2 x the pool's slots. "dram_front" needs dram_bytes >= one block's chunk (Open refuses it
  // otherwise): the front keeps dram_bytes / chunk blocks, and its region has room for
  // store_staging_bytes more, for blocks being promoted to the SSD. With "dram_front" the DRAM
  // tier holds front blocks only (blocks on the SSD are not copied to DRAM: the two are
  // exclusive, as in bench/trace_policies.py's DramFront).
  std::string admission = "all";
  uint64_t admission_ghost_blocks = 0;
  // pool.recency "tail_first": LookupAndPin uses its hits from the last back to the first, and
  // the blocks one Capture call queued enter the index (and the DRAM tier) last first, so of one
  // request's blocks the pool evicts the tail before the head. false ("chain"): in key order.
  bool tail_first = false;
};

// What happened to one block of a Capture. The rejections copy nothing and are worth retrying
// later: kRejectedFull when store staging as a whole is full, kRejectedOwnerLimit when the
// caller's owner already holds StoreOptions::max_staging_bytes_per_owner, kRejectedBacklog when
// the write backlog is past StoreOptions::max_write_backlog_bytes or max_write_backlog_age_ms
// (the server answers both kRejectedOwnerLimit and kRejectedBacklog as "full").
enum class CaptureOutcome {
  kCaptured,
  kDurable,
  kAlreadyPresent,
  kRejectedFull,
  kFailed,
  kRejectedOwnerLimit,
  kRejectedBacklog,
  // The block's owner holds StoreOptions::pool_share_per_user of the pool and none of its own
  // blocks could be evicted for it (all pinned). Decided by the writer: only a wait_durable
  // Capture sees it (others saw kCaptured).
  kRejectedShare,
  // The admission policy (StoreOptions::admission) did not admit the new block: it was dropped
  // (no staging kept, nothing written or journaled; a later Lookup misses). Not an error; a
  // later Store of the key may be admitted (second_sight: while the key is in the ghost).
  kDeclined,
  // "dram_front": not admitted to the SSD at its first sight, the new block was copied into the
  // DRAM front instead: a Lookup finds it and a Read serves it from DRAM while it stays there,
  // but it is not durable (not journaled; lost at a restart; evicted from DRAM it is gone) and
  // a wait_durable Capture does not wait for it. Its second sight (a Lookup hit, or a Capture
  // of the key while it is kept) writes it to the SSD through the normal write path.
  kInDram,
};

// Who a namespace belongs to (docs/security.md "Namespaces"), as the server decides it from the
// engine's credential, its namespace_secret and security.namespace_sharing.
struct NamespaceScope {
  // Mixed into the namespace id, so that namespaces of different scopes never share blocks or
  // events: "" for namespaces every user shares (security.namespace_sharing "host", and every
  // namespace journaled before scopes existed: their ids are unchanged), "uid:<N>" for user N's,
  // "secret:<hash>" for the engines that give one namespace_secret.
  std::string scope;
  // The user registering it: owner of a "uid:" namespace, and charged for a new namespace of any
  // scope against max_namespaces_per_user.
  uint32_t uid = 0;
  bool shared = true;  // false only for a "uid:" scope
};

// The owner that pool_share_per_user counts a shared namespace's blocks under.
inline constexpr uint32_t kSharedOwner = 0xffffffffu;

struct NamespaceInfo {
  NamespaceId id = 0;
  tutti::v1::Namespace descriptor;
  std::string scope;       // NamespaceScope::scope
  uint32_t owner_uid = 0;  // the user who registered it (0 for namespaces older than owners)
  bool shared = true;
  uint32_t num_objects = 0;  // layers x parts
  uint32_t parts = 0;        // 2 (K and V) or 1 (MLA)
  uint32_t object_len = 0;   // bytes
  uint64_t blocks = 0;       // durable blocks on SSD
  uint64_t blocks_dram = 0;
  // Since start: as StoreStats' fields of the same names, for this namespace only.
  uint64_t lookup_hits = 0, lookup_misses = 0, blocks_retrieved = 0, dram_hits = 0;
};

// The scrub (BlockStore::Scrub, maintenance.cc): one block found bad, and the counts so far.
struct ScrubBadBlock {
  NamespaceId ns = 0;
  Key key;
  uint64_t slot = 0;
  std::string reason;  // "slot header ...", "object checksum mismatch", "I/O error", ...
};
struct ScrubProgress {
  uint64_t blocks_total = 0;    // blocks in the index when the scrub began
  uint64_t blocks_checked = 0;  // of those, checked so far (gone meanwhile counts as checked)
  uint64_t blocks_bad = 0;      // found bad and dropped from the index
  uint64_t bytes_read = 0;      // headers and objects read from the pool
  std::vector<ScrubBadBlock> bad;  // in a callback: found in the last batch; at the end: all
};
struct ScrubOptions {
  // Blocks read at a time (each batch waits for the previous one); capped so that one layer of
  // a batch fits retrieve staging. 0 is taken as 1.
  uint32_t batch_blocks = 8;
};

struct StoreStats {
  uint64_t slots_total = 0, slots_used = 0, slot_bytes = 0;
  uint64_t dram_capacity = 0, dram_used = 0;
  uint64_t lookups = 0, lookup_hits = 0, lookup_misses = 0;
  uint64_t lookup_blocks = 0;  // keys Lookups asked for (lookup_hits / lookup_blocks: hit ratio)
  uint64_t blocks_retrieved = 0, blocks_stored = 0, bytes_read = 0, bytes_written = 0;
  uint64_t evictions = 0, verify_errors = 0, io_errors = 0, store_rejected = 0, store_failed = 0;
  // Of store_rejected: blocks refused for their owner's cap (kRejectedOwnerLimit).
  uint64_t store_rejected_owner_limit = 0;
  // Of store_rejected: blocks refused for the write backlog's bounds (kRejectedBacklog).
  uint64_t store_rejected_backlog = 0;
  // Blocks refused by the writer for their owner's pool share (kRejectedShare), and blocks
  // evicted to keep an owner within it.
  uint64_t store_rejected_share = 0, share_evictions = 0;
  // New blocks of Stores the admission policy (StoreOptions::admission) admitted and declined
  // (kDeclined), since start. With "all" every new block is admitted.
  uint64_t blocks_admitted = 0, blocks_declined = 0;
  std::string admission;  // the policy's name (StoreOptions::admission)
  // "dram_front": declined blocks kept in the DRAM front; front blocks promoted to the SSD (by a
  // Lookup hit, or admitted again at an offer while kept); front blocks dropped (evicted from
  // DRAM before a second sight, or no DRAM chunk free for them); Lookup hits that found no
  // staging to promote their block (it stays in DRAM, promoted at a later sight). Since start.
  uint64_t front_kept = 0, front_promoted = 0, front_dropped = 0, front_promotions_deferred = 0;
  uint64_t front_blocks = 0;  // in the DRAM front now (kept and being promoted)
  // Namespaces dropped (empty ones, to make room for a new one) and removed (RemoveNamespace).
  uint64_t namespaces_dropped = 0, namespaces_removed = 0;
  // The write backlog now (see StoreOptions::max_write_backlog_bytes): its staging bytes, its
  // blocks, and how long its oldest block has waited (0 when empty).
  uint64_t write_backlog_bytes = 0, write_backlog_blocks = 0, write_backlog_age_ms = 0;
  // The per-device I/O scheduler's counters (reads and writes posted, emitted, write waits).
  datapath::IoSchedulerStats io;
  // Partial blocks dropped: expired (pending_ttl_ms); or their owner gone (DropPending) or the
  // copy of the call that made them failed.
  uint64_t pending_expired = 0, pending_dropped = 0;
  // Store staging in bytes: in use now, and the whole.
  uint64_t store_staging_used = 0, store_staging_bytes = 0;
  uint64_t dram_hits = 0;
  // Pool reads of Retrieves: I/Os posted, the bytes they asked for, the objects they carried
  // (read_objects / read_ios: objects merged per I/O), those carrying more than one object, and
  // Reads that waited for retrieve staging.
  uint64_t read_ios = 0, read_io_bytes = 0, read_objects = 0, read_merged_ios = 0;
  uint64_t read_staging_waits = 0;
  uint64_t read_staging_yields = 0;
  // The threads leading reads: seconds waiting for layers' reads and checks, seconds handing
  // layers to the engine, and the layers handed (datapath::ReadCountersSnapshot).
  double read_lead_wait_seconds = 0, read_lead_sink_seconds = 0, read_lead_post_seconds = 0;
  uint64_t read_layers = 0;
  uint64_t read_calls = 0;  // Retrieves' layer-wise reads, and their seconds from entry to return
  double read_call_seconds = 0;
  // Their batches of reads (one device each), and the seconds summed per phase: waiting for a
  // bounce slot, reading (the scheduler's queue and the device), checking (the verifier).
  uint64_t read_batches = 0;
  double read_batch_slot_seconds = 0, read_batch_io_seconds = 0, read_batch_check_seconds = 0;
  double read_batch_release_seconds = 0;  // of read_batch_check_seconds: until the slot went back
  // The write pipeline's batches, and their seconds summed per phase: slots and checksums
  // (prepare), from posting to the committer taking them (writes, and waiting behind older
  // batches), and the pool syncs and journal of the commits they were part of (once per commit).
  // Of prepare: the slots (evicted blocks' Deletes made durable included) and the checksums
  // (promoted blocks' copies included, on the checksum pool).
  uint64_t write_batches = 0;
  double write_prepare_seconds = 0, write_io_seconds = 0, write_commit_seconds = 0;
  // Commits (CommitBatches calls that committed one or more batches), and of
  // write_commit_seconds their pool syncs.
  uint64_t write_commits = 0;
  double write_commit_sync_seconds = 0;
  double write_slot_seconds = 0, write_checksum_seconds = 0;
  // Objects of written blocks whose checksum came with their gather (SetGatherChecksums) and
  // those the writer computed (on the checksum pool).
  uint64_t write_objects_summed_at_gather = 0, write_objects_summed_by_writer = 0;
  // Store calls answered (a failed gather not counted) and their seconds summed: entry until
  // captured (a wait_durable wait not included); of them, waiting for staging room, and the gather.
  uint64_t captures = 0;
  double capture_seconds = 0, capture_wait_seconds = 0, capture_gather_seconds = 0;
  uint64_t checkpoint_failures = 0;  // attempts that failed since start
  // Used slot headers found at start among the first slots of a pool whose
  // journal recovered no block: blocks the index cannot find (the state
  // directory was lost or replaced). 0 when the index was not empty.
  uint64_t unindexed_slot_headers = 0;
  // True once the journal file or the state directory was found removed or
  // replaced: nothing is durable any more; `durability_error` says what
  // happened. Stays true until restart.
  bool durability_lost = false;
  std::string durability_error;
  std::vector<NamespaceInfo> namespaces;
};

class BlockStore;

// Keeps a namespace from being dropped as empty (or removed) between RegisterNamespace and the
// session that will use it being counted by the NamespaceSessions the store is given: hold it
// until that session is open (or its opening failed). Movable; must not outlive the store.
class NamespaceClaim {
 public:
  NamespaceClaim(NamespaceClaim&& other) noexcept
      : store_(std::exchange(other.store_, nullptr)), id_(other.id_) {}
  NamespaceClaim& operator=(NamespaceClaim&&) = delete;
  NamespaceClaim(const NamespaceClaim&) = delete;
  ~NamespaceClaim();
  NamespaceId id() const { return id_; }

 private:
  friend class BlockStore;
  NamespaceClaim(BlockStore* store, NamespaceId id) : store_(store), id_(id) {}
  BlockStore* store_;
  NamespaceId id_;
};

// Sessions attached to each namespace now, as the server counts them (namespaces not listed
// have none). Called by the store with its namespace lock held and no other: it must not call
// back into the store.
using NamespaceSessions = std::function<absl::flat_hash_map<NamespaceId, uint32_t>()>;

// What RemoveNamespace did.
struct RemovedNamespace {
  uint64_t evicted = 0;
};

class BlockStore final : public datapath::RetrieveStore {
 public:
  // Takes options.state_dir's lock, recovers the index from its journal and
  // checkpoint, and starts the writer threads. The pool is not read to check the
  // index (every read verifies instead), except when the index comes back
  // empty: then the headers of the pool's first slots are counted, and used ones
  // are reported (a warning, and StoreStats::unindexed_slot_headers). `backend`
  // must have layout.num_files() files of layout.file_bytes(). `clock` must
  // outlive the store. Errors: INVALID_ARGUMENT for a null backend or clock, or
  // options that do not fit the backend, a pending_ttl_ms or max_write_backlog_age_ms <= 0
  // or a zero write cap; FAILED_PRECONDITION if state_dir is
  // missing or held by another store (the message names the holder's pid);
  // DATA_LOSS for a corrupt checkpoint or a missing journal file;
  // RESOURCE_EXHAUSTED if staging cannot be mapped; INTERNAL for a failed
  // system call.
  static absl::StatusOr<std::unique_ptr<BlockStore>> Open(const StoreOptions& options,
                                                          std::unique_ptr<io::IoBackend> backend,
                                                          Clock* clock);
  // Writes every fully captured block (partial captures are dropped),
  // checkpoints, stops the writer and releases the state directory's lock.
  ~BlockStore() override;

  // Validates `ns` and checks that this pool can hold its blocks, registering
  // nothing: FAILED_PRECONDITION if its objects are larger than the pool's
  // object_bytes or more than max_objects per block; INVALID_ARGUMENT for a
  // layout with a zero field, an overflowing size or an unknown format.
  absl::StatusOr<NamespaceInfo> CheckNamespace(const tutti::v1::Namespace& ns) const;
  // Returns the id of `ns`, registering (and journaling) it on first sight, shared by every user
  // (scope "", uid 0: as before namespaces had owners; tests and tools). CheckNamespace's errors;
  // RESOURCE_EXHAUSTED when max_namespaces are kept already and none is empty (with no session
  // known, an empty one is dropped); the journal's error if its record cannot be made durable
  // (FAILED_PRECONDITION once durability is lost). Waits for a running
  // checkpoint, never for the writer's pool writes or syncs.
  absl::StatusOr<NamespaceId> RegisterNamespace(const tutti::v1::Namespace& ns);
  // The same for a namespace of `scope` (its id mixes scope.scope in) and a claim on it (see
  // NamespaceClaim). A new namespace needs room: when scope.uid already registered
  // max_namespaces_per_user, or the store keeps max_namespaces, one namespace that holds no
  // blocks (none written or being written), has no sessions (by `sessions`) and no claim is
  // dropped first (a journaled drop, so a restart does not bring it back): the user's own least
  // recently registered such one, or for the global bound anyone's. RESOURCE_EXHAUSTED naming
  // limits.max_namespaces_per_user or limits.max_namespaces when none can be dropped.
  absl::StatusOr<NamespaceClaim> RegisterNamespace(const tutti::v1::Namespace& ns,
                                                   const NamespaceScope& scope,
                                                   const NamespaceSessions& sessions);
  // NOT_FOUND for an unknown id.
  absl::StatusOr<NamespaceInfo> GetNamespace(NamespaceId id) const;
  // Evicts every block of namespace `id` and forgets it (a journaled drop): its place in
  // max_namespaces and its user's max_namespaces_per_user is free again, and a later
  // RegisterNamespace of it starts empty. NOT_FOUND for an unknown id; FAILED_PRECONDITION,
  // removing nothing but the unpinned blocks, while `sessions` counts sessions on it, it is
  // claimed, some of its blocks are pinned or being written (the message says which: retry once
  // they end); the journal's error if the drop cannot be made durable.
  absl::StatusOr<RemovedNamespace> RemoveNamespace(NamespaceId id,
                                                   const NamespaceSessions& sessions);

  // Returns how many leading `keys` are present (durable, or with "dram_front" kept in the DRAM
  // front), and pins those: a pinned block is never evicted or overwritten. A hit on a block of
  // the DRAM front is its second sight: it is queued for the SSD (promoted), and stays readable
  // from DRAM until it is durable. Each pin must be dropped by
  // one Unpin of the same key. Pins count per key: a pin outlives its block
  // leaving the index after a failed read, and that block's slot is reused only
  // once every pin of the key is dropped. With `in_dram`, it is replaced by one
  // flag per hit: whether that block is in the DRAM tier now (else a read goes
  // to the SSD).
  uint32_t LookupAndPin(NamespaceId ns, absl::Span<const Key> keys,
                        std::vector<bool>* in_dram = nullptr);
  void Unpin(NamespaceId ns, absl::Span<const Key> keys);

  // --- Retrieves: the store side of datapath::RunRetrieve (retrieve_transfer.h). ---
  //
  // The prepare step: checks `request` and gathers the sources of its layers
  // [layer_begin, layer_end) of pinned `keys` (under the store's lock): each block's slot and
  // checksums from the index, or its DRAM copy (DRAM tier or DRAM front), held by the returned
  // read until it is destroyed. A pinned key whose block left the index since it was pinned, or
  // whose entry does not fit its namespace, is a kFailed source (reported failed in the first
  // layer). The returned read's Finish is the finish step: items that failed (I/O error, short
  // read, or an object whose checksum, seeded by namespace, key and epoch, does not match) are
  // counted, logged and leave the index (a journaled Delete: a later Lookup misses); served blocks
  // are counted (stats, per namespace); a read that succeeded is measured (read_bandwidth()).
  // Preconditions: keys pinned by the caller for as long as the read lives; the returned read
  // does not outlive the store. Errors (nothing held): NOT_FOUND unknown namespace,
  // FAILED_PRECONDITION key not pinned, INVALID_ARGUMENT layer range not within
  // [0, layers of `ns`) or not increasing, or engine_blocks neither empty nor one per key.
  absl::StatusOr<std::unique_ptr<datapath::PreparedRead>> PrepareRead(
      const datapath::RetrieveRequest& request) override;

  // The reader of Retrieves (and of Scrub): plans, posts and checks every layer-wise read of this
  // store. Owned by the store, stable until StageReadsOnGpu; it leases the store's retrieve
  // staging (retrieve_staging_region(), limits.retrieve_staging_bytes), checks with the read
  // verifier (SetReadVerifier) and posts its reads into the store's per-device I/O scheduler,
  // ahead of writes. `into_gpu_memory`: the reader of Retrieves into GPU memory, which stages
  // layers on the GPU after StageReadsOnGpu (the other one otherwise). Thread-safe
  // (LayerReader::Read may run on many threads at once).
  datapath::LayerReader* reader(bool into_gpu_memory = false) const;

  // A convenience for callers without an engine sink (tests, tools): datapath::ReadPrepared over
  // this store and reader(), that is PrepareRead, LayerReader::Read with `sink`, then Finish. Calls
  // `sink` once per layer, in layer order, with that layer's objects of every item not failed so
  // far, as copies into engine block engine_blocks[i] of key i (block i when `engine_blocks` is
  // empty), and the items that failed in this layer (never passed to the sink again). The copies'
  // sources are valid during the call (longer where LayerObjects::stays says so). A sink error
  // stops the read and is returned. Errors: PrepareRead's, or RESOURCE_EXHAUSTED if one layer of
  // the read needs more staging than retrieve_staging_bytes holds.
  using LayerSink = datapath::LayerReader::Sink;
  absl::Status Read(NamespaceId ns, absl::Span<const Key> keys, uint32_t layer_begin,
                    uint32_t layer_end, const LayerSink& sink,
                    absl::Span<const uint32_t> engine_blocks = {});

  // Captures layers [layer_begin, layer_end) of each key for `owner` (a
  // session id; 0: no owner, not capped): reserves staging (a block's first
  // call takes staging for the whole block, charged to that call's owner),
  // calls `gather` once with every object to copy (engine copies out of engine block
  // engine_blocks[i] of key i, or block i when `engine_blocks` is empty, into store staging),
  // and returns one outcome per key. A key's block is queued for writing once all its layers are
  // captured (over one or more calls); a partial block whose last layer came more than
  // StoreOptions::pending_ttl_ms ago is dropped. Blocks refused staging are
  // kRejectedFull or kRejectedOwnerLimit (which limit); new blocks while the
  // write backlog is past its bounds are kRejectedBacklog (Capture never waits
  // for the writer to refuse or accept). With wait_durable,
  // returns after the queued blocks are durable (kDurable) or failed
  // (kFailed); blocks kept in the DRAM front (kInDram: "dram_front" at a first sight) are
  // answered at once, never kDurable. With a `staging_wait` > 0, a call with new blocks and no room for one of them in
  // the free staging (or the owner's share) first waits up to that long for room (writes
  // completing free it), then goes on as without (blocks that do not fit are refused). A gather
  // error fails the whole call (nothing queued). Errors: NOT_FOUND unknown namespace,
  // INVALID_ARGUMENT bad layer range or engine_blocks' count, or the gatherer's.
  using Gatherer = std::function<absl::Status(absl::Span<const engine::CopyOp> ops)>;
  absl::StatusOr<std::vector<CaptureOutcome>> Capture(
      NamespaceId ns, absl::Span<const Key> keys, uint32_t layer_begin, uint32_t layer_end,
      const Gatherer& gather, bool wait_durable, uint64_t owner = 0,
      absl::Duration staging_wait = absl::ZeroDuration(),
      absl::Span<const uint32_t> engine_blocks = {});

  // Drops every partially captured block of `owner` (> 0) and frees its
  // staging: for a session that went away. Blocks a Capture is copying into now
  // are dropped when that call ends; blocks already queued for writing are
  // written. Returns how many blocks were dropped or marked.
  uint64_t DropPending(uint64_t owner);

  // Returns once every block queued so far (all its layers captured) is durable
  // or failed, and the writer is idle (a checkpoint it started is done). For
  // shutdown and tests.
  void Flush();
  // Flush with a deadline: true once the write backlog is empty and the writer idle, false if
  // `timeout` passed first (blocks keep being written).
  bool FlushFor(absl::Duration timeout);

  // Checks every block in the index (maintenance.cc): reads its slot header and every object
  // from the SSD through the I/O scheduler as Reads do (the DRAM copy is not used), compares the
  // header with the index and each object with its checksum, and drops bad blocks as a failed
  // Read does (journaled Delete; counted in verify_errors or io_errors; Lookup then misses).
  // Blocks stored after the scrub began are not checked. Calls `progress` (may be empty) on the
  // caller's thread after each batch; returning false stops the scrub: CANCELLED. Returns the
  // totals, with every bad block. Thread-safe; runs alongside engines' traffic.
  using ScrubCallback = std::function<bool(const ScrubProgress&)>;
  absl::StatusOr<ScrubProgress> Scrub(const ScrubOptions& options, const ScrubCallback& progress);

  // Evicts every unpinned block of `ns` (0: of every namespace). Returns
  // evicted and skipped (pinned) counts. The slots are reused once the Deletes
  // are durable; if the journal cannot sync them, they stay unused until
  // restart. Waits for a journal sync at most, never for the writer's pool
  // writes or syncs.
  std::pair<uint64_t, uint64_t> Evict(NamespaceId ns);

  StoreStats Stats() const;

  // Replaces StoreOptions::max_write_backlog_bytes and max_write_backlog_age_ms (a config
  // reload); the next Capture uses them. INVALID_ARGUMENT (nothing changed) for max_age_ms <= 0.
  // Thread-safe.
  absl::Status SetWriteBacklogBounds(uint64_t max_bytes, int64_t max_age_ms);

  // The pinned-memory candidates: staging the I/O backend reads into and writes
  // from. Stable for the store's life. A GPU device registers it for mapped
  // access.
  absl::Span<uint8_t> staging_region() const;
  // The part of staging_region() that Retrieves read into (limits.retrieve_staging_bytes).
  absl::Span<uint8_t> retrieve_staging_region() const;
  // The DRAM tier's memory (empty when the tier is off): the source of DRAM-tier hits, handed to
  // LayerSink. Stable for the store's life; a GPU daemon registers it like staging_region().
  absl::Span<uint8_t> dram_region() const;
  // The CPU checker of Reads and Stores (on datapath.checksum_threads), stable for the store's
  // life: the fallback of a GPU verifier.
  datapath::Verifier* cpu_verifier() const;
  // Checks Reads' objects with `v` from now on (nullptr: the CPU checker again). Call while no
  // Read is in progress (start-up, shutdown); `v` must outlive its use.
  void SetReadVerifier(datapath::Verifier* v);
  // With `on`, Capture asks its gatherer for each new object's checksum (engine::CopyOp::sum,
  // seeded by the block's epoch, which the block takes at its first Capture call): a GPU engine
  // memory computes them with the gather (daemon/gpu/layer_copier.h), and the writer then
  // checksums only the objects whose checksum did not come so (host-mode engines, lengths the
  // hash kernel does not support, a hash that failed, a block two Capture calls copied into at
  // once, promoted DRAM-front blocks). Off (the default): the writer checksums every object.
  // datapath.store_checksums; set at start-up, before engines attach.
  void SetGatherChecksums(bool on);
  // Stages the layers of Retrieves into GPU memory (reader(true)) in `device` (GPU memory, at
  // least retrieve_staging_region()'s size) from now on: reads land in `depth` bounce slots per
  // pool file carved from the start of the retrieve staging, and `placing` (a verifier that
  // places, daemon/gpu/gpu_verifier.h) copies each object to its place in the layer and checks it
  // there (datapath/layer_reader.h). Retrieves into host memory and Scrub keep the rest of the
  // retrieve staging, checked by `placing` too. An empty `device` goes back to host staging and the
  // CPU checker. Call while no Read is in progress (start-up, shutdown);
  // `device` and `placing` must outlive their use. INVALID_ARGUMENT when the sizes do not fit.
  absl::Status StageReadsOnGpu(absl::Span<uint8_t> device, datapath::Verifier* placing,
                               uint32_t depth);
  // What Reads measured: bytes per second delivered to the sink from each tier.
  const datapath::BandwidthMeter& read_bandwidth() const;

  // The pool's block events, per namespace, stable for the store's life. kStored when a block's
  // Put is durable and it becomes visible to LookupAndPin (not at Capture; never for a key already
  // present); kRemoved when it leaves the index (LRU eviction by the writer, Evict, retirement
  // after a failed Read or Scrub). The DRAM tier has none of its own. blocks_lost_at_start: the
  // blocks recovery knew of and did not keep (Put records it skipped, or with an empty index the
  // used slot headers it found, as StoreStats::unindexed_slot_headers); recovered blocks give no
  // event.
  EventHub& events() const;

  class Impl;

 private:
  explicit BlockStore(std::unique_ptr<Impl> impl);
  friend class NamespaceClaim;
  void EndClaim(NamespaceId id);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_BLOCK_STORE_H_

// Private to daemon/store: the state behind BlockStore.
//
// Lock order: ns_mu_, then checkpoint_mu_, then the journal's Sync lock (inside Journal::Sync
// and Checkpoint), then mu_, then the journal's append lock (inside
// Journal::Append). So: Journal::Append may be called with mu_ held; Journal::Sync
// and WriteCheckpoint never are. No lock is held across a pool write or a pool
// file's sync.
//
// Durability rules the writer, Evict and RegisterNamespace keep without a common
// lock: a Put is appended only after its block's data and header are synced, and
// the block is published (made visible) only after the Sync covering the Put
// returns OK; a slot is rewritten only after the Delete of its previous block is
// durable; a namespace record and the namespace's entry in namespaces_ are atomic
// with respect to a checkpoint (checkpoint_mu_), and every other record is
// appended after its effect on the index (a Delete) or before a checkpoint on the
// same thread (the writer's Puts), so a checkpoint never drops a record whose
// effect it does not hold.
#ifndef TUTTI_DAEMON_STORE_BLOCK_STORE_IMPL_H_
#define TUTTI_DAEMON_STORE_BLOCK_STORE_IMPL_H_

#include <deque>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "daemon/datapath/layer_reader.h"
#include "daemon/datapath/staging_lease.h"
#include "daemon/datapath/verifier.h"
#include "daemon/datapath/work_pool.h"
#include "daemon/store/block_store.h"
#include "daemon/store/dram_tier.h"
#include "daemon/store/index.h"
#include "daemon/store/journal.h"
#include "daemon/store/staging.h"

namespace tutti::store {

// The result of one captured block, shared with a Capture call waiting for
// durability.
struct DurableTicket {
  bool done = false;
  CaptureOutcome outcome = CaptureOutcome::kCaptured;
};

// A block being captured or waiting for the writer. Owned by Impl::pending_.
struct PendingBlock {
  NamespaceId ns = 0;
  Key key;
  uint32_t object_len = 0;
  uint32_t parts = 0;
  // Staging for the whole block: one run of num_objects frames of frame_bytes
  // (the object size rounded up to 4 KiB) from store staging, charged to
  // `owner`, laid out file-major so each pool file's share of the slot is
  // contiguous (see StagingObjects).
  uint64_t owner = 0;
  uint8_t* chunk = nullptr;
  uint64_t chunk_bytes = 0;
  uint32_t frame_bytes = 0;
  std::vector<uint8_t*> frames;         // per object: its frame inside `chunk`
  std::vector<uint8_t> layer_captured;  // per layer
  uint32_t layers_left = 0;
  int64_t touched_ms = 0;  // created, or its last layers captured: the pending TTL runs from here
  bool queued = false;
  int64_t queued_ms = 0;  // when queued: its wait in the write backlog runs from here
  bool abandoned = false;  // DropPending while a Capture copied into it: dropped when that ends
  int capturing = 0;       // Capture calls copying into `frames` now
  std::vector<std::shared_ptr<DurableTicket>> tickets;
  // Set by the writer.
  uint64_t slot = 0;
  uint64_t epoch = 0;
  bool has_slot = false;
  bool ok = false;
  bool over_share = false;  // refused: its owner is past pool_share_per_user (kRejectedShare)
  std::vector<uint64_t> checksums;
};

class BlockStore::Impl {
 public:
  Impl(const StoreOptions& options, std::unique_ptr<io::IoBackend> backend, Clock* clock);
  ~Impl();

  absl::Status Init();  // staging, recovery, writer thread

  absl::StatusOr<NamespaceInfo> CheckNamespace(const tutti::v1::Namespace& ns) const;
  // namespaces.cc
  absl::StatusOr<NamespaceId> RegisterNamespace(const tutti::v1::Namespace& ns,
                                                const NamespaceScope& scope,
                                                const NamespaceSessions& sessions);
  absl::StatusOr<RemovedNamespace> RemoveNamespace(NamespaceId id,
                                                   const NamespaceSessions& sessions);
  void EndClaim(NamespaceId id);
  absl::StatusOr<NamespaceInfo> GetNamespace(NamespaceId id) const;
  uint32_t LookupAndPin(NamespaceId ns, absl::Span<const Key> keys, std::vector<bool>* in_dram);
  void Unpin(NamespaceId ns, absl::Span<const Key> keys);
  absl::Status Read(NamespaceId ns, absl::Span<const Key> keys, uint32_t layer_begin,
                    uint32_t layer_end, const LayerSink& sink);
  absl::StatusOr<std::vector<CaptureOutcome>> Capture(NamespaceId ns, absl::Span<const Key> keys,
                                                      uint32_t layer_begin, uint32_t layer_end,
                                                      const Gatherer& gather, bool wait_durable,
                                                      uint64_t owner);
  uint64_t DropPending(uint64_t owner);
  void Flush();
  // maintenance.cc
  bool FlushFor(absl::Duration timeout);
  absl::StatusOr<ScrubProgress> Scrub(const ScrubOptions& options, const ScrubCallback& progress);
  std::pair<uint64_t, uint64_t> Evict(NamespaceId ns);
  StoreStats Stats() const;
  absl::Status SetWriteBacklogBounds(uint64_t max_bytes, int64_t max_age_ms);
  absl::Span<uint8_t> staging_region() const { return region_->span(); }
  absl::Span<uint8_t> dram_region() const {
    return dram_region_ == nullptr ? absl::Span<uint8_t>() : dram_region_->span();
  }
  const datapath::BandwidthMeter& read_bandwidth() const { return read_bandwidth_; }
  EventHub& events() { return events_; }

 private:
  using PendingKey = std::pair<NamespaceId, Key>;
  struct ReadItem;

  // A block whose read failed, taken out of the index (Lookup misses, Capture
  // stores it again) while its slot waits: it is released once its Delete is
  // durable and no pin of its key is left (pins are per key: those taken before
  // the failure stay counted in `pins` and are dropped first by Unpin).
  struct RetiredSlot {
    uint64_t slot = 0;
    uint64_t epoch = 0;
    bool delete_durable = false;
  };
  struct RetiredKey {
    uint32_t pins = 0;
    std::vector<RetiredSlot> slots;
  };

  // namespaces.cc
  // Makes room for a new namespace of user `uid` (max_namespaces_per_user, max_namespaces) by
  // dropping an empty one; RESOURCE_EXHAUSTED naming the limit when none can be.
  absl::Status MakeRoomFor(uint32_t uid, const NamespaceSessions& sessions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_mu_);
  // The namespaces with blocks pending or retired, or claimed: not idle, whatever their count.
  absl::flat_hash_set<NamespaceId> NamespacesBusy() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RemoveNamespace's checks: NOT_FOUND, or FAILED_PRECONDITION while claimed or with sessions.
  absl::Status CheckRemovable(NamespaceId id, const NamespaceSessions& sessions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ns_mu_);
  // Hides every block of `id` (their slots appended to *slots, to be released once the returned
  // drop record is durable) and drops it; FAILED_PRECONDITION, changing nothing, while some of
  // its blocks are pinned or being written.
  absl::StatusOr<uint64_t> EvictAndDropLocked(NamespaceId id, std::vector<uint64_t>* slots)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases namespace `id` (whose blocks are gone) and appends its drop record; returns the
  // record's sequence number. Callers hold checkpoint_mu_ (shared) until it is synced.
  uint64_t DropNamespaceLocked(NamespaceId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The owner pool_share_per_user counts namespace `info`'s blocks under.
  static uint32_t ShareOwner(const NamespaceInfo& info) {
    return info.shared ? kSharedOwner : info.owner_uid;
  }
  // block_writer.cc: the slots wanted by `wanting`, past the owners' pool shares: evicts each
  // over-share block's owner's own least recently used block (its slot appended to *slots), or
  // marks the block over_share. Returns the journal sequence number of the last Delete (0: none).
  uint64_t EvictForShares(absl::Span<PendingBlock* const> wanting, std::vector<uint64_t>* slots,
                          std::vector<uint64_t>* victim_slots) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // block_writer.cc
  absl::Status Recover();
  // Counts the slot headers among the first slots of the pool that decode: the
  // blocks a pool holds that an empty index cannot find.
  uint64_t CountUsedSlotHeaders(uint64_t max_slots);
  // Recovery: the recovered blocks of namespaces that were not recovered (their record could not
  // be read), which no Lookup can reach.
  uint64_t CountUnknownNamespaceBlocks() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriterLoop();
  void WriteBatch(std::vector<PendingBlock*> batch);
  // Gives each block of `batch` a slot (consecutive slots in batch order where the free slots
  // allow), evicting where the pool is full; `victim_slots` gets the
  // slots whose Delete records must be durable before they are rewritten.
  // Returns the journal sequence number of the last Delete appended (0: none).
  uint64_t AssignSlots(absl::Span<PendingBlock* const> batch, std::vector<uint64_t>* victim_slots);
  void WriteObjects(absl::Span<PendingBlock* const> batch);
  void AppendBlockWrites(const PendingBlock& p, uint8_t* header,
                         std::vector<io::IoRequest>* reqs) const;
  absl::Status CommitToJournal(absl::Span<PendingBlock* const> batch);
  std::vector<uint8_t*> CopyToDram(absl::Span<PendingBlock* const> batch);
  void Publish(absl::Span<PendingBlock* const> batch);
  // Writer thread only: checkpoints when checkpoint_every records are in the
  // journal, and after a failure not before the back-off has passed.
  void MaybeCheckpoint();
  absl::Status WriteCheckpoint() ABSL_LOCKS_EXCLUDED(checkpoint_mu_, mu_);
  // Drops partial blocks past the pending TTL and abandoned ones nobody copies into.
  void ReapStalePending();
  void ReapStalePendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `p`'s staging back and erases it from pending_ (destroys *p).
  void ReleasePending(PendingBlock* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the abandoned blocks of `touched` that no Capture copies into any more.
  void ReleaseAbandoned(absl::Span<PendingBlock* const> touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hides `e` and appends its Delete record; returns the record's sequence
  // number. The slot stays taken until the record is durable.
  uint64_t HideForEviction(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishPending(PendingBlock* p, CaptureOutcome outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // maintenance.cc: one scrub batch of blocks of `ns` (key and epoch), counted into *progress.
  struct ScrubTarget;
  absl::Status ScrubBatch(NamespaceId ns, absl::Span<const ScrubTarget> batch,
                          ScrubProgress* progress);
  // Reads the slot headers of `sources` (kSsd ones) through the scheduler and compares each with
  // its index entry; returns one reason per source ("" if the header matches).
  std::vector<std::string> CheckHeaders(NamespaceId ns, const NamespaceInfo& info,
                                        absl::Span<const datapath::ReadSource> sources);

  // block_store.cc
  // Under mu_: finds each pinned key's block and where its bytes come from (`sources`); counts
  // in *unfit the entries that do not fit their namespace. FAILED_PRECONDITION for a key not
  // pinned.
  absl::Status GatherReadItems(NamespaceId ns, const NamespaceInfo& info,
                               absl::Span<const Key> keys, std::vector<ReadItem>* items,
                               std::vector<datapath::ReadSource>* sources, uint64_t* unfit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a Read: retires the failed blocks, records the bandwidth sample and counts stats.
  void FinishRead(NamespaceId ns, const NamespaceInfo& info, uint32_t nlayers,
                  absl::Span<const ReadItem> items, const datapath::LayerReadResult& result,
                  uint64_t unfit);
  // Takes the blocks of `failed` (key and epoch, in namespace `ns`) out of the
  // index after a failed read: journals their Deletes (one sync for all), moves
  // their keys' pins to retired_, and frees each slot once that is safe (see
  // RetiredSlot). Skips a key that now names another block.
  struct FailedBlock {
    Key key;
    uint64_t epoch = 0;
  };
  void RetireFailedBlocks(NamespaceId ns, absl::Span<const FailedBlock> failed);
  // Releases the retired slots of `key` whose Delete is durable, if no pin of
  // the key is left.
  void MaybeReleaseRetired(const PendingKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The frame of each object in a block's staging chunk of num_objects frames
  // of `frame_bytes`: file-major, the objects j = r, r + D, r + 2D, ... (those
  // one pool file holds) consecutive, file share r after share r - 1. In the
  // pool file (format 2) those objects are D x G frames apart, so they share one
  // write only with G = 1 and D = 1 (see AppendBlockWrites).
  std::vector<uint8_t*> StagingObjects(uint8_t* chunk, uint32_t num_objects,
                                       uint32_t frame_bytes) const;
  // Takes staging for a new pending block of `info` for `owner`; on refusal
  // (after one reap of stale blocks per call, *reaped tracks it), or while the
  // write backlog is past a bound (BacklogFull), returns null and sets *outcome.
  uint8_t* TakeBlockStaging(const NamespaceInfo& info, uint64_t owner, bool* reaped,
                            CaptureOutcome* outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The write backlog (StoreOptions::max_write_backlog_bytes): true while it is past a bound, so
  // new blocks are refused.
  bool BacklogFull() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `p` (fully captured) for the writer; it is in the backlog until ReleasePending.
  void QueueForWriter(PendingBlock* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StoreOptions options_;
  const std::unique_ptr<io::IoBackend> backend_;
  Clock* const clock_;
  // Pool reads and writes go through the scheduler (reads first), into backend_; syncs go to
  // backend_ directly. Made by Init.
  std::unique_ptr<datapath::IoSink> io_sink_;
  std::unique_ptr<datapath::IoScheduler> scheduler_;
  std::unique_ptr<Region> region_;
  std::unique_ptr<StoreStaging> store_staging_;
  // Object checksums off the transfer's own thread: reads' verification and writes' checksums
  // (options_.checksum_threads; none: inline).
  std::unique_ptr<datapath::WorkPool> checksum_pool_;
  std::unique_ptr<datapath::Verifier> verifier_;  // reads' checks, on checksum_pool_
  // Retrieve staging, leased per layer by reader_ (which plans, posts and checks every Read).
  std::unique_ptr<datapath::StagingPool> read_staging_;
  std::unique_ptr<datapath::LayerReader> reader_;
  uint8_t* header_buffers_ = nullptr;  // write_batch_blocks x 4 KiB, writer-owned

  // Set by Recover before the writer starts; thread-safe itself.
  std::unique_ptr<Journal> journal_;
  // Held by RegisterNamespace and RemoveNamespace throughout: one namespace change at a time, and
  // no claim is taken while one decides what is empty.
  absl::Mutex ns_mu_;
  // Shared by RegisterNamespace (from its record's append to its entry in
  // namespaces_) and namespace drops, exclusive for a checkpoint.
  absl::Mutex checkpoint_mu_;
  // Writer thread only (and the destructor, after it stopped).
  int64_t checkpoint_retry_ms_ = 0;   // no checkpoint attempt before this time
  uint32_t checkpoint_failed_in_row_ = 0;

  mutable absl::Mutex mu_;
  Index index_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Region> dram_region_;
  std::unique_ptr<DramTier> dram_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NamespaceId, NamespaceInfo> namespaces_ ABSL_GUARDED_BY(mu_);
  // Claims (NamespaceClaim) per namespace; taken with ns_mu_ held too.
  absl::flat_hash_map<NamespaceId, uint32_t> claims_ ABSL_GUARDED_BY(mu_);
  // When each namespace was registered (or recovered), in order: the oldest idle one is dropped.
  absl::flat_hash_map<NamespaceId, uint64_t> registered_order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<PendingKey, std::unique_ptr<PendingBlock>> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PendingKey, RetiredKey> retired_ ABSL_GUARDED_BY(mu_);
  std::deque<PendingBlock*> write_queue_ ABSL_GUARDED_BY(mu_);
  // The write backlog: queued blocks (in write_queue_ or being written) until released.
  uint64_t backlog_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::multiset<int64_t> backlog_queued_ms_ ABSL_GUARDED_BY(mu_);  // each block's queued_ms
  // Its bounds: options_' at start, then SetWriteBacklogBounds' (a config reload).
  uint64_t max_backlog_bytes_ ABSL_GUARDED_BY(mu_) = options_.max_write_backlog_bytes;
  int64_t max_backlog_age_ms_ ABSL_GUARDED_BY(mu_) = options_.max_write_backlog_age_ms;
  int writing_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t last_reap_ms_ ABSL_GUARDED_BY(mu_) = 0;
  StoreStats stats_ ABSL_GUARDED_BY(mu_);
  datapath::BandwidthMeter read_bandwidth_;
  EventHub events_;  // thread-safe; its lock is a leaf (taken under mu_ by the hooks)
  std::thread writer_;
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_BLOCK_STORE_IMPL_H_

// Private to daemon/store: the state behind BlockStore, in three pieces over one lock (mu_):
//  - the catalog (catalog.cc, namespaces.cc): the index, the namespaces and their claims, pins and
//    retired slots: what the store holds and who holds it;
//  - reads and capture (block_store.cc, maintenance.cc): Retrieve and Scrub, staging, pending
//    blocks and the write backlog, the DRAM front;
//  - the writer (block_writer.cc, write_pipeline.cc): start-up, slots, the write pipeline's two
//    threads and checkpoints, and the journal's owner thread (journal_writer.h).
//
// Lock order: ns_mu_, then mu_, then journal_'s queue lock (a leaf). The journal has one owner,
// the writer's journal thread (journal_writer.h): every other thread queues its records
// (JournalWriter::Append, under mu_ or not) and waits for a sync or a checkpoint with no lock
// held but ns_mu_. No lock is held across a pool write or a pool file's sync.
//
// Durability rules: a Put is appended only after its block's data and header are synced, and
// the block is published (made visible) only after the Sync covering the Put returns OK; a slot
// is rewritten only after the Delete of its previous block is durable; a namespace record and
// the namespace's entry in namespaces_ are atomic with respect to a checkpoint (the entry is
// made by SyncAndApply on the journal thread, which checkpoints). Every other record is queued
// after its effect on the index (Deletes, drops) or before a checkpoint the same thread asks for
// (the committer's Puts), so a checkpoint never drops a record whose effect it does not hold.
#ifndef TUTTI_DAEMON_STORE_BLOCK_STORE_IMPL_H_
#define TUTTI_DAEMON_STORE_BLOCK_STORE_IMPL_H_

#include <atomic>
#include <deque>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/datapath/layer_reader.h"
#include "daemon/datapath/staging_lease.h"
#include "daemon/datapath/verifier.h"
#include "daemon/datapath/work_pool.h"
#include "daemon/datapath/write_transfer.h"
#include "daemon/store/admission.h"
#include "daemon/store/block_store.h"
#include "daemon/store/dram_front.h"
#include "daemon/store/dram_tier.h"
#include "daemon/store/index.h"
#include "daemon/store/journal.h"
#include "daemon/store/journal_writer.h"
#include "daemon/store/staging.h"

namespace tutti::store {

// At most this many threads sync pool files in parallel, besides the committer.
inline constexpr uint32_t kMaxSyncThreads = 15;

// The result of one captured block, shared with a Capture call waiting for
// durability.
struct DurableTicket {
  bool done = false;
  CaptureOutcome outcome = CaptureOutcome::kCaptured;
};

// A block being captured or waiting for the writer. Owned by Impl::pending_.
// The blocks one Capture call completed and queued, in the call's key (chain) order. With
// tail-first recency (StoreOptions::tail_first) Publish inserts them tail first; a call whose
// blocks span write batches re-uses its blocks published by earlier batches after each later
// one, so that the call's first block stays the most recent. Guarded by Impl::mu_.
struct QueuedCall {
  std::vector<Key> published;  // in key order
};

struct PendingBlock {
  NamespaceId ns = 0;
  Key key;
  uint32_t object_len = 0;
  uint32_t parts = 0;
  // Staging for the whole block: num_objects frames of frame_bytes (the object size rounded up
  // to 4 KiB, chunk_bytes in all) from store staging, charged to `owner` and given back frame by
  // frame (StoreStaging::GiveFrames): a run of its own, laid out file-major so each pool file's
  // share of the slot is contiguous (StagingObjects), or a lane of a run shared with the other
  // blocks one Capture call started, their objects interleaved (InterleavedFrames) so that object
  // j of blocks written to consecutive slots of one extent group is one write.
  uint64_t owner = 0;
  uint64_t chunk_bytes = 0;
  uint32_t frame_bytes = 0;
  std::vector<uint8_t*> frames;         // per object: its frame in store staging
  std::vector<uint8_t> layer_captured;  // per layer
  uint32_t layers_left = 0;
  int64_t touched_ms = 0;  // created, or its last layers captured: the pending TTL runs from here
  bool queued = false;
  int64_t queued_ms = 0;  // when queued: its wait in the write backlog runs from here
  bool abandoned = false;  // DropPending while a Capture copied into it: dropped when that ends
  int capturing = 0;       // Capture calls copying into `frames` now
  // The admission policy was asked (admission_): at creation by a Capture of all its layers,
  // else once its last layer is captured. `declined`: it said no; released by that Capture.
  bool admission_asked = false;
  bool declined = false;
  std::vector<std::shared_ptr<DurableTicket>> tickets;
  std::shared_ptr<QueuedCall> call;  // the Capture call that queued it (null: a promotion)
  // "dram_front": the block promotes a DRAM-front block of its key (front_), which leaves the
  // front when this one is published or fails (EndFrontPromotion). `promote_from`: the front's
  // copy, for a promotion by a Lookup hit (no engine copy): the writer fills `frames` from it.
  bool front = false;
  std::shared_ptr<const DramBlock> promote_from;
  // The write epoch, seeding the object checksums (pool::ObjectChecksumSeed): given from
  // next_epoch_ when the block is created (its first Capture call, or a promotion), before any
  // byte of it is gathered, so that its checksums can be computed as its objects are gathered
  // (on the GPU). Safe for recovery, which only compares epochs for equality (a Delete names the
  // epoch of the Put it removes; a read checks the epoch through the checksums) and starts the
  // counter past every epoch a Put it replays holds: what it needs is that no two blocks written
  // in one run share an epoch (each pending block is written at most once) and that no epoch
  // given after a restart is one a recovered Put holds. Epochs of blocks that are never written
  // (dropped, declined, failed) are simply not used, as the writer's were for blocks that found
  // no slot. A block created before another may now be written after it: nothing orders
  // blocks by epoch.
  uint64_t epoch = 0;
  // Set by the writer.
  uint64_t slot = 0;
  bool has_slot = false;
  bool ok = false;
  bool over_share = false;  // refused: its owner is past pool_share_per_user (kRejectedShare)
  // Per object. Checksums that came with the object's gather (SetGatherChecksums: computed on the
  // GPU over the engine's object as it was copied into `frames`) are set by Capture, with
  // `summed_at_gather` 1, under mu_ after the gather; the writer computes the rest. Should two
  // Capture calls copy into the block at once (they may copy the same layer, from different engine
  // blocks), which bytes land last is unknown: `gather_sums_usable` goes false and the writer
  // computes every checksum of the block from its frames.
  std::vector<uint64_t> checksums;
  std::vector<uint8_t> summed_at_gather;
  bool gather_sums_usable = true;
};

// A writer batch from its start until it is committed (write_pipeline.cc).
struct InFlightBatch {
  std::vector<PendingBlock*> blocks;
  // Its writes (block indices into `blocks`): posted by StartBatch, checked by CommitBatches.
  std::unique_ptr<datapath::WriteTransfer> transfer;
  bool written = false;          // guarded by Impl::mu_: every write of `transfer` completed
  uint8_t* headers = nullptr;    // its header set, until `written`
  bool durability_lost = false;  // failed whole at its start: the journal can make nothing durable
  // started; slots assigned (slotted); checksums done (summed); writes posted.
  absl::Time started, slotted, summed, posted;
};

class BlockStore::Impl {
 public:
  Impl(const StoreOptions& options, std::unique_ptr<io::IoBackend> backend, Clock* clock);
  ~Impl();

  absl::Status Init();  // staging, recovery, writer and committer threads

  // The catalog: namespaces.cc
  absl::StatusOr<NamespaceInfo> CheckNamespace(const tutti::v1::Namespace& ns) const;
  absl::StatusOr<NamespaceId> RegisterNamespace(const tutti::v1::Namespace& ns,
                                                const NamespaceScope& scope,
                                                const NamespaceSessions& sessions);
  absl::StatusOr<RemovedNamespace> RemoveNamespace(NamespaceId id,
                                                   const NamespaceSessions& sessions);
  void EndClaim(NamespaceId id);
  absl::StatusOr<NamespaceInfo> GetNamespace(NamespaceId id) const;
  // The catalog: catalog.cc
  uint32_t LookupAndPin(NamespaceId ns, absl::Span<const Key> keys, std::vector<bool>* in_dram);
  void Unpin(NamespaceId ns, absl::Span<const Key> keys);
  std::pair<uint64_t, uint64_t> Evict(NamespaceId ns);
  // Reads and capture: block_store.cc
  absl::StatusOr<std::unique_ptr<datapath::PreparedRead>> PrepareRead(
      const datapath::RetrieveRequest& request);
  datapath::LayerReader* reader(bool into_gpu_memory = false) const {
    return into_gpu_memory && gpu_reader_ != nullptr ? gpu_reader_.get() : reader_.get();
  }
  absl::StatusOr<std::vector<CaptureOutcome>> Capture(NamespaceId ns, absl::Span<const Key> keys,
                                                      uint32_t layer_begin, uint32_t layer_end,
                                                      const Gatherer& gather, bool wait_durable,
                                                      uint64_t owner, absl::Duration staging_wait,
                                                      absl::Span<const uint32_t> engine_blocks);
  uint64_t DropPending(uint64_t owner);
  void Flush();
  // maintenance.cc
  bool FlushFor(absl::Duration timeout);
  absl::StatusOr<ScrubProgress> Scrub(const ScrubOptions& options, const ScrubCallback& progress);
  // block_store.cc
  StoreStats Stats() const;
  absl::Status SetWriteBacklogBounds(uint64_t max_bytes, int64_t max_age_ms);
  absl::Span<uint8_t> staging_region() const { return region_->span(); }
  absl::Span<uint8_t> retrieve_staging_region() const { return read_region_; }
  absl::Span<uint8_t> dram_region() const {
    return dram_region_ == nullptr ? absl::Span<uint8_t>() : dram_region_->span();
  }
  const datapath::BandwidthMeter& read_bandwidth() const { return read_bandwidth_; }
  EventHub& events() { return events_; }
  datapath::Verifier* cpu_verifier() const { return verifier_.get(); }
  void SetReadVerifier(datapath::Verifier* v) { read_verifier_->Set(v != nullptr ? v : verifier_.get()); }
  void SetGatherChecksums(bool on) { gather_checksums_.store(on); }
  absl::Status StageReadsOnGpu(absl::Span<uint8_t> device, datapath::Verifier* placing,
                               uint32_t depth);

 private:
  using PendingKey = std::pair<NamespaceId, Key>;
  // The reader of every Retrieve and Scrub, over `staging` (and `bounce`: layer_reader.h).
  std::unique_ptr<datapath::LayerReader> MakeReader(datapath::StagingPool* staging,
                                                    datapath::BounceSlots* bounce);
  struct ReadItem;
  class StoreRead;  // PrepareRead's result, finished by FinishRead

  // catalog.cc
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

  // Takes the blocks of `failed` (key and epoch, in namespace `ns`) out of the
  // index after a failed read: queues their Deletes (one sync for all), moves
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
  // Hides `e` and queues its Delete record; returns the record's sequence
  // number. The slot stays taken until the record is durable.
  uint64_t HideForEviction(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
  // Erases namespace `id` (whose blocks are gone) and queues its drop record; returns the
  // record's sequence number, which the caller syncs (after letting go of mu_).
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

  // block_writer.cc: recovers the index, the namespaces and the journal (RecoverStore,
  // recovery.h), takes them in and starts the journal thread. Called by Init before the writer
  // and committer start, so index_ is this thread's alone and RecoverStore fills it without mu_:
  // hence no analysis.
  absl::Status Recover() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Gives each block of `batch` a slot (consecutive slots in batch order where the free slots
  // allow), evicting where the pool is full; `victim_slots` gets the
  // slots whose Delete records must be durable before they are rewritten.
  // Returns the journal sequence number of the last Delete appended (0: none).
  uint64_t AssignSlots(absl::Span<PendingBlock* const> batch, std::vector<uint64_t>* victim_slots);

  // write_pipeline.cc: batches from slots to publication. The writer thread (WriterLoop) starts
  // batches (StartBatch) while fewer than write_batches_in_flight are unwritten; the committer
  // thread (CommitLoop) commits them in order as their writes complete (CommitBatches). So a
  // batch's checksums and writes overlap the previous ones' writes, pool syncs and journal
  // commit. Each batch keeps the rules of the top of this file: its Puts are appended only after
  // its writes completed and the pool files they went to were synced; an evicted block's Delete
  // is durable before its slot's writes are posted. Puts are queued, blocks published and
  // checkpoints asked for on the committer thread only.
  void WriterLoop();
  void CommitLoop();
  // Slots (and the evicted blocks' Deletes made durable), checksums, headers into `headers`
  // (write_batch_blocks pages), and the batch's write transfer prepared and posted; `written` is
  // set (under mu_) once its writes all completed.
  std::unique_ptr<InFlightBatch> StartBatch(std::vector<PendingBlock*> blocks, uint8_t* headers);
  // Each ok block's object checksums that did not come with its gather, on checksum_pool_ (and
  // this thread); counts both kinds.
  void ComputeChecksums(absl::Span<PendingBlock* const> blocks);
  // Encodes each ok block's slot header into a page of `headers`, the pages handed out in the
  // order of the headers' places in the pool, so headers adjacent in a file share a write; a block
  // whose header cannot be encoded fails. Then prepares the writes of every ok block.
  std::unique_ptr<datapath::WriteTransfer> PrepareBatchWrites(
      absl::Span<PendingBlock* const> blocks, uint8_t* headers);
  // Commits `batches` (oldest first, every one `written`): fails the blocks of failed writes,
  // syncs the pool files written (in parallel), appends every ok block's Put and syncs the journal
  // once, then publishes each batch in order and checkpoints if due.
  void CommitBatches(std::vector<std::unique_ptr<InFlightBatch>> batches);
  // Marks the blocks of `b` covered by a write that failed (logged with its errno) as failed;
  // returns how many blocks failed so.
  uint64_t FailBlocksOfFailedWrites(const InFlightBatch& b);
  // fdatasync of every file flagged in `files`, in parallel (sync_pool_); the first error, after
  // logging each.
  absl::Status SyncPoolFiles(const std::vector<bool>& files);
  std::vector<uint8_t*> CopyToDram(absl::Span<PendingBlock* const> batch);
  // Puts the batch's durable blocks in the index (and the DRAM tier) in InsertOrder, then
  // answers each block's callers in the batch's order.
  void Publish(absl::Span<PendingBlock* const> batch);
  // The order Publish inserts `batch` in: the batch's order; with tail_first, each run of blocks
  // of one QueuedCall reversed.
  std::vector<size_t> InsertOrder(absl::Span<PendingBlock* const> batch) const;
  // tail_first: uses again, last first, the blocks of `last_of_run`'s call that earlier batches
  // published (still in the index), so the call's first block is the most recent of them all.
  void UseEarlierOfCall(PendingBlock* last_of_run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Committer thread only: checkpoints when checkpoint_every records are in the
  // journal, and after a failure not before the back-off has passed.
  void MaybeCheckpoint();
  // The checkpoint, written by the journal thread; called by the committer after it published
  // every block whose Put it queued (and by the destructor once the committer stopped).
  absl::Status WriteCheckpoint() ABSL_LOCKS_EXCLUDED(mu_);
  // Drops partial blocks past the pending TTL and abandoned ones nobody copies into.
  void ReapStalePending();
  void ReapStalePendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `p`'s staging back and erases it from pending_ (destroys *p).
  void ReleasePending(PendingBlock* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the abandoned and the declined blocks of `touched` that no Capture copies into any
  // more.
  void ReleaseAbandoned(absl::Span<PendingBlock* const> touched) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishPending(PendingBlock* p, CaptureOutcome outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // dram_front (block_store.cc). A Lookup hit on front block `f` of (ns, key): queues it for the
  // SSD (staging of owner 0; none free or the backlog full: counted deferred, it stays kept).
  void PromoteOnLookup(NamespaceId ns, const Key& key, DramFront::Entry* f)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `p` (completed by calls of some layers each, declined): copied into the DRAM front (under
  // mu_), if the policy keeps declined blocks and a chunk is free; false when not kept.
  bool KeepInFront(PendingBlock* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `p` (completed, admitted, about to be queued) promotes the front block of its key, if any.
  void MarkFrontPromotion(PendingBlock* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The front block `p` promoted leaves the front; its pins go to the index entry `e` (p was
  // published) or, with e null, to retired_ (p failed: those pins' Reads fail as a dropped
  // block's do).
  void EndFrontPromotion(PendingBlock* p, Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies each promoted block's front copy into its staging frames (writer thread).
  void FillPromotedFrames(absl::Span<PendingBlock* const> blocks);

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
  // A Retrieve's finish step (StoreRead::Finish, once the reader returned): retires the failed
  // blocks, records the bandwidth sample and counts stats.
  void FinishRead(NamespaceId ns, const NamespaceInfo& info, uint32_t nlayers,
                  absl::Span<const ReadItem> items, const datapath::LayerReadResult& result,
                  uint64_t unfit);
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
  // Staging for `blocks` new blocks of `info` at once, for one Capture call, when their objects
  // can share writes (each fills its pool frame, and an extent group holds more than one slot);
  // null when not, for fewer than two blocks, while the write backlog is past a bound, or when
  // staging refuses the whole run. Counts nothing as refused.
  uint8_t* TakeSharedStaging(const NamespaceInfo& info, uint64_t owner, uint32_t blocks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The new blocks of one Capture call, in key order, get their staging through this: lanes of
  // shared runs of up to G (extent_slots) blocks while staging grants them (TakeSharedStaging;
  // where it refuses a run, half as many lanes, down to two), else a run each (TakeBlockStaging,
  // once no shared run of two was granted).
  struct NewBlockStaging {
    uint32_t left = 0;  // new blocks still to come in the call (CountNewBlocks)
    uint8_t* run = nullptr;
    uint32_t lanes = 0, used = 0;  // of `run`
    bool shared_refused = false;
    bool reaped = false;  // TakeBlockStaging's once-per-call reap
  };
  // The frames of the next new block of the call; empty with *outcome set when refused.
  std::vector<uint8_t*> TakeNewBlockStaging(const NamespaceInfo& info, uint64_t owner,
                                            NewBlockStaging* call, CaptureOutcome* outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The keys of `keys` (first occurrences) that are neither stored nor pending: the blocks a
  // Capture call of them starts.
  uint32_t CountNewBlocks(NamespaceId ns, absl::Span<const Key> keys,
                          const absl::flat_hash_set<Key>& declined = {}) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the admission policy about each new block of `keys` (first occurrences, in order) and
  // counts its answers; returns the keys it declined.
  absl::flat_hash_set<Key> DeclineNewBlocks(NamespaceId ns, absl::Span<const Key> keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Asks the admission policy about `p` once (fully captured by calls of some layers each);
  // true when it is declined (counted, p->declined set).
  bool DeclineCompleted(PendingBlock* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  std::unique_ptr<AdmissionPolicy> admission_;  // made by Init; thread-safe on its own
  // Object checksums off the transfer's own thread: reads' verification and writes' checksums
  // (options_.checksum_threads; none: inline).
  std::unique_ptr<datapath::WorkPool> checksum_pool_;
  std::unique_ptr<datapath::Verifier> verifier_;  // checks on checksum_pool_
  std::unique_ptr<datapath::VerifierSwitch> read_verifier_;  // reads': verifier_ or the GPU's
  std::atomic<bool> gather_checksums_{false};                // SetGatherChecksums
  // Retrieve staging, leased per layer by reader_, which plans, posts and checks the reads of
  // every Retrieve (datapath::RunRetrieve reaches it through BlockStore::reader()) and of Scrub.
  // Both are the store's alone; reader_ is destroyed first.
  // With layers staged in GPU memory (StageReadsOnGpu), the Retrieves into GPU memory have a
  // reader of their own, gpu_reader_, over leases of that memory (device_staging_) and bounce
  // slots carved from the start of read_region_; read_staging_ then holds the rest of it.
  // Else the three are null and read_staging_ holds all of read_region_.
  absl::Span<uint8_t> read_region_;
  std::unique_ptr<datapath::StagingPool> read_staging_;
  std::unique_ptr<datapath::StagingPool> device_staging_;
  std::unique_ptr<datapath::BounceSlots> bounce_;
  std::unique_ptr<datapath::LayerReader> reader_;
  std::unique_ptr<datapath::LayerReader> gpu_reader_;
  // Pool-file syncs of a commit, in parallel: one thread fewer than files (the committer takes
  // one).
  std::unique_ptr<datapath::WorkPool> sync_pool_;

  // The journal and its owner thread; started by Recover before the writer, stopped last (by
  // the destructor, after the final checkpoint). Thread-safe itself.
  std::unique_ptr<JournalWriter> journal_;
  // Held by RegisterNamespace and RemoveNamespace throughout: one namespace change at a time, and
  // no claim is taken while one decides what is empty.
  absl::Mutex ns_mu_;
  // Committer thread only (and the destructor, after it stopped).
  int64_t checkpoint_retry_ms_ = 0;   // no checkpoint attempt before this time
  uint32_t checkpoint_failed_in_row_ = 0;

  mutable absl::Mutex mu_;
  // The catalog (catalog.cc, namespaces.cc).
  Index index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NamespaceId, NamespaceInfo> namespaces_ ABSL_GUARDED_BY(mu_);
  // Claims (NamespaceClaim) per namespace; taken with ns_mu_ held too.
  absl::flat_hash_map<NamespaceId, uint32_t> claims_ ABSL_GUARDED_BY(mu_);
  // When each namespace was registered (or recovered), in order: the oldest idle one is dropped.
  absl::flat_hash_map<NamespaceId, uint64_t> registered_order_ ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  // Blocks whose read failed, out of the index, their slots waiting (RetiredSlot).
  absl::flat_hash_map<PendingKey, RetiredKey> retired_ ABSL_GUARDED_BY(mu_);
  // The DRAM copies: the tier (filled by the committer's Publish) or the front.
  std::unique_ptr<Region> dram_region_;
  std::unique_ptr<DramTier> dram_ ABSL_GUARDED_BY(mu_);
  // "dram_front" (admission_->keeps_declined_in_dram()): the front, over dram_region_, and the
  // DRAM tier off (dram_ over nothing). Else off.
  std::unique_ptr<DramFront> front_ ABSL_GUARDED_BY(mu_);
  // Capture and the writer: blocks from their first layer to their publication.
  absl::flat_hash_map<PendingKey, std::unique_ptr<PendingBlock>> pending_ ABSL_GUARDED_BY(mu_);
  std::deque<PendingBlock*> write_queue_ ABSL_GUARDED_BY(mu_);
  // The write backlog: queued blocks (in write_queue_ or being written) until released.
  uint64_t backlog_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::multiset<int64_t> backlog_queued_ms_ ABSL_GUARDED_BY(mu_);  // each block's queued_ms
  // Its bounds: options_' at start, then SetWriteBacklogBounds' (a config reload).
  uint64_t max_backlog_bytes_ ABSL_GUARDED_BY(mu_) = options_.max_write_backlog_bytes;
  int64_t max_backlog_age_ms_ ABSL_GUARDED_BY(mu_) = options_.max_write_backlog_age_ms;
  int writing_ ABSL_GUARDED_BY(mu_) = 0;  // batches taken by the writer and not yet committed
  // Batches started by the writer and not yet taken by the committer, oldest first.
  std::deque<std::unique_ptr<InFlightBatch>> in_flight_ ABSL_GUARDED_BY(mu_);
  // write_batches_in_flight sets of write_batch_blocks x 4 KiB slot-header pages (in staging's
  // region, after the read staging) no batch's writes are using; a batch takes one as it starts
  // and gives it back as its last write completes, so batches completing out of order never
  // share one.
  std::vector<uint8_t*> free_header_sets_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool writer_done_ ABSL_GUARDED_BY(mu_) = false;  // the writer has stopped: no batch will come
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t last_reap_ms_ ABSL_GUARDED_BY(mu_) = 0;
  StoreStats stats_ ABSL_GUARDED_BY(mu_);
  datapath::BandwidthMeter read_bandwidth_;
  EventHub events_;  // thread-safe; its lock is a leaf (taken under mu_ by the hooks)
  std::thread writer_;
  std::thread committer_;
};

}  // namespace tutti::store

#endif  // TUTTI_DAEMON_STORE_BLOCK_STORE_IMPL_H_

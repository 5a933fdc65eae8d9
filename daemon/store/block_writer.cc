// BlockStore's writer: start-up, checkpoints, slot allocation and the eviction it needs
// (recovery is recovery.cc's, which Recover calls before the threads start; hiding a block is
// catalog.cc's). Two threads (writer_ and committer_) run the write pipeline (write_pipeline.cc),
// which takes its batches' slots here. The journal is the journal thread's alone
// (journal_writer.h): the committer's Puts, the writer's, Evict's and failed reads' Deletes and the
// namespace records reach it by message (the rules are in block_store_impl.h).
#include <pthread.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/pool/slot_header.h"
#include "daemon/store/block_store_impl.h"
#include "daemon/store/recovery.h"

namespace tutti::store {

namespace {

// The writer looks for stale partial blocks at least this often, busy or not.
constexpr int64_t kReapEveryMs = 500;
// Back-off after a failed checkpoint: 1 s, doubling, at most 5 min.
constexpr int64_t kCheckpointRetryMinMs = 1000;
constexpr int64_t kCheckpointRetryMaxMs = 300000;

// Region::Create(bytes), its error prefixed with the config fields that sized the region.
absl::StatusOr<std::unique_ptr<Region>> CreateRegion(uint64_t bytes, const std::string& sized_by) {
  absl::StatusOr<std::unique_ptr<Region>> region = Region::Create(bytes);
  if (region.ok()) return region;
  return absl::Status(region.status().code(),
                      absl::StrCat(sized_by, ": ", region.status().message()));
}

}  // namespace

BlockStore::Impl::Impl(const StoreOptions& options, std::unique_ptr<io::IoBackend> backend,
                       Clock* clock)
    : options_(options),
      backend_(std::move(backend)),
      clock_(clock),
      index_(options.layout.num_slots(), options.layout.max_objects()),
      read_bandwidth_(options.bandwidth),
      events_(EventHubOptions{options.max_pending_events, options.pool_id, 0,
                              options.max_pending_events_total}) {}

BlockStore::Impl::~Impl() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (writer_.joinable()) writer_.join();
  if (committer_.joinable()) committer_.join();
  if (journal_ == nullptr) return;
  auto log = log::Get("store");
  if (absl::Status lost = journal_->durability(); !lost.ok()) {
    log->error(
        "stopping without a final checkpoint: {} Blocks acknowledged durable before that are "
        "not described by anything in the state directory",
        std::string(lost.message()));
    return;
  }
  absl::Status s = journal_->Sync();
  if (!s.ok()) {
    log->error("final journal sync failed: {}; no checkpoint written. The journal holds every "
               "block acknowledged durable; blocks after its last good sync were not acknowledged",
               s.ToString());
    return;
  }
  s = WriteCheckpoint();
  if (!s.ok()) {
    log->error("final checkpoint failed: {}; the journal still holds every block acknowledged "
               "durable, and the next start replays it", s.ToString());
  }
}

absl::Status BlockStore::Impl::Init() {
  const uint32_t frame = options_.layout.object_bytes();
  const uint64_t chunk = options_.layout.slot_bytes() - pool::kSlotHeaderBytes;
  const uint64_t store_bytes = std::max<uint64_t>(options_.store_staging_bytes, chunk) /
                               StoreStaging::kPage * StoreStaging::kPage;
  const uint64_t largest_block = uint64_t{options_.layout.max_objects()} * frame;
  const uint64_t owner_cap = std::max<uint64_t>(
      largest_block, options_.max_staging_bytes_per_owner != 0
                         ? options_.max_staging_bytes_per_owner
                         : store_bytes / 4 * 3);
  const uint64_t read_bytes = std::max<uint64_t>(options_.retrieve_staging_bytes, frame);
  const uint64_t header_set_bytes = uint64_t{options_.write_batch_blocks} * pool::kSlotHeaderBytes;
  const uint32_t header_sets = std::max<uint32_t>(1, options_.write_batches_in_flight);
  const uint64_t header_bytes = header_sets * header_set_bytes;
  ASSIGN_OR_RETURN(region_, CreateRegion(store_bytes + read_bytes + header_bytes,
                                         absl::StrCat("limits.store_staging_bytes = ",
                                                      options_.store_staging_bytes,
                                                      ", limits.retrieve_staging_bytes = ",
                                                      options_.retrieve_staging_bytes)));
  ASSIGN_OR_RETURN(admission_,
                   MakeAdmissionPolicy(AdmissionOptions{
                       options_.admission, options_.admission_ghost_blocks != 0
                                               ? options_.admission_ghost_blocks
                                               : 2 * options_.layout.num_slots()}));
  uint8_t* base = region_->span().data();
  store_staging_ = std::make_unique<StoreStaging>(absl::MakeSpan(base, store_bytes), owner_cap);
  read_region_ = absl::MakeSpan(base + store_bytes, read_bytes);
  read_staging_ = std::make_unique<datapath::StagingPool>(read_region_);
  checksum_pool_ = std::make_unique<datapath::WorkPool>(options_.checksum_threads, "tutti-sum");
  verifier_ = datapath::MakeCpuVerifier(checksum_pool_.get());
  read_verifier_ = std::make_unique<datapath::VerifierSwitch>(verifier_.get());
  // One file's sync runs on the committer itself.
  sync_pool_ = std::make_unique<datapath::WorkPool>(
      std::min(backend_->num_files(), kMaxSyncThreads + 1) - 1, "tutti-sync");
  reader_ = MakeReader(read_staging_.get(), nullptr);
  {
    uint8_t* const headers = base + store_bytes + read_bytes;
    absl::MutexLock lock(&mu_);
    for (uint32_t i = 0; i < header_sets; ++i) {
      free_header_sets_.push_back(headers + i * header_set_bytes);
    }
  }
  const bool front = admission_->keeps_declined_in_dram();
  const uint64_t dram_blocks = options_.dram_bytes / chunk;
  if (front && dram_blocks == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool.admission = \"dram_front\" keeps first-sight blocks in the DRAM tier: "
        "dram.capacity_bytes (", options_.dram_bytes, ") must hold at least one block (",
        chunk, " bytes)"));
  }
  // The front's region has room for store staging's worth of blocks more: blocks being
  // promoted hold their chunk until written, outside the front's bound.
  const uint64_t dram_chunks = dram_blocks + (front ? std::max<uint64_t>(1, store_bytes / chunk) : 0);
  if (dram_blocks > 0) {
    ASSIGN_OR_RETURN(dram_region_,
                     CreateRegion(dram_chunks * chunk,
                                  absl::StrCat("dram.capacity_bytes = ", options_.dram_bytes)));
  }
  {
    absl::MutexLock lock(&mu_);
    const absl::Span<uint8_t> dram =
        dram_region_ == nullptr ? absl::Span<uint8_t>() : dram_region_->span();
    dram_ = std::make_unique<DramTier>(front ? absl::Span<uint8_t>() : dram, chunk);
    front_ = std::make_unique<DramFront>(front ? dram : absl::Span<uint8_t>(), chunk,
                                         front ? dram_blocks : 0);
  }
  io_sink_ = datapath::BackendSink(backend_.get());
  datapath::IoSchedulerOptions sched;
  sched.num_devices = backend_->num_files();
  sched.write_bytes_in_flight_while_reading = options_.write_bytes_in_flight_while_reading;
  sched.max_write_bytes_in_flight = std::max(options_.max_write_bytes_in_flight,
                                             options_.write_bytes_in_flight_while_reading);
  // An eighth of the cap per emission: a device is topped up as each eighth completes.
  sched.write_emission_bytes = std::max(sched.max_write_bytes_in_flight / 8,
                                        sched.write_bytes_in_flight_while_reading);
  sched.write_latency_target_us = options_.write_latency_target_us;
  sched.max_read_bytes_in_flight = options_.max_read_bytes_in_flight;
  // A turn is worth one full batch of a Retrieve's reads of a device (layer_reader.h).
  sched.read_turn_bytes = std::max<uint64_t>(options_.read_post_bytes, options_.max_read_bytes);
  ASSIGN_OR_RETURN(scheduler_, datapath::IoScheduler::Create(sched, io_sink_.get(), clock_));
  absl::Status reg = backend_->RegisterBuffer(region_->span());
  if (!reg.ok()) {
    log::Get("store")->warn("staging not registered with the I/O backend ({}); continuing",
                            reg.ToString());
  }
  RETURN_IF_ERROR(Recover());
  writer_ = std::thread([this] { WriterLoop(); });
  pthread_setname_np(writer_.native_handle(), "tutti-writer");
  committer_ = std::thread([this] { CommitLoop(); });
  pthread_setname_np(committer_.native_handle(), "tutti-commit");
  return absl::OkStatus();
}

absl::Status BlockStore::Impl::Recover() {
  ASSIGN_OR_RETURN(RecoveredState state, RecoverStore(options_, backend_.get(), &index_));
  absl::MutexLock lock(&mu_);
  namespaces_ = std::move(state.namespaces);
  registered_order_ = std::move(state.registered_order);
  next_order_ = state.next_order;
  next_epoch_ = state.next_epoch;
  journal_ = std::make_unique<JournalWriter>(std::move(state.journal));
  stats_.unindexed_slot_headers = state.unindexed_slot_headers;
  events_.SetBlocksLostAtStart(state.blocks_lost);
  return absl::OkStatus();
}

absl::Status BlockStore::Impl::WriteCheckpoint() {
  // Runs on the journal thread, after every record queued before it. Each of them has its effect
  // in what the snapshot reads: Deletes and drops are queued after their effect, the committer's
  // Puts are published before it asks for the checkpoint, and a namespace record's entry is made
  // on the journal thread right after its sync (SyncAndApply). Records queued meanwhile (Evict's
  // and failed reads' Deletes) go to the new generation and replay over the snapshot whether or
  // not it saw their effect. So the store's lock is taken per chunk of slots, and lookups and
  // reads wait for one chunk's copy at most, not for the whole file to be encoded and written.
  return journal_->Checkpoint([this](Journal::Emitter& out) {
    uint64_t num_slots = 0;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, info] : namespaces_) {
        out.Emit(NamespaceRecord{id, info.descriptor.SerializeAsString(), info.scope,
                                 info.owner_uid, info.shared});
      }
      num_slots = index_.num_slots();
    }
    const uint64_t step = options_.checkpoint_chunk_slots;
    // One chunk's entries, emitted (encoded and written) after the lock is let go; with step 0
    // everything is emitted under one hold, as before chunking (for comparison only). The
    // records are reused from chunk to chunk: no allocation per block once the first is copied.
    std::vector<PutRecord> chunk;
    size_t used = 0;
    auto copy = [&](uint64_t first, uint64_t end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (uint64_t slot = first; slot < end; ++slot) {
        const Entry* e = index_.AtSlot(slot);
        if (e == nullptr) continue;
        if (used == chunk.size()) chunk.emplace_back();
        PutRecord& r = chunk[used];
        auto sums = index_.Checksums(*e);
        r.ns = e->ns;
        r.key = e->key;
        r.slot = e->slot;
        r.epoch = e->epoch;
        r.object_len = e->object_len;
        r.checksums.assign(sums.begin(), sums.end());
        r.last_use = e->last_use;
        if (step == 0) {
          out.Emit(r);
        } else {
          ++used;
        }
      }
    };
    if (step == 0) {
      absl::MutexLock lock(&mu_);
      copy(0, num_slots);
      return;
    }
    for (uint64_t first = 0; first < num_slots; first += step) {
      used = 0;
      {
        absl::MutexLock lock(&mu_);
        copy(first, std::min(num_slots, first + step));
      }
      for (size_t i = 0; i < used; ++i) out.Emit(chunk[i]);
    }
  });
}

void BlockStore::Impl::MaybeCheckpoint() {
  if (journal_->records_since_checkpoint() < options_.checkpoint_every) return;
  const int64_t now = clock_->NowMs();
  if (now < checkpoint_retry_ms_) return;
  absl::Status s = WriteCheckpoint();
  auto log = log::Get("store");
  if (s.ok()) {
    if (checkpoint_failed_in_row_ > 0) {
      log->info("checkpoint written after {} failed attempts", checkpoint_failed_in_row_);
    }
    checkpoint_failed_in_row_ = 0;
    checkpoint_retry_ms_ = 0;
    return;
  }
  const int64_t backoff = std::min(
      kCheckpointRetryMaxMs, kCheckpointRetryMinMs << std::min<uint32_t>(checkpoint_failed_in_row_, 9));
  ++checkpoint_failed_in_row_;
  checkpoint_retry_ms_ = now + backoff;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.checkpoint_failures;
  }
  log->error(
      "checkpoint in {} failed: {}; records keep going to the current journal file; attempt {} "
      "failed, next in {} s",
      options_.state_dir, s.ToString(), checkpoint_failed_in_row_, backoff / 1000);
}

void BlockStore::Impl::ReapStalePending() {
  absl::MutexLock lock(&mu_);
  if (clock_->NowMs() - last_reap_ms_ < kReapEveryMs) return;
  ReapStalePendingLocked();
}

void BlockStore::Impl::ReapStalePendingLocked() {
  const int64_t now = clock_->NowMs();
  last_reap_ms_ = now;
  for (auto it = pending_.begin(); it != pending_.end();) {
    PendingBlock* p = (it++)->second.get();  // advanced first: ReleasePending erases p's entry
    if (p->queued || p->capturing > 0) continue;
    if (p->abandoned) {
      ++stats_.pending_dropped;
    } else if (now - p->touched_ms >= options_.pending_ttl_ms) {
      ++stats_.pending_expired;
    } else {
      continue;
    }
    ReleasePending(p);
  }
}

// The blocks of one batch that need a slot get consecutive slots where the free
// slots allow (Index::TakeSlots), in batch order: a Capture's blocks arrive in
// the write queue one after another, so one layer of them lies in adjacent
// frames. Slots still wanted come from evicting the least recently used blocks
// one by one, as before; their slots join the batch's, sorted.
uint64_t BlockStore::Impl::AssignSlots(absl::Span<PendingBlock* const> batch,
                                       std::vector<uint64_t>* victim_slots) {
  uint64_t last_delete = 0;
  absl::MutexLock lock(&mu_);
  std::vector<PendingBlock*> wanting;
  for (PendingBlock* p : batch) {
    p->ok = false;
    p->has_slot = false;
    p->over_share = false;
    if (index_.Find(p->ns, p->key) != nullptr) continue;  // stored meanwhile; dropped later
    if (!namespaces_.contains(p->ns)) continue;           // removed meanwhile: the block fails
    wanting.push_back(p);
  }
  std::vector<uint64_t> slots;
  if (options_.pool_share_per_user < 1.0) {
    last_delete = EvictForShares(wanting, &slots, victim_slots);
    wanting.erase(std::remove_if(wanting.begin(), wanting.end(),
                                 [](const PendingBlock* p) { return p->over_share; }),
                  wanting.end());
  }
  const size_t own = slots.size();  // slots evicted from the blocks' own owners
  std::vector<uint64_t> fresh = index_.TakeSlots(wanting.size() - own);
  slots.insert(slots.end(), fresh.begin(), fresh.end());
  while (slots.size() < wanting.size()) {
    Entry* victim = index_.Victim();
    if (victim == nullptr) break;  // the rest are pinned: those blocks fail
    slots.push_back(victim->slot);
    victim_slots->push_back(victim->slot);
    last_delete = HideForEviction(victim);
  }
  if (slots.size() < wanting.size()) {
    TUTTI_LOG_EVERY_N_SEC(log::Get("store"), spdlog::level::warn, 5,
                          "{} of {} blocks found no slot: every block in the pool is pinned by "
                          "leases (bounded by limits.max_pinned_pool_share and "
                          "max_pinned_pool_share_per_user; `tuttictl sessions`, `tuttictl "
                          "end-session`); they fail and will be misses",
                          wanting.size() - slots.size(), wanting.size());
  }
  std::sort(slots.begin(), slots.end());
  for (size_t i = 0; i < wanting.size(); ++i) {
    PendingBlock* p = wanting[i];
    if (i < slots.size()) {
      p->slot = slots[i];
      p->has_slot = true;
    }
    p->ok = p->has_slot;  // its epoch was given at capture (PendingBlock::epoch)
  }
  return last_delete;
}

// Each owner's blocks now, and its bound; a block whose owner is at the bound takes the slot of
// the owner's own least recently used unpinned block (batch blocks count as they are given
// slots), or is refused.
uint64_t BlockStore::Impl::EvictForShares(absl::Span<PendingBlock* const> wanting,
                                          std::vector<uint64_t>* slots,
                                          std::vector<uint64_t>* victim_slots) {
  const uint64_t bound = std::max<uint64_t>(
      1, static_cast<uint64_t>(options_.pool_share_per_user * index_.num_slots()));
  absl::flat_hash_map<NamespaceId, uint32_t> owner_of;
  absl::flat_hash_map<uint32_t, uint64_t> blocks;
  for (const auto& [id, info] : namespaces_) {
    owner_of[id] = ShareOwner(info);
    blocks[ShareOwner(info)] += index_.CountNamespace(id);
  }
  uint64_t last_delete = 0;
  for (PendingBlock* p : wanting) {
    const uint32_t owner = owner_of[p->ns];
    if (blocks[owner] < bound) {
      ++blocks[owner];
      continue;
    }
    Entry* victim = index_.VictimWhere([&](const Entry& e) {
      auto it = owner_of.find(e.ns);
      return it != owner_of.end() && it->second == owner;
    });
    if (victim == nullptr) {
      p->over_share = true;
      continue;
    }
    slots->push_back(victim->slot);
    victim_slots->push_back(victim->slot);
    last_delete = HideForEviction(victim);
    ++stats_.share_evictions;
  }
  return last_delete;
}

}  // namespace tutti::store

// BlockStore: layer-wise reads and capture (staging, admission, the DRAM front, the write
// backlog), stats and the public face. The catalog (lookups, pins, retired blocks, eviction) is in
// catalog.cc and namespaces.cc, the writer (start-up, slots, the write pipeline, checkpoints) in
// block_writer.cc and write_pipeline.cc, recovery in recovery.cc.
#include "daemon/store/block_store.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/align.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/datapath/read_plan.h"
#include "daemon/pool/slot_header.h"
#include "daemon/store/block_store_impl.h"

namespace tutti::store {

std::vector<uint8_t*> BlockStore::Impl::StagingObjects(uint8_t* chunk, uint32_t num_objects,
                                                       uint32_t frame_bytes) const {
  const uint32_t d = options_.layout.num_files();
  std::vector<uint8_t*> frames(num_objects);
  uint64_t share_start = 0;  // frames before file share r
  for (uint32_t r = 0; r < std::min(d, num_objects); ++r) {
    const uint32_t count = (num_objects - r + d - 1) / d;
    for (uint32_t k = 0; k < count; ++k) {
      frames[r + k * d] = chunk + (share_start + k) * frame_bytes;
    }
    share_start += count;
  }
  return frames;
}

// One block of a Read, as the store knows it (datapath::ReadSource says where its bytes come from).
struct BlockStore::Impl::ReadItem {
  Key key;
  uint64_t slot = 0;
  uint64_t epoch = 0;
  // Holds the DRAM tier's copy for the whole Read.
  std::shared_ptr<const DramBlock> dram;
  bool gone = false;  // its block left the index before this read
};

absl::Status BlockStore::Impl::GatherReadItems(NamespaceId ns, const NamespaceInfo& info,
                                              absl::Span<const Key> keys,
                                              std::vector<ReadItem>* items,
                                              std::vector<datapath::ReadSource>* sources,
                                              uint64_t* unfit) {
  using From = datapath::ReadSource::From;
  for (size_t i = 0; i < keys.size(); ++i) {
    Entry* e = index_.Find(ns, keys[i]);
    ReadItem& it = (*items)[i];
    datapath::ReadSource& src = (*sources)[i];
    it.key = src.key = keys[i];
    if (e == nullptr) {
      // A DRAM-front block pinned by a Lookup: served from its DRAM copy, like a DRAM-tier hit.
      if (DramFront::Entry* f = front_->Find(ns, keys[i]); f != nullptr && f->pins > 0) {
        if (f->data->num_objects != info.num_objects || f->data->object_len != info.object_len) {
          src.from = From::kFailed;
          ++*unfit;
          continue;
        }
        it.dram = f->data;
        src.from = From::kDram;
        src.dram = f->data->data;
        continue;
      }
    }
    if (e == nullptr || e->pins == 0) {
      auto retired = retired_.find(PendingKey{ns, keys[i]});
      if (retired == retired_.end() || retired->second.pins == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("block ", keys[i].Hex(), " is not pinned: Lookup it first"));
      }
      it.gone = true;  // pinned before a failed read dropped it
      src.from = From::kFailed;
      continue;
    }
    it.slot = src.slot = e->slot;
    it.epoch = src.epoch = e->epoch;
    // Into the index's checksum table: stable while the block is pinned (its slot cannot be reused).
    src.checksums = index_.Checksums(*e);
    if (e->num_objects != info.num_objects || e->object_len != info.object_len) {
      src.from = From::kFailed;  // an entry that does not fit its namespace
      ++*unfit;
      continue;
    }
    it.dram = dram_->Find(ns, keys[i], e->epoch);
    if (it.dram) {
      src.from = From::kDram;
      src.dram = it.dram->data;
    }
  }
  return absl::OkStatus();
}

// A Retrieve's read as PrepareRead gathered it: the reader's request, pointing into `sources_`,
// and what FinishRead needs. Holds the DRAM copies it reads (ReadItem::dram) until destroyed.
class BlockStore::Impl::StoreRead final : public datapath::PreparedRead {
 public:
  StoreRead(Impl* store, const NamespaceInfo& info, const datapath::RetrieveRequest& r)
      : store_(store), info_(info), items_(r.keys.size()), sources_(r.keys.size()) {
    request_.ns = r.ns;
    request_.items = sources_;
    request_.layer_begin = r.layer_begin;
    request_.layer_end = r.layer_end;
    request_.parts = info.parts;
    request_.object_len = info.object_len;
    request_.engine_blocks = r.engine_blocks;
  }
  const datapath::LayerReadRequest& request() const override { return request_; }
  void Finish(const datapath::LayerReadResult& result) override {
    if (result.layers_done == 0) return;  // refused before reading anything
    store_->FinishRead(request_.ns, info_, request_.layer_end - request_.layer_begin, items_,
                       result, unfit_);
  }

 private:
  friend class Impl;
  Impl* const store_;
  const NamespaceInfo info_;
  std::vector<ReadItem> items_;
  std::vector<datapath::ReadSource> sources_;
  uint64_t unfit_ = 0;  // entries that did not fit their namespace: failed before the read
  datapath::LayerReadRequest request_;
};

absl::StatusOr<std::unique_ptr<datapath::PreparedRead>> BlockStore::Impl::PrepareRead(
    const datapath::RetrieveRequest& r) {
  ASSIGN_OR_RETURN(const NamespaceInfo info, GetNamespace(r.ns));
  const uint32_t layers = info.num_objects / info.parts;
  if (r.layer_begin >= r.layer_end || r.layer_end > layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer range [", r.layer_begin, ", ", r.layer_end, ") is not within [0, ", layers, ")"));
  }
  if (!r.engine_blocks.empty() && r.engine_blocks.size() != r.keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.engine_blocks.size(), " engine blocks for ", r.keys.size(), " keys"));
  }
  auto read = std::make_unique<StoreRead>(this, info, r);
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(
        GatherReadItems(r.ns, info, r.keys, &read->items_, &read->sources_, &read->unfit_));
  }
  return std::unique_ptr<datapath::PreparedRead>(std::move(read));
}

std::unique_ptr<datapath::LayerReader> BlockStore::Impl::MakeReader(datapath::StagingPool* staging,
                                                                   datapath::BounceSlots* bounce) {
  return std::make_unique<datapath::LayerReader>(
      datapath::LayerReaderOptions{options_.layout, options_.max_read_bytes, 8,
                                   options_.read_post_bytes},
      staging, read_verifier_.get(),
      [this](uint64_t stream, absl::Span<io::IoRequest> batch, std::function<void()> done) {
        // Reads go through the scheduler (made in Init, before any Read), ahead of writes, each
        // Read's as a stream of its own.
        scheduler_->Post(datapath::IoClass::kRead, batch, std::move(done), stream);
      },
      bounce);
}

absl::Status BlockStore::Impl::StageReadsOnGpu(absl::Span<uint8_t> device,
                                               datapath::Verifier* placing, uint32_t depth) {
  if (device.empty()) {  // back to host staging and the CPU's checks
    gpu_reader_.reset();
    bounce_.reset();
    device_staging_.reset();
    reader_.reset();
    read_staging_ = std::make_unique<datapath::StagingPool>(read_region_);
    reader_ = MakeReader(read_staging_.get(), nullptr);
    read_verifier_->Set(verifier_.get());
    return absl::OkStatus();
  }
  if (placing == nullptr || depth == 0 || gpu_reader_ != nullptr) {
    return absl::InvalidArgumentError(
        "StageReadsOnGpu: a placing verifier and a depth are needed, once");
  }
  if (device.size() < read_region_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StageReadsOnGpu: ", device.size(), " bytes of GPU staging, less than the ",
        read_region_.size(), " of limits.retrieve_staging_bytes"));
  }
  const uint32_t slot_bytes =
      datapath::BounceSlots::SlotBytesFor(options_.read_post_bytes, options_.max_read_bytes);
  const uint32_t files = options_.layout.num_files();
  const uint64_t bounce_bytes = datapath::BounceSlots::BytesFor(files, depth, slot_bytes);
  // The Retrieves into host memory (engines of host_shm, in cuda mode) and Scrub keep the rest.
  const uint64_t frame = options_.layout.object_bytes();
  if (bounce_bytes + frame > read_region_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "datapath.read_bounce_depth = ", depth, ": ", files, " pool files x ", depth,
        " bounce slots of ", slot_bytes, " bytes need ", bounce_bytes + frame,
        " bytes of limits.retrieve_staging_bytes (with one object left for host reads); it has ",
        read_region_.size()));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<datapath::BounceSlots> bounce,
                   datapath::BounceSlots::Create(read_region_.subspan(0, bounce_bytes), files,
                                                 depth, slot_bytes));
  reader_.reset();
  read_staging_ = std::make_unique<datapath::StagingPool>(read_region_.subspan(bounce_bytes));
  reader_ = MakeReader(read_staging_.get(), nullptr);
  device_staging_ = std::make_unique<datapath::StagingPool>(
      device.subspan(0, read_region_.size()), datapath::MemoryKind::kDevice);
  bounce_ = std::move(bounce);
  gpu_reader_ = MakeReader(device_staging_.get(), bounce_.get());
  read_verifier_->Set(placing);
  return absl::OkStatus();
}

void BlockStore::Impl::FinishRead(NamespaceId ns, const NamespaceInfo& info, uint32_t nlayers,
                                  absl::Span<const ReadItem> items,
                                  const datapath::LayerReadResult& result, uint64_t unfit) {
  using datapath::ReadFailure;
  auto log = log::Get("store");
  uint64_t served = 0, dram_hits = 0, ssd_items = 0, verify_errors = 0, io_errors = 0;
  std::vector<FailedBlock> failed;
  for (size_t i = 0; i < items.size(); ++i) {
    const ReadItem& it = items[i];
    const ReadFailure f = result.failures[i];
    ssd_items += f != ReadFailure::kBeforeRead && it.dram == nullptr;
    verify_errors += f == ReadFailure::kChecksum;
    io_errors += f == ReadFailure::kIoError || f == ReadFailure::kShortRead;
    if (it.gone) continue;
    if (f == ReadFailure::kNotPlaced) {  // the block is fine; this read of it is not
      TUTTI_LOG_EVERY_N_SEC(log, spdlog::level::err, 5,
                            "namespace {:016x} block {} slot {}: read and checked but not placed "
                            "in GPU memory (the GPU's checks failed: see the gpu log); served as "
                            "a miss, kept in the pool",
                            ns, it.key.Hex(), it.slot);
    } else if (f != ReadFailure::kNone) {
      failed.push_back(FailedBlock{it.key, it.epoch});
      TUTTI_LOG_EVERY_N_SEC(log, spdlog::level::err, 5,
                            "namespace {:016x} block {} slot {}: read or verification failed; "
                            "served as a miss and dropped from the index",
                            ns, it.key.Hex(), it.slot);
    } else {
      ++served;
      dram_hits += it.dram != nullptr;
    }
  }
  RetireFailedBlocks(ns, failed);
  if (result.status.ok()) {
    const uint64_t layer_bytes = uint64_t{nlayers} * info.parts * info.object_len;
    // A Read with any SSD block is paced by the SSD: its time is charged to the SSD bytes.
    if (ssd_items > 0) {
      read_bandwidth_.Record(datapath::Tier::kSsd, (served - dram_hits) * layer_bytes,
                             result.seconds);
    } else {
      read_bandwidth_.Record(datapath::Tier::kDram, dram_hits * layer_bytes, result.seconds);
    }
  }
  absl::MutexLock lock(&mu_);
  stats_.blocks_retrieved += served;
  stats_.bytes_read += served * nlayers * info.parts * uint64_t{info.object_len};
  stats_.verify_errors += verify_errors + unfit;
  stats_.io_errors += io_errors;
  stats_.dram_hits += dram_hits;
  if (auto it = namespaces_.find(ns); it != namespaces_.end()) {
    it->second.blocks_retrieved += served;
    it->second.dram_hits += dram_hits;
  }
}

uint8_t* BlockStore::Impl::TakeBlockStaging(const NamespaceInfo& info, uint64_t owner,
                                            bool* reaped, CaptureOutcome* outcome) {
  const uint64_t bytes = uint64_t{info.num_objects} * RoundUp4K(info.object_len);
  StoreStaging::Grant g = store_staging_->TryTake(owner, bytes);
  // Stale partial blocks may be what holds it: look once per call, and at most once per
  // millisecond (a scan of every pending block) however many calls are refused.
  if (g.data == nullptr && !*reaped && clock_->NowMs() != last_reap_ms_) {
    *reaped = true;
    ReapStalePendingLocked();
    g = store_staging_->TryTake(owner, bytes);
  }
  if (g.data != nullptr && !BacklogFull()) return g.data;
  ++stats_.store_rejected;
  if (g.data != nullptr) {
    // Staging has room but the writer is behind (staging's own refusal, when both hold, comes
    // first).
    store_staging_->Give(owner, g.data, bytes);
    ++stats_.store_rejected_backlog;
    *outcome = CaptureOutcome::kRejectedBacklog;
    return nullptr;
  }
  if (g.refusal == StoreStaging::Refusal::kOwnerLimit) {
    ++stats_.store_rejected_owner_limit;
    *outcome = CaptureOutcome::kRejectedOwnerLimit;
  } else {
    *outcome = CaptureOutcome::kRejectedFull;
  }
  return nullptr;
}

uint8_t* BlockStore::Impl::TakeSharedStaging(const NamespaceInfo& info, uint64_t owner,
                                             uint32_t blocks) {
  const auto& layout = options_.layout;
  const uint32_t frame = RoundUp4K(info.object_len);
  if (blocks < 2 || frame != layout.object_bytes() || layout.extent_slots() < 2 || BacklogFull()) {
    return nullptr;
  }
  return store_staging_->TryTake(owner, uint64_t{blocks} * info.num_objects * frame).data;
}

std::vector<uint8_t*> BlockStore::Impl::TakeNewBlockStaging(const NamespaceInfo& info,
                                                            uint64_t owner, NewBlockStaging* call,
                                                            CaptureOutcome* outcome) {
  const uint32_t frame = RoundUp4K(info.object_len);
  if (call->used == call->lanes && !call->shared_refused) {
    // The next run: as many lanes as are wanted (at most G), else half as many, down to two.
    call->run = nullptr;
    call->lanes = call->used = 0;
    for (uint32_t lanes = std::min(call->left, options_.layout.extent_slots());
         lanes >= 2 && call->run == nullptr; lanes /= 2) {
      call->run = TakeSharedStaging(info, owner, lanes);
      if (call->run != nullptr) call->lanes = lanes;
    }
    call->shared_refused = call->run == nullptr;
  }
  --call->left;
  if (call->used < call->lanes) {
    return InterleavedFrames(call->run, call->lanes, call->used++, info.num_objects, frame);
  }
  uint8_t* own = TakeBlockStaging(info, owner, &call->reaped, outcome);
  if (own == nullptr) return {};
  return StagingObjects(own, info.num_objects, frame);
}

uint32_t BlockStore::Impl::CountNewBlocks(NamespaceId ns, absl::Span<const Key> keys,
                                          const absl::flat_hash_set<Key>& declined) const {
  absl::flat_hash_set<Key> seen;
  uint32_t fresh = 0;
  for (const Key& k : keys) {
    if (!seen.insert(k).second || declined.contains(k)) continue;
    fresh += index_.Find(ns, k) == nullptr && !pending_.contains(PendingKey{ns, k});
  }
  return fresh;
}

absl::flat_hash_set<Key> BlockStore::Impl::DeclineNewBlocks(NamespaceId ns,
                                                            absl::Span<const Key> keys) {
  absl::flat_hash_set<Key> seen, declined;
  for (const Key& k : keys) {
    if (!seen.insert(k).second) continue;
    if (index_.Find(ns, k) != nullptr || pending_.contains(PendingKey{ns, k})) continue;
    // Admitted blocks are counted once captured (Capture): one refused for full staging is
    // offered again and must not count twice.
    // The ghost records every sight; a block kept in the DRAM front is admitted too.
    if (!admission_->Admit(ns, k) && front_->Find(ns, k) == nullptr) {
      ++stats_.blocks_declined;
      declined.insert(k);
    }
  }
  return declined;
}

bool BlockStore::Impl::DeclineCompleted(PendingBlock* p) {
  if (p->admission_asked) return p->declined;
  p->admission_asked = true;
  p->declined = !admission_->Admit(p->ns, p->key) && front_->Find(p->ns, p->key) == nullptr;
  ++(p->declined ? stats_.blocks_declined : stats_.blocks_admitted);
  return p->declined;
}

bool BlockStore::Impl::KeepInFront(PendingBlock* p) {
  if (!admission_->keeps_declined_in_dram()) return false;
  if (front_->Find(p->ns, p->key) != nullptr) return true;  // a key repeated in the call
  uint8_t* chunk = front_->TakeChunk(&stats_.front_dropped);
  if (chunk == nullptr) {
    ++stats_.front_dropped;
    return false;
  }
  // A copy under mu_: only for blocks stored layer by layer (whole blocks are gathered into
  // their chunk directly, outside the lock).
  for (size_t j = 0; j < p->frames.size(); ++j) {
    std::memcpy(chunk + j * uint64_t{p->object_len}, p->frames[j], p->object_len);
  }
  front_->Insert(p->ns, p->key, p->object_len, static_cast<uint32_t>(p->frames.size()), chunk,
                 &stats_.front_dropped);
  ++stats_.front_kept;
  return true;
}

void BlockStore::Impl::PromoteOnLookup(NamespaceId ns, const Key& key, DramFront::Entry* f) {
  // Being captured by an engine now: its completion is the second sight (MarkFrontPromotion).
  if (pending_.contains(PendingKey{ns, key})) return;
  auto info = namespaces_.find(ns);
  if (info == namespaces_.end()) return;
  const DramBlock& b = *f->data;
  const uint32_t frame = RoundUp4K(b.object_len);
  const uint64_t bytes = uint64_t{b.num_objects} * frame;
  uint8_t* staging = BacklogFull() ? nullptr : store_staging_->TryTake(0, bytes).data;
  if (staging == nullptr) {
    ++stats_.front_promotions_deferred;  // kept; a later sight tries again
    return;
  }
  auto p = std::make_unique<PendingBlock>();
  p->ns = ns;
  p->key = key;
  p->object_len = b.object_len;
  p->parts = info->second.parts;
  p->owner = 0;
  p->frame_bytes = frame;
  p->chunk_bytes = bytes;
  p->frames = StagingObjects(staging, b.num_objects, frame);
  p->touched_ms = clock_->NowMs();
  p->admission_asked = true;
  p->front = true;
  p->promote_from = front_->BeginPromotion(ns, key);
  p->epoch = next_epoch_++;  // at capture (block_store_impl.h, PendingBlock::epoch)
  PendingBlock* raw = p.get();
  pending_.emplace(PendingKey{ns, key}, std::move(p));
  QueueForWriter(raw);
  ++stats_.front_promoted;
}

void BlockStore::Impl::MarkFrontPromotion(PendingBlock* p) {
  DramFront::Entry* f = front_->Find(p->ns, p->key);
  if (f == nullptr || f->promoting) return;
  front_->BeginPromotion(p->ns, p->key);
  p->front = true;
  ++stats_.front_promoted;
}

void BlockStore::Impl::EndFrontPromotion(PendingBlock* p, Entry* e) {
  if (!p->front) return;
  p->front = false;
  const uint32_t pins = front_->EndPromotion(p->ns, p->key);
  if (pins == 0) return;
  if (e != nullptr) {
    e->pins += pins;  // the Lookups' pins now hold the block on the SSD
  } else {
    retired_[PendingKey{p->ns, p->key}].pins += pins;  // their Reads fail, as a dropped block's
  }
}

bool BlockStore::Impl::BacklogFull() const {
  const uint64_t max_bytes =
      max_backlog_bytes_ != 0 ? max_backlog_bytes_ : store_staging_->capacity_bytes();
  if (backlog_bytes_ >= max_bytes) return true;
  return !backlog_queued_ms_.empty() &&
         clock_->NowMs() - *backlog_queued_ms_.begin() >= max_backlog_age_ms_;
}

absl::Status BlockStore::Impl::SetWriteBacklogBounds(uint64_t max_bytes, int64_t max_age_ms) {
  if (max_age_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("write backlog age bound must be > 0 ms, got ", max_age_ms));
  }
  absl::MutexLock lock(&mu_);
  max_backlog_bytes_ = max_bytes;
  max_backlog_age_ms_ = max_age_ms;
  return absl::OkStatus();
}

void BlockStore::Impl::QueueForWriter(PendingBlock* p) {
  p->queued = true;
  p->queued_ms = clock_->NowMs();
  backlog_bytes_ += p->chunk_bytes;
  read_bandwidth_.SetWriteBacklog(backlog_bytes_);  // reads now compete with these writes
  backlog_queued_ms_.insert(p->queued_ms);
  write_queue_.push_back(p);
}

void BlockStore::Impl::ReleasePending(PendingBlock* p) {
  if (p->queued) {
    backlog_bytes_ -= p->chunk_bytes;
    read_bandwidth_.SetWriteBacklog(backlog_bytes_);
    backlog_queued_ms_.erase(backlog_queued_ms_.find(p->queued_ms));
  }
  store_staging_->GiveFrames(p->owner, p->frames, p->frame_bytes);
  pending_.erase(PendingKey{p->ns, p->key});
}

absl::StatusOr<std::vector<CaptureOutcome>> BlockStore::Impl::Capture(
    NamespaceId ns, absl::Span<const Key> keys, uint32_t layer_begin, uint32_t layer_end,
    const Gatherer& gather, bool wait_durable, uint64_t owner, absl::Duration staging_wait,
    absl::Span<const uint32_t> engine_blocks) {
  const absl::Time entered = absl::Now();
  ASSIGN_OR_RETURN(const NamespaceInfo info, GetNamespace(ns));
  const uint32_t layers = info.num_objects / info.parts;
  if (layer_begin >= layer_end || layer_end > layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", layer_begin, ", ", layer_end,
                                                   ") is not within [0, ", layers, ")"));
  }
  if (!engine_blocks.empty() && engine_blocks.size() != keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(engine_blocks.size(), " engine blocks for ", keys.size(), " keys"));
  }
  std::vector<CaptureOutcome> outcomes(keys.size(), CaptureOutcome::kCaptured);
  std::vector<engine::CopyOp> ops;
  std::vector<PendingBlock*> touched(keys.size(), nullptr);
  std::vector<PendingBlock*> created;
  // A call of every layer asks the admission policy before taking staging, so a declined block
  // is never copied; blocks captured over several calls are asked once complete.
  const bool whole_blocks = layer_begin == 0 && layer_end == layers;
  absl::flat_hash_set<Key> declined;
  // "dram_front": declined blocks of this call gathered straight into DRAM-front chunks, kept
  // once the gather succeeded.
  const bool keeps_front = admission_->keeps_declined_in_dram();
  struct FrontCopy {
    Key key;
    uint8_t* chunk;
  };
  std::vector<FrontCopy> front_new;
  absl::flat_hash_map<Key, CaptureOutcome> front_seen;  // a key repeated in the call
  // Checksums with the gather (SetGatherChecksums): the pending block of each op (null for the
  // DRAM front's copies, which are not written), and what the gatherer computes for it.
  const bool gather_sums = gather_checksums_.load();
  std::vector<PendingBlock*> op_block;
  absl::Duration waited;
  {
    absl::MutexLock lock(&mu_);
    if (whole_blocks) declined = DeclineNewBlocks(ns, keys);
    if (staging_wait > absl::ZeroDuration() && CountNewBlocks(ns, keys, declined) > 0) {
      // Room for one new block is enough to go on: the call takes what fits then, and its
      // caller offers the rest again. (Waiting for room for the whole call held a session to
      // one call's blocks in flight: 0.15-0.30 of raw writes against 0.46-0.53 with retries.)
      const uint64_t block = uint64_t{info.num_objects} * RoundUp4K(info.object_len);
      // Staging is given back under mu_ (ReleasePending), so the condition is looked at again
      // each time some is.
      auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || store_staging_->HasRoomFor(owner, block);
      };
      const absl::Time wait_from = absl::Now();
      mu_.AwaitWithTimeout(absl::Condition(&room), staging_wait);
      waited = absl::Now() - wait_from;
    }
    NewBlockStaging fresh_staging;
    fresh_staging.left = CountNewBlocks(ns, keys, declined);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (declined.contains(keys[i])) {
        outcomes[i] = CaptureOutcome::kDeclined;
        if (!keeps_front) continue;
        if (auto seen = front_seen.find(keys[i]); seen != front_seen.end()) {
          outcomes[i] = seen->second;  // repeated in the call: copied once
          continue;
        }
        if (uint8_t* chunk = front_->TakeChunk(&stats_.front_dropped); chunk == nullptr) {
          ++stats_.front_dropped;  // no chunk free (all held by promotions, pins or readers)
        } else {
          outcomes[i] = CaptureOutcome::kInDram;
          front_new.push_back(FrontCopy{keys[i], chunk});
          const uint32_t block = engine_blocks.empty() ? static_cast<uint32_t>(i) : engine_blocks[i];
          for (uint32_t obj = 0; obj < info.num_objects; ++obj) {
            ops.push_back(engine::CopyOp{block, obj, chunk + uint64_t{obj} * info.object_len});
          }
        }
        front_seen.emplace(keys[i], outcomes[i]);
        continue;
      }
      if (index_.Find(ns, keys[i]) != nullptr) {
        outcomes[i] = CaptureOutcome::kAlreadyPresent;
        continue;
      }
      auto it = pending_.find(PendingKey{ns, keys[i]});
      PendingBlock* p = it == pending_.end() ? nullptr : it->second.get();
      if (p == nullptr) {
        std::vector<uint8_t*> frames =
            TakeNewBlockStaging(info, owner, &fresh_staging, &outcomes[i]);
        if (frames.empty()) continue;
        auto fresh = std::make_unique<PendingBlock>();
        fresh->owner = owner;
        fresh->frame_bytes = RoundUp4K(info.object_len);
        fresh->chunk_bytes = uint64_t{info.num_objects} * fresh->frame_bytes;
        fresh->frames = std::move(frames);
        fresh->ns = ns;
        fresh->key = keys[i];
        fresh->object_len = info.object_len;
        fresh->parts = info.parts;
        fresh->layer_captured.assign(layers, 0);
        fresh->layers_left = layers;
        fresh->touched_ms = clock_->NowMs();
        fresh->admission_asked = whole_blocks;
        fresh->epoch = next_epoch_++;  // before its first gather (PendingBlock::epoch)
        p = fresh.get();
        pending_.emplace(PendingKey{ns, keys[i]}, std::move(fresh));
        created.push_back(p);
      } else if (p->declined) {
        outcomes[i] = CaptureOutcome::kDeclined;  // complete and declined: a call is dropping it
        continue;
      } else if (p->queued || p->abandoned) {
        // Queued: being written. Abandoned: its owner went away; it goes when its copy ends.
        outcomes[i] = p->queued ? CaptureOutcome::kAlreadyPresent : CaptureOutcome::kFailed;
        continue;
      }
      touched[i] = p;
      // Another call copying into it now: which of the two copies lands last is unknown.
      if (p->capturing > 0) p->gather_sums_usable = false;
      ++p->capturing;
      for (uint32_t l = layer_begin; l < layer_end; ++l) {
        if (p->layer_captured[l]) continue;
        for (uint32_t part = 0; part < info.parts; ++part) {
          const uint32_t obj = l * info.parts + part;
          const uint32_t block =
              engine_blocks.empty() ? static_cast<uint32_t>(i) : engine_blocks[i];
          ops.push_back(engine::CopyOp{block, obj, p->frames[obj]});
          if (gather_sums) {
            op_block.resize(ops.size(), nullptr);
            op_block.back() = p;
          }
        }
      }
    }
    if (whole_blocks) stats_.blocks_admitted += created.size();  // admitted and given staging
  }
  // Copy outside the lock. A pending block stays while `capturing` > 0: it is
  // neither queued nor reaped nor dropped until every call copying into it has
  // finished (and its ns, key and epoch never change).
  std::vector<engine::ObjectSum> sums;
  if (gather_sums) {
    op_block.resize(ops.size(), nullptr);
    sums.resize(ops.size());
    for (size_t k = 0; k < ops.size(); ++k) {
      const PendingBlock* p = op_block[k];
      if (p == nullptr) continue;
      sums[k].seed = pool::ObjectChecksumSeed(p->ns, p->key, p->epoch, ops[k].object);
      ops[k].sum = &sums[k];
    }
  }
  const absl::Time t0 = absl::Now();
  absl::Status gathered = gather(ops);
  const absl::Time gathered_at = absl::Now();
  log::Get("store")->debug("capture of {} objects: gather {:.2f} ms", ops.size(),
                           absl::ToDoubleMilliseconds(gathered_at - t0));
  std::vector<std::shared_ptr<DurableTicket>> tickets(keys.size());
  absl::MutexLock lock(&mu_);
  for (PendingBlock* p : touched) {
    if (p != nullptr) --p->capturing;
  }
  if (!gathered.ok()) {
    // Blocks this call made go (unless another call is filling one: the reaper drops it if it
    // stays partial); so do abandoned ones nobody copies into now.
    for (PendingBlock* p : created) {
      if (p->capturing == 0) p->abandoned = true;
    }
    for (const FrontCopy& c : front_new) front_->GiveBack(c.chunk);
    ReleaseAbandoned(touched);
    return gathered;
  }
  // The checksums that came with the gather, before any block of the call is queued.
  for (size_t k = 0; k < sums.size(); ++k) {
    PendingBlock* p = op_block[k];
    if (p == nullptr || !sums[k].done || !p->gather_sums_usable) continue;
    const uint32_t n = static_cast<uint32_t>(p->frames.size());
    if (p->summed_at_gather.empty()) {
      p->summed_at_gather.assign(n, 0);
      p->checksums.assign(n, 0);
    }
    p->checksums[ops[k].object] = sums[k].value;
    p->summed_at_gather[ops[k].object] = 1;
  }
  const int64_t now = clock_->NowMs();
  std::shared_ptr<QueuedCall> call;  // the blocks this call queues (tail-first recency)
  for (size_t i = 0; i < keys.size(); ++i) {
    PendingBlock* p = touched[i];
    if (p == nullptr) continue;
    if (p->abandoned) {
      outcomes[i] = CaptureOutcome::kFailed;
      continue;
    }
    p->touched_ms = now;
    for (uint32_t l = layer_begin; l < layer_end; ++l) {
      if (!p->layer_captured[l]) {
        p->layer_captured[l] = 1;
        --p->layers_left;
      }
    }
    if (p->layers_left == 0 && !p->queued && p->capturing == 0) {
      if (DeclineCompleted(p)) {
        outcomes[i] = KeepInFront(p) ? CaptureOutcome::kInDram : CaptureOutcome::kDeclined;
        continue;  // released below, once `touched` is no longer read
      }
      MarkFrontPromotion(p);  // its second sight, if the DRAM front keeps it
      if (options_.tail_first) {
        if (call == nullptr) call = std::make_shared<QueuedCall>();
        p->call = call;
      }
      QueueForWriter(p);
    }
    if (wait_durable && p->queued) {
      tickets[i] = std::make_shared<DurableTicket>();
      p->tickets.push_back(tickets[i]);
    }
  }
  for (const FrontCopy& c : front_new) {
    // Another call may have kept or captured the key meanwhile: this copy is not needed then.
    if (front_->Find(ns, c.key) != nullptr || index_.Find(ns, c.key) != nullptr ||
        pending_.contains(PendingKey{ns, c.key})) {
      front_->GiveBack(c.chunk);
      continue;
    }
    front_->Insert(ns, c.key, info.object_len, info.num_objects, c.chunk, &stats_.front_dropped);
    ++stats_.front_kept;
  }
  ReleaseAbandoned(touched);
  ++stats_.captures;
  stats_.capture_seconds += absl::ToDoubleSeconds(absl::Now() - entered);
  stats_.capture_wait_seconds += absl::ToDoubleSeconds(waited);
  stats_.capture_gather_seconds += absl::ToDoubleSeconds(gathered_at - t0);
  if (wait_durable) {
    auto all_done = [&tickets]() {
      for (const auto& t : tickets) {
        if (t && !t->done) return false;
      }
      return true;
    };
    mu_.Await(absl::Condition(&all_done));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (tickets[i]) outcomes[i] = tickets[i]->outcome;
    }
  }
  return outcomes;
}

void BlockStore::Impl::ReleaseAbandoned(absl::Span<PendingBlock* const> touched) {
  // `touched` may name a block more than once (a key repeated in one call): release each once.
  absl::flat_hash_set<PendingBlock*> gone;
  for (PendingBlock* p : touched) {
    if (p == nullptr || p->capturing > 0 || p->queued) continue;
    if (p->abandoned || p->declined) gone.insert(p);
  }
  for (PendingBlock* p : gone) {
    stats_.pending_dropped += p->abandoned;  // declined ones are counted in blocks_declined
    ReleasePending(p);
  }
}

uint64_t BlockStore::Impl::DropPending(uint64_t owner) {
  if (owner == 0) return 0;
  absl::MutexLock lock(&mu_);
  uint64_t dropped = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    PendingBlock* p = (it++)->second.get();  // advanced first: ReleasePending erases p's entry
    if (p->owner != owner || p->queued || p->abandoned) continue;
    ++dropped;
    if (p->capturing > 0) {
      p->abandoned = true;  // the Capture copying into it releases it
    } else {
      ++stats_.pending_dropped;
      ReleasePending(p);
    }
  }
  return dropped;
}

void BlockStore::Impl::Flush() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return write_queue_.empty() && writing_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
}

StoreStats BlockStore::Impl::Stats() const {
  absl::MutexLock lock(&mu_);
  StoreStats s = stats_;
  s.slots_total = index_.num_slots();
  s.slots_used = index_.num_slots() - index_.free_slots();
  s.slot_bytes = options_.layout.slot_bytes();
  s.dram_capacity = dram_->capacity();
  s.dram_used = dram_->used();
  if (front_->enabled()) {  // "dram_front": the tier is the front
    s.dram_capacity = front_->max_blocks() * front_->chunk_bytes();
    s.dram_used = front_->blocks() * front_->chunk_bytes();
  }
  s.front_blocks = front_->blocks();
  s.store_staging_used = store_staging_->used_bytes();
  s.store_staging_bytes = store_staging_->capacity_bytes();
  s.admission = std::string(admission_->name());
  datapath::ReadCountersSnapshot reads = reader_->counters();
  if (gpu_reader_ != nullptr) reads += gpu_reader_->counters();
  s.read_ios = reads.ios;
  s.read_io_bytes = reads.io_bytes;
  s.read_objects = reads.objects;
  s.read_merged_ios = reads.merged_ios;
  s.read_staging_waits = reads.staging_waits;
  s.read_staging_yields = reads.staging_yields;
  s.read_lead_wait_seconds = reads.lead_wait_ns * 1e-9;
  s.read_lead_sink_seconds = reads.lead_sink_ns * 1e-9;
  s.read_lead_post_seconds = reads.lead_post_ns * 1e-9;
  s.read_layers = reads.layers;
  s.read_calls = reads.calls;
  s.read_call_seconds = reads.call_ns * 1e-9;
  s.read_batches = reads.batches;
  s.read_batch_slot_seconds = reads.batch_slot_ns * 1e-9;
  s.read_batch_io_seconds = reads.batch_io_ns * 1e-9;
  s.read_batch_check_seconds = reads.batch_check_ns * 1e-9;
  s.read_batch_release_seconds = reads.batch_release_ns * 1e-9;
  s.write_backlog_bytes = backlog_bytes_;
  s.write_backlog_blocks = backlog_queued_ms_.size();
  if (!backlog_queued_ms_.empty()) {
    s.write_backlog_age_ms = static_cast<uint64_t>(
        std::max<int64_t>(0, clock_->NowMs() - *backlog_queued_ms_.begin()));
  }
  s.io = scheduler_->stats();
  if (const absl::Status lost = journal_->durability(); !lost.ok()) {
    s.durability_lost = true;
    s.durability_error = std::string(lost.message());
  }
  s.namespaces.clear();
  for (const auto& [id, info] : namespaces_) {
    NamespaceInfo n = info;
    n.blocks = index_.CountNamespace(id);  // O(1): Stats never walks the index under mu_
    n.blocks_dram = dram_->CountNamespace(id) + front_->CountNamespace(id);
    s.namespaces.push_back(std::move(n));
  }
  return s;
}

// --- BlockStore: the public face ---

absl::StatusOr<std::unique_ptr<BlockStore>> BlockStore::Open(const StoreOptions& options,
                                                             std::unique_ptr<io::IoBackend> backend,
                                                             Clock* clock) {
  if (backend == nullptr || clock == nullptr) {
    return absl::InvalidArgumentError("BlockStore::Open needs a backend and a clock");
  }
  if (options.pending_ttl_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("StoreOptions.pending_ttl_ms must be > 0, got ",
                                                   options.pending_ttl_ms));
  }
  if (options.max_read_bytes < 4096 || options.max_read_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StoreOptions.max_read_bytes must be a positive multiple of 4096, got ",
        options.max_read_bytes));
  }
  if (options.max_write_backlog_age_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("StoreOptions.max_write_backlog_age_ms must be > 0, got ",
                     options.max_write_backlog_age_ms));
  }
  if (backend->num_files() != options.layout.num_files()) {
    return absl::InvalidArgumentError(absl::StrCat("the I/O backend has ", backend->num_files(),
                                                   " files; the pool layout has ",
                                                   options.layout.num_files()));
  }
  if (options.layout.num_slots() > Index::kMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the pool has ", options.layout.num_slots(), " slots; the index holds at most ",
        Index::kMaxSlots, ": use larger objects (pool.object_bytes) or a smaller pool"));
  }
  for (uint32_t f = 0; f < backend->num_files(); ++f) {
    if (backend->file_size(f) < options.layout.file_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool file ", f, " has ", backend->file_size(f), " bytes; the layout needs ",
                       options.layout.file_bytes()));
    }
  }
  auto impl = std::make_unique<Impl>(options, std::move(backend), clock);
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<BlockStore>(new BlockStore(std::move(impl)));
}

BlockStore::BlockStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlockStore::~BlockStore() = default;

absl::StatusOr<NamespaceInfo> BlockStore::CheckNamespace(
    const tutti::v1::Namespace& ns) const {
  return impl_->CheckNamespace(ns);
}

absl::StatusOr<NamespaceId> BlockStore::RegisterNamespace(const tutti::v1::Namespace& ns) {
  ASSIGN_OR_RETURN(NamespaceId id, impl_->RegisterNamespace(ns, NamespaceScope{}, nullptr));
  impl_->EndClaim(id);
  return id;
}
absl::StatusOr<NamespaceClaim> BlockStore::RegisterNamespace(const tutti::v1::Namespace& ns,
                                                             const NamespaceScope& scope,
                                                             const NamespaceSessions& sessions) {
  ASSIGN_OR_RETURN(NamespaceId id, impl_->RegisterNamespace(ns, scope, sessions));
  return NamespaceClaim(this, id);
}
absl::StatusOr<RemovedNamespace> BlockStore::RemoveNamespace(NamespaceId id,
                                                             const NamespaceSessions& sessions) {
  return impl_->RemoveNamespace(id, sessions);
}
void BlockStore::EndClaim(NamespaceId id) { impl_->EndClaim(id); }
NamespaceClaim::~NamespaceClaim() {
  if (store_ != nullptr) store_->EndClaim(id_);
}
absl::StatusOr<NamespaceInfo> BlockStore::GetNamespace(NamespaceId id) const {
  return impl_->GetNamespace(id);
}
uint32_t BlockStore::LookupAndPin(NamespaceId ns, absl::Span<const Key> keys,
                                  std::vector<bool>* in_dram) {
  return impl_->LookupAndPin(ns, keys, in_dram);
}
void BlockStore::Unpin(NamespaceId ns, absl::Span<const Key> keys) { impl_->Unpin(ns, keys); }
const datapath::BandwidthMeter& BlockStore::read_bandwidth() const {
  return impl_->read_bandwidth();
}
EventHub& BlockStore::events() const { return impl_->events(); }

absl::StatusOr<std::unique_ptr<datapath::PreparedRead>> BlockStore::PrepareRead(
    const datapath::RetrieveRequest& request) {
  return impl_->PrepareRead(request);
}
datapath::LayerReader* BlockStore::reader(bool into_gpu_memory) const {
  return impl_->reader(into_gpu_memory);
}
absl::Status BlockStore::Read(NamespaceId ns, absl::Span<const Key> keys, uint32_t layer_begin,
                              uint32_t layer_end, const LayerSink& sink,
                              absl::Span<const uint32_t> engine_blocks) {
  return datapath::ReadPrepared(
      datapath::RetrieveRequest{ns, keys, layer_begin, layer_end, engine_blocks}, this, reader(),
      sink);
}
absl::StatusOr<std::vector<CaptureOutcome>> BlockStore::Capture(
    NamespaceId ns, absl::Span<const Key> keys, uint32_t layer_begin, uint32_t layer_end,
    const Gatherer& gather, bool wait_durable, uint64_t owner, absl::Duration staging_wait,
    absl::Span<const uint32_t> engine_blocks) {
  return impl_->Capture(ns, keys, layer_begin, layer_end, gather, wait_durable, owner, staging_wait,
                        engine_blocks);
}
uint64_t BlockStore::DropPending(uint64_t owner) { return impl_->DropPending(owner); }
void BlockStore::Flush() { impl_->Flush(); }
std::pair<uint64_t, uint64_t> BlockStore::Evict(NamespaceId ns) { return impl_->Evict(ns); }
StoreStats BlockStore::Stats() const { return impl_->Stats(); }
absl::Status BlockStore::SetWriteBacklogBounds(uint64_t max_bytes, int64_t max_age_ms) {
  return impl_->SetWriteBacklogBounds(max_bytes, max_age_ms);
}
absl::Span<uint8_t> BlockStore::staging_region() const { return impl_->staging_region(); }
absl::Span<uint8_t> BlockStore::retrieve_staging_region() const {
  return impl_->retrieve_staging_region();
}
absl::Span<uint8_t> BlockStore::dram_region() const { return impl_->dram_region(); }
datapath::Verifier* BlockStore::cpu_verifier() const { return impl_->cpu_verifier(); }
absl::Status BlockStore::StageReadsOnGpu(absl::Span<uint8_t> device, datapath::Verifier* placing,
                                         uint32_t depth) {
  return impl_->StageReadsOnGpu(device, placing, depth);
}
void BlockStore::SetReadVerifier(datapath::Verifier* v) { impl_->SetReadVerifier(v); }
void BlockStore::SetGatherChecksums(bool on) { impl_->SetGatherChecksums(on); }

}  // namespace tutti::store

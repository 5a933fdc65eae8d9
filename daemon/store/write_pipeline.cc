// BlockStore's write pipeline. The writer thread gives batches of queued blocks slots
// (block_writer.cc), checksums (on the checksum pool) and slot headers, and hands their writes
// to the data path as one transfer (daemon/datapath/write_transfer.h: merged per file and
// extent, posted through the I/O scheduler); the committer thread takes each batch once its
// writes completed, syncs the pool files written (in parallel), appends the Puts and syncs the
// journal once for every batch written by then, and publishes the blocks. So the next batches'
// checksums and writes go on while one is synced and committed, and the devices have their writes
// queued.
#include <algorithm>
#include <cstring>
#include <deque>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/align.h"
#include "common/log.h"
#include "daemon/datapath/read_plan.h"
#include "daemon/pool/slot_header.h"
#include "daemon/store/block_store_impl.h"

namespace tutti::store {
namespace {

constexpr absl::Duration kWriterIdleWake = absl::Milliseconds(500);
// Objects checksummed per task of the checksum pool (8 x 32 KiB: a quarter MiB).
constexpr size_t kChecksumGrain = 8;
// One write never grows past this by merging pieces.
constexpr uint32_t kMaxMergedWriteBytes = 1u << 30;

double MsBetween(absl::Time a, absl::Time b) { return absl::ToDoubleMilliseconds(b - a); }

}  // namespace

void BlockStore::Impl::WriterLoop() {
  for (;;) {
    std::vector<PendingBlock*> blocks;
    uint8_t* headers = nullptr;
    {
      absl::MutexLock lock(&mu_);
      // A batch starts while fewer than write_batches_in_flight have writes in flight: a header
      // set is then free. Batches written and waiting for the committer do not hold one.
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return (!write_queue_.empty() && !free_header_sets_.empty()) ||
               (stopping_ && write_queue_.empty());
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), kWriterIdleWake);
      if (stopping_ && write_queue_.empty()) {
        writer_done_ = true;
        return;
      }
      if (!free_header_sets_.empty()) {
        while (!write_queue_.empty() && blocks.size() < options_.write_batch_blocks) {
          blocks.push_back(write_queue_.front());
          write_queue_.pop_front();
        }
        if (!blocks.empty()) {
          ++writing_;
          headers = free_header_sets_.back();
          free_header_sets_.pop_back();
        }
      }
    }
    // Busy or idle: a steady stream of other blocks must not keep stale ones alive.
    ReapStalePending();
    if (blocks.empty()) continue;
    std::unique_ptr<InFlightBatch> batch = StartBatch(std::move(blocks), headers);
    absl::MutexLock lock(&mu_);
    in_flight_.push_back(std::move(batch));
  }
}

void BlockStore::Impl::CommitLoop() {
  for (;;) {
    std::vector<std::unique_ptr<InFlightBatch>> written;  // the oldest batches, as far as written
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return (!in_flight_.empty() && in_flight_.front()->written) ||
               (writer_done_ && in_flight_.empty());
      };
      mu_.Await(absl::Condition(&ready));
      if (in_flight_.empty()) return;  // the writer is done, and so is every batch
      while (!in_flight_.empty() && in_flight_.front()->written) {
        written.push_back(std::move(in_flight_.front()));
        in_flight_.pop_front();
      }
    }
    CommitBatches(std::move(written));
  }
}

std::unique_ptr<InFlightBatch> BlockStore::Impl::StartBatch(
    std::vector<PendingBlock*> blocks, uint8_t* headers) {
  auto log = log::Get("store");
  auto b = std::make_unique<InFlightBatch>();
  b->blocks = std::move(blocks);
  b->headers = headers;
  b->started = b->slotted = b->summed = absl::Now();
  if (absl::Status lost = journal_->durability(); !lost.ok()) {
    // Nothing can be made durable: fail the batch before it evicts or writes.
    TUTTI_LOG_EVERY_N_SEC(log, spdlog::level::err, 5, "batch of {} blocks failed: {}",
                          b->blocks.size(), std::string(lost.message()));
    for (PendingBlock* p : b->blocks) p->ok = false;
    b->durability_lost = true;
  } else {
    std::vector<uint64_t> victim_slots;
    const uint64_t last_delete = AssignSlots(b->blocks, &victim_slots);
    if (!victim_slots.empty()) {
      // The evicted blocks' Delete records must be durable before their slots are
      // overwritten.
      absl::Status s = journal_->Sync(last_delete);
      if (!s.ok()) {
        TUTTI_LOG_EVERY_N_SEC(log, spdlog::level::err, 5, "journal sync failed: {}",
                              s.ToString());
        for (PendingBlock* p : b->blocks) {
          if (p->has_slot && std::count(victim_slots.begin(), victim_slots.end(), p->slot)) {
            p->ok = false;
            p->has_slot = false;  // out of use until restart: its old block may
                                  // still be journaled
          }
        }
      }
    }
    b->slotted = absl::Now();
    FillPromotedFrames(b->blocks);
    ComputeChecksums(b->blocks);
    b->summed = absl::Now();
    b->transfer = PrepareBatchWrites(b->blocks, headers);
  }
  if (b->transfer == nullptr) {  // nothing to write
    b->transfer = datapath::WriteTransfer::Prepare(options_.layout, {}, kMaxMergedWriteBytes);
  }
  b->posted = absl::Now();
  // Through the scheduler: the pool's reads go first, these fill the time they leave. A batch with
  // nothing to write completes at once, on this thread.
  InFlightBatch* raw = b.get();
  raw->transfer->Post(scheduler_.get(), [this, raw] {
    absl::MutexLock lock(&mu_);
    raw->written = true;
    free_header_sets_.push_back(raw->headers);  // its header pages are on the devices
    raw->headers = nullptr;
  });
  return b;
}

void BlockStore::Impl::ComputeChecksums(absl::Span<PendingBlock* const> blocks) {
  std::vector<std::pair<PendingBlock*, uint32_t>> objects;  // (block, object index)
  uint64_t at_gather = 0;
  for (PendingBlock* p : blocks) {
    if (!p->ok) continue;
    const uint32_t n = static_cast<uint32_t>(p->frames.size());
    p->checksums.resize(n);
    // Capture set these under mu_ before it queued the block, which this thread took under mu_.
    const bool gathered = p->gather_sums_usable && p->summed_at_gather.size() == n;
    for (uint32_t j = 0; j < n; ++j) {
      if (gathered && p->summed_at_gather[j]) {
        ++at_gather;
      } else {
        objects.emplace_back(p, j);
      }
    }
  }
  if (at_gather > 0 || !objects.empty()) {
    absl::MutexLock lock(&mu_);
    stats_.write_objects_summed_at_gather += at_gather;
    stats_.write_objects_summed_by_writer += objects.size();
  }
  checksum_pool_->ParallelFor(objects.size(), kChecksumGrain, [&objects](size_t i) {
    PendingBlock* p = objects[i].first;
    const uint32_t j = objects[i].second;
    p->checksums[j] = pool::ObjectChecksum(p->ns, p->key, p->epoch, j, p->frames[j], p->object_len);
  });
}

std::unique_ptr<datapath::WriteTransfer> BlockStore::Impl::PrepareBatchWrites(
    absl::Span<PendingBlock* const> blocks, uint8_t* headers) {
  const auto& layout = options_.layout;
  std::vector<uint32_t> order;  // ok blocks, by where their headers go
  for (uint32_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b]->ok) order.push_back(b);
  }
  auto header_place = [&](uint32_t b) {
    const pool::Location l = layout.HeaderLocation(blocks[b]->slot);
    return std::make_pair(l.file, l.offset);
  };
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return header_place(a) < header_place(b); });
  std::vector<datapath::WriteBlock> writes;
  for (size_t i = 0; i < order.size(); ++i) {
    const uint32_t b = order[i];
    PendingBlock* p = blocks[b];
    uint8_t* header = headers + i * pool::kSlotHeaderBytes;
    const pool::SlotHeader h{p->ns, p->key, p->epoch, p->object_len, p->checksums};
    if (!pool::EncodeSlotHeader(h, absl::MakeSpan(header, pool::kSlotHeaderBytes)).ok()) {
      p->ok = false;
      continue;
    }
    writes.push_back(datapath::WriteBlock{b, p->slot, p->frames, p->frame_bytes, header});
  }
  return datapath::WriteTransfer::Prepare(layout, writes, kMaxMergedWriteBytes);
}

uint64_t BlockStore::Impl::FailBlocksOfFailedWrites(const InFlightBatch& b) {
  for (const datapath::FailedWrite& w : b.transfer->FailedWrites()) {
    const io::IoRequest& r = w.request;
    const std::string error = r.result < 0 ? std::strerror(static_cast<int>(-r.result))
                                           : absl::StrCat("short: ", r.result, " bytes");
    TUTTI_LOG_EVERY_N_SEC(log::Get("store"), spdlog::level::err, 5,
                          "pool file {} offset {}: write of {} bytes failed ({}, {}); block {} "
                          "dropped, {} blocks in all",
                          r.file, r.offset, r.len, r.result, error,
                          b.blocks[w.first_block]->key.Hex(), w.num_pieces);
  }
  uint64_t blocks = 0;
  for (const uint32_t i : b.transfer->FailedBlocks()) {
    if (b.blocks[i]->ok) {
      b.blocks[i]->ok = false;
      ++blocks;
    }
  }
  return blocks;
}

absl::Status BlockStore::Impl::SyncPoolFiles(const std::vector<bool>& files) {
  std::vector<uint32_t> list;
  for (uint32_t f = 0; f < files.size(); ++f) {
    if (files[f]) list.push_back(f);
  }
  std::vector<absl::Status> results(list.size());
  sync_pool_->ParallelFor(list.size(), 1, [&](size_t i) { results[i] = backend_->Sync(list[i]); });
  absl::Status first;
  for (size_t i = 0; i < list.size(); ++i) {
    if (results[i].ok()) continue;
    TUTTI_LOG_EVERY_N_SEC(log::Get("store"), spdlog::level::err, 5, "pool file {}: sync failed: {}",
                          list[i], results[i].ToString());
    if (first.ok()) first = results[i];
  }
  return first;
}

void BlockStore::Impl::CommitBatches(std::vector<std::unique_ptr<InFlightBatch>> batches) {
  auto log = log::Get("store");
  const absl::Time t0 = absl::Now();
  uint64_t io_errors = 0, ok_blocks = 0, all_blocks = 0;
  std::vector<bool> files(backend_->num_files(), false);
  for (const auto& b : batches) {
    io_errors += FailBlocksOfFailedWrites(*b);
    b->transfer->MarkFilesWritten(&files);
    for (const PendingBlock* p : b->blocks) ok_blocks += p->ok;
    all_blocks += b->blocks.size();
  }
  if (io_errors > 0) {
    absl::MutexLock lock(&mu_);
    stats_.io_errors += io_errors;
  }
  // Each Put only after the pool syncs covering its block's writes (all completed before them).
  absl::Status committed;
  if (ok_blocks > 0) committed = SyncPoolFiles(files);
  const absl::Time synced = absl::Now();
  if (ok_blocks > 0 && committed.ok()) {
    uint64_t last_put = 0;
    for (const auto& b : batches) {
      for (const PendingBlock* p : b->blocks) {
        if (!p->ok) continue;
        last_put = journal_->Append(
            PutRecord{p->ns, p->key, p->slot, p->epoch, p->object_len, p->checksums});
      }
    }
    committed = journal_->Sync(last_put);
  }
  const absl::Time t1 = absl::Now();
  if (!committed.ok()) {
    TUTTI_LOG_EVERY_N_SEC(log, spdlog::level::err, 5,
                          "making {} blocks of {} batches durable failed: {}; dropped", ok_blocks,
                          batches.size(), committed.ToString());
    for (const auto& b : batches) {
      for (PendingBlock* p : b->blocks) p->ok = false;
    }
  }
  {
    // A failed block gives its slot back. Should its Put have reached the
    // journal anyway, the object checksums (seeded by key and epoch) make the
    // next block in that slot fail to verify under the old key, so a stale
    // record can only produce a miss.
    absl::MutexLock lock(&mu_);
    for (const auto& b : batches) {
      for (PendingBlock* p : b->blocks) {
        if (!p->ok && p->has_slot) index_.ReleaseSlot(p->slot);
      }
    }
  }
  for (const auto& b : batches) {
    log->debug("batch of {} blocks in {} writes: slots and checksums {:.2f} ms, writes {:.2f} ms",
               b->blocks.size(), b->transfer->num_writes(), MsBetween(b->started, b->posted),
               MsBetween(b->posted, t0));
    Publish(b->blocks);
  }
  log->debug("{} batches of {} blocks committed: pool syncs and journal {:.2f} ms", batches.size(),
             all_blocks, MsBetween(t0, t1));
  if (std::any_of(batches.begin(), batches.end(),
                  [](const auto& b) { return !b->durability_lost; })) {
    MaybeCheckpoint();
  }
  absl::MutexLock lock(&mu_);
  stats_.write_batches += batches.size();
  ++stats_.write_commits;
  stats_.write_commit_seconds += absl::ToDoubleSeconds(t1 - t0);
  stats_.write_commit_sync_seconds += absl::ToDoubleSeconds(synced - t0);
  for (const auto& b : batches) {
    stats_.write_prepare_seconds += absl::ToDoubleSeconds(b->posted - b->started);
    stats_.write_slot_seconds += absl::ToDoubleSeconds(b->slotted - b->started);
    stats_.write_checksum_seconds += absl::ToDoubleSeconds(b->summed - b->slotted);
    stats_.write_io_seconds += absl::ToDoubleSeconds(t0 - b->posted);
  }
  writing_ -= static_cast<int>(batches.size());  // after the checkpoint: Flush waits for it too
}

void BlockStore::Impl::FinishPending(PendingBlock* p, CaptureOutcome outcome) {
  EndFrontPromotion(p, index_.Find(p->ns, p->key));
  for (auto& t : p->tickets) {
    t->outcome = outcome;
    t->done = true;
  }
  ReleasePending(p);  // destroys *p
}

void BlockStore::Impl::FillPromotedFrames(absl::Span<PendingBlock* const> blocks) {
  checksum_pool_->ParallelFor(blocks.size(), 1, [&](size_t b) {
    PendingBlock* p = blocks[b];
    if (p->promote_from == nullptr) return;
    for (size_t j = 0; j < p->frames.size(); ++j) {
      std::memcpy(p->frames[j], p->promote_from->object(static_cast<uint32_t>(j)), p->object_len);
    }
    p->promote_from.reset();
  });
}

// Copies the durable blocks of `batch` into DRAM-tier chunks. Chunks are taken under the lock
// (taking one may evict) but filled outside it, on the checksum pool, so lookups and reads never
// wait on the copies.
std::vector<uint8_t*> BlockStore::Impl::CopyToDram(absl::Span<PendingBlock* const> batch) {
  std::vector<uint8_t*> chunks(batch.size(), nullptr);
  {
    absl::MutexLock lock(&mu_);
    for (size_t b = 0; b < batch.size(); ++b) {
      const PendingBlock* p = batch[b];
      if (p->ok && uint64_t{p->object_len} * p->frames.size() <= dram_->chunk_bytes()) {
        chunks[b] = dram_->TakeChunk();
      }
    }
  }
  checksum_pool_->ParallelFor(batch.size(), 1, [&](size_t b) {
    if (chunks[b] != nullptr) DramTier::FillChunk(chunks[b], batch[b]->object_len, batch[b]->frames);
  });
  return chunks;
}

std::vector<size_t> BlockStore::Impl::InsertOrder(absl::Span<PendingBlock* const> batch) const {
  std::vector<size_t> order(batch.size());
  std::iota(order.begin(), order.end(), 0);
  if (!options_.tail_first) return order;
  // Blocks one call queued are adjacent in the write queue, so in a batch: each such run last
  // first.
  for (size_t i = 0; i < batch.size();) {
    size_t end = i + 1;
    while (end < batch.size() && batch[i]->call != nullptr && batch[end]->call == batch[i]->call) {
      ++end;
    }
    std::reverse(order.begin() + i, order.begin() + end);
    i = end;
  }
  return order;
}

void BlockStore::Impl::UseEarlierOfCall(PendingBlock* last_of_run) {
  QueuedCall& call = *last_of_run->call;
  for (auto it = call.published.rbegin(); it != call.published.rend(); ++it) {
    if (Entry* e = index_.Find(last_of_run->ns, *it); e != nullptr) index_.Touch(e);
  }
}

void BlockStore::Impl::Publish(absl::Span<PendingBlock* const> batch) {
  const std::vector<uint8_t*> dram_chunks = CopyToDram(batch);
  absl::MutexLock lock(&mu_);
  auto publishable = [](const PendingBlock* p) { return p->ok && !p->over_share; };
  // Into the index (and the DRAM tier) first, in the recency order (InsertOrder); the outcomes
  // after, in the batch's order.
  const std::vector<size_t> order = InsertOrder(batch);
  for (size_t k = 0; k < order.size(); ++k) {
    PendingBlock* p = batch[order[k]];
    if (publishable(p)) {
      index_.Insert(p->ns, p->key, p->slot, p->epoch, p->object_len, p->checksums);
      if (dram_chunks[order[k]] != nullptr) {
        dram_->InsertChunk(p->ns, p->key, p->epoch, p->object_len,
                           static_cast<uint32_t>(p->frames.size()), dram_chunks[order[k]]);
      }
    }
    // The end of a call's run (its first block, inserted last): the call's blocks of earlier
    // batches come before it in the chain, so they are used again after it, last first.
    const bool run_ends =
        k + 1 == order.size() || p->call == nullptr || batch[order[k + 1]]->call != p->call;
    if (options_.tail_first && p->call != nullptr && run_ends) {
      UseEarlierOfCall(p);
      // This run's blocks join the call's published ones, in key order (order[k] is its first).
      for (size_t b = order[k]; b < batch.size() && batch[b]->call == p->call; ++b) {
        if (publishable(batch[b])) p->call->published.push_back(batch[b]->key);
      }
    }
  }
  for (size_t b = 0; b < batch.size(); ++b) {
    PendingBlock* p = batch[b];
    if (index_.Find(p->ns, p->key) != nullptr && !p->ok) {
      FinishPending(p, CaptureOutcome::kAlreadyPresent);
      continue;
    }
    if (p->over_share) {
      ++stats_.store_rejected;
      ++stats_.store_rejected_share;
      FinishPending(p, CaptureOutcome::kRejectedShare);
      continue;
    }
    if (!p->ok) {
      ++stats_.store_failed;
      FinishPending(p, CaptureOutcome::kFailed);
      continue;
    }
    events_.Publish(p->ns, BlockEventKind::kStored, p->key);
    ++stats_.blocks_stored;
    stats_.bytes_written += p->frames.size() * uint64_t{RoundUp4K(p->object_len)};
    FinishPending(p, CaptureOutcome::kDurable);
  }
}

}  // namespace tutti::store

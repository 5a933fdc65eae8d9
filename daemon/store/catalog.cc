// BlockStore's catalog: the blocks the index holds and who holds them. Lookups pin blocks (and
// DRAM-front blocks), Unpin lets go; a block whose read failed is retired (taken out of the index,
// its slot kept until its Delete is durable and its pins are gone); eviction hides blocks and
// frees their slots once their Deletes are durable. Namespaces, the catalog's other half, are
// namespaces.cc's. Every record goes to the journal thread by message (journal_writer.h); the
// rules are at the top of block_store_impl.h.
#include <algorithm>
#include <utility>
#include <vector>

#include "common/log.h"
#include "daemon/store/block_store_impl.h"

namespace tutti::store {

uint32_t BlockStore::Impl::LookupAndPin(NamespaceId ns, absl::Span<const Key> keys,
                                        std::vector<bool>* in_dram) {
  absl::MutexLock lock(&mu_);
  if (in_dram != nullptr) in_dram->clear();
  uint32_t hits = 0;
  std::vector<Entry*> used;  // tail-first recency: the pool's hits, used last first below
  for (const Key& key : keys) {
    Entry* e = index_.Find(ns, key);
    if (e == nullptr) {
      // Not on the SSD: in the DRAM front? A hit there is the block's second sight.
      DramFront::Entry* f = front_->Find(ns, key);
      if (f == nullptr) break;
      ++f->pins;
      if (!f->promoting) PromoteOnLookup(ns, key, f);
      if (in_dram != nullptr) in_dram->push_back(true);
      ++hits;
      continue;
    }
    ++e->pins;
    if (options_.tail_first) {
      used.push_back(e);
    } else {
      index_.Touch(e);
    }
    if (in_dram != nullptr) in_dram->push_back(dram_->Find(ns, key, e->epoch) != nullptr);
    ++hits;
  }
  // From the tail back to the head: the head is the most recent, so it is evicted last.
  for (auto it = used.rbegin(); it != used.rend(); ++it) index_.Touch(*it);
  ++stats_.lookups;
  stats_.lookup_blocks += keys.size();
  stats_.lookup_hits += hits;
  if (hits < keys.size()) ++stats_.lookup_misses;
  if (auto it = namespaces_.find(ns); it != namespaces_.end()) {
    it->second.lookup_hits += hits;
    it->second.lookup_misses += hits < keys.size();
  }
  return hits;
}

void BlockStore::Impl::Unpin(NamespaceId ns, absl::Span<const Key> keys) {
  absl::MutexLock lock(&mu_);
  for (const Key& key : keys) {
    const PendingKey pk{ns, key};
    auto retired = retired_.find(pk);
    if (retired != retired_.end() && retired->second.pins > 0) {
      --retired->second.pins;  // pins taken before the block left the index go first
    } else if (Entry* e = index_.Find(ns, key); e != nullptr && e->pins > 0) {
      --e->pins;
    } else if (DramFront::Entry* f = front_->Find(ns, key); f != nullptr && f->pins > 0) {
      --f->pins;
    }
    if (retired != retired_.end()) MaybeReleaseRetired(pk);
  }
}

void BlockStore::Impl::MaybeReleaseRetired(const PendingKey& key) {
  auto it = retired_.find(key);
  if (it == retired_.end() || it->second.pins > 0) return;
  const Entry* live = index_.Find(key.first, key.second);
  if (live != nullptr && live->pins > 0) return;  // a holder may be any of the key's readers
  std::vector<RetiredSlot>& slots = it->second.slots;
  for (auto s = slots.begin(); s != slots.end();) {
    if (s->delete_durable) {
      index_.ReleaseSlot(s->slot);
      s = slots.erase(s);
    } else {
      ++s;
    }
  }
  if (slots.empty()) retired_.erase(it);
}

void BlockStore::Impl::RetireFailedBlocks(NamespaceId ns, absl::Span<const FailedBlock> failed) {
  if (failed.empty()) return;
  struct Retiring {
    PendingKey key;
    uint64_t slot, epoch;
  };
  std::vector<Retiring> retiring;
  uint64_t last_delete = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const FailedBlock& f : failed) {
      Entry* e = index_.Find(ns, f.key);
      if (e == nullptr || e->epoch != f.epoch) continue;  // already retired, or replaced meanwhile
      const PendingKey pk{ns, f.key};
      RetiredKey& r = retired_[pk];
      r.pins += e->pins;
      r.slots.push_back(RetiredSlot{e->slot, e->epoch, false});
      retiring.push_back(Retiring{pk, e->slot, e->epoch});
      dram_->Erase(ns, f.key);
      e->pins = 0;
      index_.Remove(e);  // the slot stays taken until released from retired_
      events_.Publish(ns, BlockEventKind::kRemoved, f.key);
      // Appended after the entry left the index: a checkpoint never keeps it.
      last_delete = journal_->Append(DeleteRecord{ns, f.key, retiring.back().slot, f.epoch});
    }
  }
  if (retiring.empty()) return;
  // Outside mu_, one sync for all: a slot is rewritten only after its Delete is durable.
  const absl::Status synced = journal_->Sync(last_delete);
  if (!synced.ok()) {
    // Their Puts may still be the journal's last word on the slots: keep them out of use until
    // restart (recovery finds the blocks bad again).
    log::Get("store")->error("journal sync failed ({}); {} slots of failed blocks unused until "
                             "restart", synced.ToString(), retiring.size());
  }
  absl::MutexLock lock(&mu_);
  for (const Retiring& r : retiring) {
    auto it = retired_.find(r.key);
    if (it == retired_.end()) continue;
    std::vector<RetiredSlot>& slots = it->second.slots;
    for (auto s = slots.begin(); s != slots.end(); ++s) {
      if (s->slot != r.slot || s->epoch != r.epoch) continue;
      if (synced.ok()) {
        s->delete_durable = true;
      } else {
        slots.erase(s);
      }
      break;
    }
    MaybeReleaseRetired(r.key);
  }
}

uint64_t BlockStore::Impl::HideForEviction(Entry* e) {
  const DeleteRecord record{e->ns, e->key, e->slot, e->epoch};
  dram_->Erase(e->ns, e->key);
  index_.Remove(e);  // before the append: a checkpoint never holds a block whose Delete it drops
  events_.Publish(record.ns, BlockEventKind::kRemoved, record.key);
  ++stats_.evictions;
  return journal_->Append(record);  // queued: a leaf lock, never a wait
}

std::pair<uint64_t, uint64_t> BlockStore::Impl::Evict(NamespaceId ns) {
  std::vector<uint64_t> slots;
  uint64_t skipped = 0, last_delete = 0, evicted_front = 0;
  {
    absl::MutexLock lock(&mu_);
    std::vector<Entry*> victims;
    index_.ForEach([&](Entry* e) {
      if (ns != 0 && e->ns != ns) return;
      if (e->pins > 0) {
        ++skipped;
      } else {
        victims.push_back(e);
      }
    });
    for (Entry* e : victims) {
      slots.push_back(e->slot);
      last_delete = HideForEviction(e);
    }
    // The DRAM front's unpinned kept blocks go too (nothing to journal: they are not durable).
    const uint64_t front = front_->EraseNamespace(ns);
    stats_.front_dropped += front;
    if (slots.empty()) return {front, skipped};
    evicted_front = front;
  }
  // Outside mu_, and never behind the writer's pool writes: only behind the journal thread's
  // sync or checkpoint in progress, if any.
  absl::Status s = journal_->Sync(last_delete);
  absl::MutexLock lock(&mu_);
  if (s.ok()) {
    for (uint64_t slot : slots) index_.ReleaseSlot(slot);
  } else {
    log::Get("store")->error("evict: journal sync failed ({}); {} slots unused until restart",
                             s.ToString(), slots.size());
  }
  return {slots.size() + evicted_front, skipped};
}

}  // namespace tutti::store

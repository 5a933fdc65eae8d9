// Recovery (recovery.h): the journal replayed into the index, and the pool's slot headers probed
// when the journal held no block.
#include "daemon/store/recovery.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/log.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/pool/slot_header.h"

namespace tutti::store {

absl::StatusOr<NamespaceInfo> DescribeNamespace(const tutti::v1::Namespace& ns);  // namespaces.cc

namespace {

// Slot headers read at start when the journal recovered no block.
constexpr uint64_t kProbeSlots = 1024;

// Counts the slot headers among the first `max_slots` slots of the pool that decode: the blocks
// a pool holds that an empty index cannot find.
uint64_t CountUsedSlotHeaders(const pool::PoolLayout& layout, io::IoBackend* backend,
                              uint64_t max_slots) {
  const uint32_t d = layout.num_files();
  const uint64_t slots = std::min(layout.num_slots(), max_slots);
  const uint64_t per_file = (slots + d - 1) / d;  // headers of slots f, f + d, ... in file f
  const uint64_t file_bytes = per_file * pool::kSlotHeaderBytes;
  io::AlignedBuffer buf(file_bytes * d);
  std::vector<io::IoRequest> reqs;
  for (uint32_t f = 0; f < d && f < slots; ++f) {
    const pool::Location first = layout.HeaderLocation(f);
    reqs.push_back(io::IoRequest{io::Op::kRead, f, first.offset, buf.data() + f * file_bytes,
                                 static_cast<uint32_t>(file_bytes), 0});
  }
  backend->Execute(absl::MakeSpan(reqs));
  uint64_t used = 0;
  for (uint64_t slot = 0; slot < slots; ++slot) {
    const io::IoRequest& req = reqs[slot % d];
    if (req.result != req.len) continue;
    const uint8_t* page = buf.data() + (slot % d) * file_bytes + (slot / d) * pool::kSlotHeaderBytes;
    used += pool::DecodeSlotHeader(absl::MakeConstSpan(page, pool::kSlotHeaderBytes)).ok();
  }
  return used;
}

// The recovered blocks of namespaces that were not recovered (their record could not be read),
// which no Lookup can reach.
uint64_t CountUnknownNamespaceBlocks(
    const Index& index, const absl::flat_hash_map<NamespaceId, NamespaceInfo>& namespaces) {
  uint64_t orphans = 0;
  index.ForEach([&](const Entry* e) { orphans += !namespaces.contains(e->ns); });
  return orphans;
}

}  // namespace

absl::StatusOr<RecoveredState> RecoverStore(const StoreOptions& options, io::IoBackend* backend,
                                            Index* index) {
  auto log = log::Get("store");
  RecoveredState out;
  uint64_t skipped = 0, max_epoch = 0;
  // Blocks whose latest Put was skipped (and not deleted since): durable blocks not kept.
  absl::flat_hash_map<std::pair<NamespaceId, Key>, uint64_t> skipped_blocks;  // -> its epoch
  // The visitor runs inside Journal::Open.
  RecoveryVisitor visitor;
  visitor.on_namespace = [&](const NamespaceRecord& r) {
    tutti::v1::Namespace ns;
    if (!ns.ParseFromString(r.descriptor)) {
      ++skipped;
      return;
    }
    auto info = DescribeNamespace(ns);
    if (!info.ok()) return;
    info->id = r.ns;
    info->scope = r.scope;
    info->owner_uid = r.owner_uid;
    info->shared = r.shared;
    out.namespaces[r.ns] = *info;
    out.registered_order[r.ns] = out.next_order++;
  };
  visitor.on_namespace_drop = [&](const NamespaceDropRecord& r) {
    out.namespaces.erase(r.ns);
    out.registered_order.erase(r.ns);
  };
  visitor.on_put = [&](const PutRecord& r) {
    max_epoch = std::max(max_epoch, r.epoch);
    if (r.slot >= index->num_slots() || r.checksums.size() > options.layout.max_objects()) {
      ++skipped;  // written under another pool geometry
      skipped_blocks[{r.ns, r.key}] = r.epoch;
      return;
    }
    skipped_blocks.erase({r.ns, r.key});
    if (Entry* old = index->Find(r.ns, r.key)) {
      index->ReleaseSlot(old->slot);
      index->Remove(old);
    }
    if (Entry* other = index->AtSlot(r.slot)) {
      index->Remove(other);  // a later Put of this slot supersedes it
    }
    index->ClaimSlot(r.slot);
    Entry* e = index->Insert(r.ns, r.key, r.slot, r.epoch, r.object_len, r.checksums);
    // A checkpoint's put keeps its last use; a journal's counts as used when it was
    // stored, after every block of the checkpoint before it (OrderByLastUse below).
    if (r.last_use != 0) index->SetLastUse(e, r.last_use);
  };
  visitor.on_delete = [&](const DeleteRecord& r) {
    if (auto it = skipped_blocks.find({r.ns, r.key});
        it != skipped_blocks.end() && it->second == r.epoch) {
      skipped_blocks.erase(it);
    }
    Entry* e = index->Find(r.ns, r.key);
    if (e != nullptr && e->epoch == r.epoch) {
      index->ReleaseSlot(e->slot);
      index->Remove(e);
    }
  };
  RecoveryReport report;
  auto journal = Journal::Open(options.state_dir, visitor, &report);
  if (!journal.ok()) return journal.status();
  index->RebuildFreeList();
  index->OrderByLastUse();  // the recency order as it was when the checkpoint was written
  out.next_epoch = max_epoch + 1;
  out.journal = std::move(journal).value();
  log->info(
      "recovered {} blocks in {} namespaces from {} journal records ({} torn tails, {} "
      "skipped); {} of {} slots free",
      index->size(), out.namespaces.size(), report.records, report.torn_tails, skipped,
      index->free_slots(), index->num_slots());
  const uint64_t lost = skipped_blocks.size() + CountUnknownNamespaceBlocks(*index, out.namespaces);
  out.blocks_lost = lost;
  if (lost > 0) {
    log->warn("recovery kept {} fewer blocks than the journal had (other pool geometry or an "
              "unreadable namespace record); event subscribers are told (blocks_lost_at_start)",
              lost);
  }
  if (index->size() != 0) return out;
  const uint64_t probed = std::min(index->num_slots(), kProbeSlots);
  const uint64_t used = CountUsedSlotHeaders(options.layout, backend, probed);
  if (used > 0) {
    log->warn(
        "the journal in {} holds no block, but {} of the first {} slot headers of the pool hold "
        "one: the state directory was probably removed or replaced while the pool was kept. "
        "Those blocks cannot be found and their slots will be overwritten; if the old state "
        "directory still exists, stop tuttid and put it back",
        options.state_dir, used, probed);
  }
  out.unindexed_slot_headers = used;
  // The used headers include the skipped Puts' blocks, if any: the larger count, not the sum.
  out.blocks_lost = std::max(lost, used);
  return out;
}

}  // namespace tutti::store

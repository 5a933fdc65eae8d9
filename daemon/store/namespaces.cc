// BlockStore's namespaces: registration with an owner (docs/security.md "Namespaces"), the
// per-user and global bounds, dropping idle namespaces to make room, and removal.
//
// Why claims: a namespace is dropped only when it holds no blocks and no session uses it, but the
// server opens a session only after RegisterNamespace returned. A claim covers that gap. Every
// decision to drop reads the claims (under mu_) before it asks the server for its sessions, and
// holds ns_mu_ (which taking a claim needs) from before that read to the drop: so a namespace
// unclaimed at the read either had its session opened already (the server counts it) or will be
// registered afresh after the drop.
#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/store/block_store_impl.h"

namespace tutti::store {

NamespaceId NamespaceIdOf(const tutti::v1::Namespace& ns, const std::string& scope);

absl::StatusOr<NamespaceId> BlockStore::Impl::RegisterNamespace(const tutti::v1::Namespace& ns,
                                                                const NamespaceScope& scope,
                                                                const NamespaceSessions& sessions) {
  ASSIGN_OR_RETURN(NamespaceInfo info, CheckNamespace(ns));
  info.id = NamespaceIdOf(ns, scope.scope);
  info.scope = scope.scope;
  info.owner_uid = scope.uid;
  info.shared = scope.shared;
  absl::MutexLock one_change(&ns_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (namespaces_.contains(info.id)) {
      ++claims_[info.id];
      return info.id;
    }
  }
  RETURN_IF_ERROR(MakeRoomFor(scope.uid, sessions));
  // The entry is made on the journal thread once the record is durable, before it takes any
  // later message: so no checkpoint falls between the record and the entry. Never behind the
  // writer's pool I/O.
  const uint64_t seq = journal_->Append(
      NamespaceRecord{info.id, ns.SerializeAsString(), info.scope, info.owner_uid, info.shared});
  RETURN_IF_ERROR(journal_->SyncAndApply(seq, [this, &info] {
    absl::MutexLock lock(&mu_);
    namespaces_.emplace(info.id, info);
    registered_order_[info.id] = next_order_++;
    ++claims_[info.id];
  }));
  log::Get("store")->info(
      "namespace {:016x}: model {} layers {} parts {} object {} bytes; user {}{}", info.id,
      ns.model_id(), ns.layout().num_layers(), info.parts, info.object_len, info.owner_uid,
      info.shared ? (info.scope.empty() ? ", shared by every user" : ", shared by secret") : "");
  return info.id;
}

void BlockStore::Impl::EndClaim(NamespaceId id) {
  absl::MutexLock lock(&mu_);
  auto it = claims_.find(id);
  if (it == claims_.end()) return;
  if (--it->second == 0) claims_.erase(it);
}

absl::flat_hash_set<NamespaceId> BlockStore::Impl::NamespacesBusy() const {
  absl::flat_hash_set<NamespaceId> busy;
  for (const auto& [key, pending] : pending_) busy.insert(key.first);
  for (const auto& [key, retired] : retired_) busy.insert(key.first);
  for (const auto& [id, claims] : claims_) busy.insert(id);
  return busy;
}

uint64_t BlockStore::Impl::DropNamespaceLocked(NamespaceId id) {
  stats_.front_dropped += front_->EraseNamespace(id);  // its unpinned DRAM-front blocks
  namespaces_.erase(id);
  registered_order_.erase(id);
  return journal_->Append(NamespaceDropRecord{id});
}

absl::Status BlockStore::Impl::MakeRoomFor(uint32_t uid, const NamespaceSessions& sessions) {
  // Idle candidates first (claims are read before the sessions: see the file comment).
  std::vector<std::pair<uint64_t, NamespaceId>> candidates;  // (order, id), the user's own first
  bool user_full = false;
  {
    absl::MutexLock lock(&mu_);
    uint64_t own = 0;
    for (const auto& [id, info] : namespaces_) own += info.owner_uid == uid;
    user_full = own >= options_.max_namespaces_per_user;
    if (!user_full && namespaces_.size() < options_.max_namespaces) return absl::OkStatus();
    const absl::flat_hash_set<NamespaceId> busy = NamespacesBusy();
    for (const auto& [id, info] : namespaces_) {
      if ((!user_full || info.owner_uid == uid) && index_.CountNamespace(id) == 0 &&
          !busy.contains(id)) {
        const bool others = info.owner_uid != uid;
        candidates.emplace_back(registered_order_[id] + (others ? (1ull << 63) : 0), id);
      }
    }
  }
  std::sort(candidates.begin(), candidates.end());
  const absl::flat_hash_map<NamespaceId, uint32_t> in_use =
      sessions ? sessions() : absl::flat_hash_map<NamespaceId, uint32_t>{};
  uint64_t seq = 0;
  NamespaceId dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::flat_hash_set<NamespaceId> busy = NamespacesBusy();
    for (const auto& [order, id] : candidates) {
      if (in_use.contains(id) || !namespaces_.contains(id) || index_.CountNamespace(id) > 0 ||
          busy.contains(id)) {
        continue;
      }
      dropped = id;
      seq = DropNamespaceLocked(id);
      ++stats_.namespaces_dropped;
      break;
    }
  }
  if (dropped == 0) {
    if (user_full) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "user ", uid, " has ", options_.max_namespaces_per_user,
          " namespaces (limits.max_namespaces_per_user), none of them empty and unused; a new "
          "one is refused (tuttictl remove-namespace frees one)"));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "the store keeps ", options_.max_namespaces,
        " namespaces (limits.max_namespaces), none of them empty and unused; a new one is "
        "refused (tuttictl remove-namespace frees one)"));
  }
  log::Get("store")->info(
      "namespace {:016x} dropped (no blocks, no sessions) to make room for "
      "a new one of user {}",
      dropped, uid);
  return journal_->Sync(seq);
}

absl::Status BlockStore::Impl::CheckRemovable(NamespaceId id, const NamespaceSessions& sessions) {
  {
    absl::MutexLock lock(&mu_);
    if (!namespaces_.contains(id)) {
      return absl::NotFoundError(absl::StrCat("unknown namespace ", absl::Hex(id)));
    }
    if (claims_.contains(id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("namespace ", absl::Hex(id), " is being attached to; retry"));
    }
  }
  const absl::flat_hash_map<NamespaceId, uint32_t> in_use =
      sessions ? sessions() : absl::flat_hash_map<NamespaceId, uint32_t>{};
  if (auto it = in_use.find(id); it != in_use.end() && it->second > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("namespace ", absl::Hex(id), " has ", it->second,
                     " sessions attached; detach them first (or remove with force)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> BlockStore::Impl::EvictAndDropLocked(NamespaceId id,
                                                              std::vector<uint64_t>* slots) {
  std::vector<Entry*> victims;
  uint64_t pinned = 0, pending = 0;
  index_.ForEach([&](Entry* e) {
    if (e->ns != id) return;
    if (e->pins > 0) {
      ++pinned;
    } else {
      victims.push_back(e);
    }
  });
  for (const auto& [key, p] : pending_) pending += key.first == id;
  for (const auto& [key, r] : retired_) pinned += key.first == id ? r.pins : 0;
  if (pinned > 0 || pending > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("namespace ", absl::Hex(id), ": ", pinned,
                     " blocks pinned (by Lookups awaiting Retrieve) and ", pending,
                     " being stored; nothing removed. Retry once those end"));
  }
  for (Entry* e : victims) {
    slots->push_back(e->slot);
    HideForEviction(e);
  }
  ++stats_.namespaces_removed;
  return DropNamespaceLocked(id);
}

absl::StatusOr<RemovedNamespace> BlockStore::Impl::RemoveNamespace(
    NamespaceId id, const NamespaceSessions& sessions) {
  absl::MutexLock one_change(&ns_mu_);
  RETURN_IF_ERROR(CheckRemovable(id, sessions));
  std::vector<uint64_t> slots;
  absl::StatusOr<uint64_t> last;
  {
    absl::MutexLock lock(&mu_);
    last = EvictAndDropLocked(id, &slots);
  }
  if (!last.ok()) return last.status();
  absl::Status s = journal_->Sync(*last);
  absl::MutexLock lock(&mu_);
  if (!s.ok()) {
    log::Get("store")->error(
        "remove namespace {:016x}: journal sync failed ({}); {} slots unused until restart, where "
        "the namespace comes back",
        id, s.ToString(), slots.size());
    return s;
  }
  for (uint64_t slot : slots) index_.ReleaseSlot(slot);
  log::Get("store")->info("namespace {:016x} removed; {} blocks evicted", id, slots.size());
  return RemovedNamespace{slots.size()};
}

}  // namespace tutti::store

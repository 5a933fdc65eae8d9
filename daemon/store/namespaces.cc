// BlockStore's namespaces, the catalog's other half (catalog.cc has the blocks): the namespace id
// and the checks of a descriptor, registration with an owner (docs/security.md "Namespaces"), the
// per-user and global bounds, dropping idle namespaces to make room, and removal.
//
// Why claims: a namespace is dropped only when it holds no blocks and no session uses it, but the
// server opens a session only after RegisterNamespace returned. A claim covers that gap. Every
// decision to drop reads the claims (under mu_) before it asks the server for its sessions, and
// holds ns_mu_ (which taking a claim needs) from before that read to the drop: so a namespace
// unclaimed at the read either had its session opened already (the server counts it) or will be
// registered afresh after the drop.
#include <xxhash.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/align.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/store/block_store_impl.h"

namespace tutti::store {

// The namespace id: a hash of every field that makes keys comparable, in a
// fixed encoding, and of its scope (NamespaceScope::scope; "" leaves the id as
// it was before namespaces had owners).
NamespaceId NamespaceIdOf(const tutti::v1::Namespace& ns, const std::string& scope) {
  const auto& l = ns.layout();
  std::string canonical =
      absl::StrCat(ns.model_id(), "\x1f", l.num_layers(), ",", l.kv_heads(), ",", l.head_dim(), ",",
                   l.dtype_bytes(), ",", l.block_tokens(), ",", static_cast<int>(l.format()),
                   "\x1f", ns.tp_rank(), "/", ns.tp_size(), "\x1f", ns.hash_scheme());
  if (!scope.empty()) absl::StrAppend(&canonical, "\x1f", scope);
  const NamespaceId id = XXH3_64bits(canonical.data(), canonical.size());
  return id == 0 ? 1 : id;  // 0 means "every namespace" in the admin API
}

// Validates `ns` and describes its blocks. INVALID_ARGUMENT names the bad
// field.
absl::StatusOr<NamespaceInfo> DescribeNamespace(const tutti::v1::Namespace& ns) {
  const auto& l = ns.layout();
  if (ns.model_id().empty()) return absl::InvalidArgumentError("namespace.model_id is empty");
  if (ns.hash_scheme().empty()) return absl::InvalidArgumentError("namespace.hash_scheme is empty");
  if (ns.tp_size() == 0 || ns.tp_rank() >= ns.tp_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace.tp_rank=", ns.tp_rank(), " must be < tp_size=", ns.tp_size()));
  }
  if (l.num_layers() == 0 || l.num_layers() > 4096 || l.kv_heads() == 0 || l.head_dim() == 0 ||
      l.block_tokens() == 0) {
    return absl::InvalidArgumentError(
        "namespace.layout: num_layers (1..4096), kv_heads, head_dim and "
        "block_tokens must be > 0");
  }
  if (l.dtype_bytes() != 1 && l.dtype_bytes() != 2 && l.dtype_bytes() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace.layout.dtype_bytes must be 1, 2 or 4, got ", l.dtype_bytes()));
  }
  NamespaceInfo info;
  switch (l.format()) {
    case tutti::v1::KV_FORMAT_SEPARATE:
    case tutti::v1::KV_FORMAT_FUSED:
      info.parts = 2;
      break;
    case tutti::v1::KV_FORMAT_MLA:
    case tutti::v1::KV_FORMAT_PACKED:
      info.parts = 1;
      break;
    default:
      return absl::InvalidArgumentError(
          "namespace.layout.format must be SEPARATE, FUSED, MLA or PACKED");
  }
  // Checked: four uint32 factors can exceed 2^64 and wrap to a small, valid-looking size.
  uint64_t object_len = l.block_tokens();
  const bool overflow = __builtin_mul_overflow(object_len, uint64_t{l.kv_heads()}, &object_len) ||
                        __builtin_mul_overflow(object_len, uint64_t{l.head_dim()}, &object_len) ||
                        __builtin_mul_overflow(object_len, uint64_t{l.dtype_bytes()}, &object_len);
  if (overflow || object_len > (1ull << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace.layout: block_tokens x kv_heads x head_dim x dtype_bytes = ", l.block_tokens(),
        " x ", l.kv_heads(), " x ", l.head_dim(), " x ", l.dtype_bytes(), " = ",
        overflow ? std::string("more than 2^64") : absl::StrCat(object_len),
        " bytes per object; at most 1073741824"));
  }
  info.id = NamespaceIdOf(ns, "");
  info.descriptor = ns;
  info.object_len = static_cast<uint32_t>(object_len);
  info.num_objects = l.num_layers() * info.parts;
  return info;
}

absl::StatusOr<NamespaceInfo> BlockStore::Impl::CheckNamespace(
    const tutti::v1::Namespace& ns) const {
  ASSIGN_OR_RETURN(NamespaceInfo info, DescribeNamespace(ns));
  const auto& layout = options_.layout;
  if (RoundUp4K(info.object_len) > layout.object_bytes() ||
      info.num_objects > layout.max_objects()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this pool holds blocks of at most ", layout.max_objects(), " objects of ",
        layout.object_bytes(), " bytes (pool.max_objects, pool.object_bytes); the namespace needs ",
        info.num_objects, " objects of ", info.object_len, " bytes"));
  }
  return info;
}

absl::StatusOr<NamespaceInfo> BlockStore::Impl::GetNamespace(NamespaceId id) const {
  absl::MutexLock lock(&mu_);
  auto it = namespaces_.find(id);
  if (it == namespaces_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown namespace ", id));
  }
  return it->second;
}

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

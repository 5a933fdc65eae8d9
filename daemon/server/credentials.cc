#include "daemon/server/credentials.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/handoff.h"
#include "common/random.h"

namespace tutti::server {

CredentialTable::CredentialTable(const Options& options, Clock* clock)
    : options_(options), clock_(clock) {}

absl::StatusOr<std::string> CredentialTable::Issue(const Peer& peer, std::vector<UniqueFd> fds) {
  absl::StatusOr<std::string> token = RandomBytes(kCredentialBytes);
  if (!token.ok()) return token.status();
  absl::MutexLock lock(&mu_);
  ReapLocked();
  if (entries_.size() >= options_.max_outstanding) {
    return absl::ResourceExhaustedError(
        absl::StrCat(entries_.size(), " handoffs await their Attach (limit ",
                     options_.max_outstanding, " in all); attach or try later"));
  }
  uint32_t& mine = per_uid_[peer.uid];
  if (mine >= options_.max_per_uid) {
    return absl::ResourceExhaustedError(absl::StrCat("uid ", peer.uid, " has ", mine,
                                                     " handoffs awaiting their Attach (limit ",
                                                     options_.max_per_uid, " per user)"));
  }
  ++mine;
  entries_[*token] = Entry{Credential{peer, std::move(fds)}, clock_->NowMs() + options_.ttl_ms};
  return token;
}

absl::StatusOr<Credential> CredentialTable::Redeem(absl::string_view token) {
  absl::MutexLock lock(&mu_);
  ReapLocked();
  auto it = entries_.find(token);
  if (it == entries_.end()) {
    return absl::PermissionDeniedError(
        "credential: unknown, already used or expired; hand the memory over again (handoff "
        "socket) right before Attach");
  }
  Credential c = std::move(it->second.credential);
  entries_.erase(it);
  if (--per_uid_[c.peer.uid] == 0) per_uid_.erase(c.peer.uid);
  return c;
}

uint32_t CredentialTable::ReapLocked() {
  const int64_t now = clock_->NowMs();
  uint32_t n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.expires_ms > now) {
      ++it;
      continue;
    }
    const uid_t uid = it->second.credential.peer.uid;
    if (--per_uid_[uid] == 0) per_uid_.erase(uid);
    entries_.erase(it++);
    ++n;
  }
  return n;
}

uint32_t CredentialTable::Reap() {
  absl::MutexLock lock(&mu_);
  return ReapLocked();
}

uint32_t CredentialTable::outstanding() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(entries_.size());
}

void RegisterHandoffStats(std::function<uint32_t()> outstanding, stats::Registry* registry) {
  registry->AddGroup<uint32_t>(std::move(outstanding))
      .Gauge("tutti_handoffs_outstanding", "Credentials handed out and not yet attached.",
             [](uint32_t n) { return n; }, "handoffs_outstanding");
}

}  // namespace tutti::server

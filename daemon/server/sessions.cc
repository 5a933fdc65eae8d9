#include "daemon/server/sessions.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace tutti::server {
namespace {

absl::StatusOr<std::string> NewToken() {
  absl::StatusOr<std::string> token = RandomBytes(kSessionTokenBytes);
  if (!token.ok()) {
    return absl::UnavailableError(
        absl::StrCat("no random bytes for a session token: ", token.status().message()));
  }
  return token;
}

// Equal lengths and bytes, in time that depends on the length only.
bool SameToken(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status UnknownSession(uint64_t session_id) {
  return absl::NotFoundError(absl::StrCat("session ", session_id, " is unknown or expired"));
}

// `limit`, or `share` of `slots` where that is fewer (at least 1); `slots` 0 bounds nothing.
uint64_t SharedLimit(uint64_t limit, uint64_t slots, double share) {
  if (slots == 0) return limit;
  const auto of_pool = static_cast<uint64_t>(share * static_cast<double>(slots));
  return std::max<uint64_t>(1, std::min(limit, of_pool));
}

// "limits.max_pinned_blocks_per_user = 65536" or, where the pool's share is the lower bound,
// "limits.max_pinned_pool_share_per_user = 0.25 of 1792 slots = 448".
std::string NameLimit(const char* count_field, uint64_t count, const char* share_field,
                      double share, uint64_t slots, uint64_t limit) {
  if (limit == count) return absl::StrCat("limits.", count_field, " = ", count);
  return absl::StrCat("limits.", share_field, " = ", share, " of ", slots, " slots = ", limit);
}

}  // namespace

SessionManager::SessionManager(const Options& options, Clock* clock, Unpinner unpin,
                               std::function<void(uint64_t)> closed)
    : options_(options),
      clock_(clock),
      unpin_(std::move(unpin)),
      closed_(std::move(closed)),
      user_pin_limit_(SharedLimit(options.max_pinned_blocks_per_user, options.pool_slots,
                                  options.max_pinned_pool_share_per_user)),
      pin_limit_(SharedLimit(options.max_pinned_blocks, options.pool_slots,
                             options.max_pinned_pool_share)) {}

SessionManager::~SessionManager() {
  Ended ended;
  {
    absl::MutexLock lock(&mu_);
    std::vector<uint64_t> ids;
    for (const auto& [id, s] : sessions_) ids.push_back(id);
    for (uint64_t id : ids) CloseLocked(id, &ended);
  }
  Finish(std::move(ended));
}

absl::StatusOr<SessionRef> SessionManager::Open(std::string engine_id, NamespaceId ns,
                                                std::string model_id,
                                                std::shared_ptr<engine::EngineIo> io,
                                                uint32_t engine_pid, uint32_t uid,
                                                std::string engine_group, bool memoryless,
                                                uint64_t events_seq_at_attach) {
  ASSIGN_OR_RETURN(std::string token, NewToken());
  // Held from here, so that a later look at the engine reads this process (engine_cpus.h).
  auto process = engine_pid == 0
                     ? nullptr
                     : std::make_shared<const EngineProcess>(static_cast<pid_t>(engine_pid));
  absl::MutexLock lock(&mu_);
  if (sessions_.size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "already ", sessions_.size(), " sessions (limits.max_sessions); detach one first"));
  }
  const auto of_uid = std::count_if(sessions_.begin(), sessions_.end(),
                                    [uid](const auto& e) { return e.second.state->uid == uid; });
  if (static_cast<uint64_t>(of_uid) >= options_.max_sessions_per_user) {
    return absl::ResourceExhaustedError(
        absl::StrCat("uid ", uid, " already has ", of_uid,
                     " sessions (limits.max_sessions_per_user); detach one first"));
  }
  auto state = std::make_shared<SessionState>();
  state->id = next_session_id_++;
  state->token = std::move(token);
  state->engine_id = std::move(engine_id);
  state->ns = ns;
  state->model_id = std::move(model_id);
  state->io = std::move(io);
  state->engine_pid = engine_pid;
  state->engine_process = std::move(process);
  state->uid = uid;
  state->engine_group = std::move(engine_group);
  state->memoryless = memoryless;
  state->events_seq_at_attach = events_seq_at_attach;
  Session& s = sessions_[state->id];
  s.state = state;
  s.last_seen_ms = clock_->NowMs();
  log::Get("server")->info(
      "session {}: attached engine \"{}\" pid {} uid {} namespace {:016x} ({} blocks, {}{}{})",
      state->id, state->engine_id, engine_pid, uid, ns, state->io->num_blocks(), state->io->kind(),
      state->io->has_ready_words() ? ", ready words" : "",
      state->engine_group.empty() ? "" : ", engine group");
  return SessionRef(state);
}

absl::StatusOr<SessionManager::Session*> SessionManager::FindLocked(uint64_t session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return UnknownSession(session_id);
  return &it->second;
}

absl::StatusOr<std::pair<SessionManager::Session*, SessionManager::LeaseMap::iterator>>
SessionManager::FindLeaseLocked(uint64_t session_id, uint64_t lease_id) {
  ASSIGN_OR_RETURN(Session * s, FindLocked(session_id));
  auto it = s->leases.find(lease_id);
  if (it == s->leases.end()) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is not held by session ",
                                            session_id, " (unknown, released or expired)"));
  }
  return std::make_pair(s, it);
}

absl::StatusOr<SessionRef> SessionManager::Touch(uint64_t session_id, std::string_view token,
                                                 std::optional<uint32_t> uid) {
  absl::MutexLock lock(&mu_);
  auto s = FindLocked(session_id);
  if (!s.ok()) return s.status();
  // Both checks, whatever the first says: the answer takes the same time either way.
  const bool same_token = SameToken((*s)->state->token, token);
  const bool same_user = !uid.has_value() || (*s)->state->uid == *uid;
  if (!same_token || !same_user) return UnknownSession(session_id);
  (*s)->last_seen_ms = clock_->NowMs();
  return SessionRef((*s)->state);
}

absl::StatusOr<uint64_t> SessionManager::AddLease(uint64_t session_id, std::vector<Key> keys) {
  absl::MutexLock lock(&mu_);
  auto s = FindLocked(session_id);
  if (!s.ok()) return s.status();
  Session& session = **s;
  const uint64_t n = keys.size();
  if (session.leases.size() >= options_.max_leases_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", session_id, " holds ", session.leases.size(),
        " leases (limits.max_leases_per_session); Release them or Retrieve under them"));
  }
  if (session.pinned + n > options_.max_pinned_blocks_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "session ", session_id, " pins ", session.pinned, " blocks and asks for ", n,
        " more (limits.max_pinned_blocks_per_session = ", options_.max_pinned_blocks_per_session,
        "); Release leases first"));
  }
  RETURN_IF_ERROR(CheckSharedPinLimitsLocked(session, n));
  session.pinned += n;
  pinned_total_ += n;
  pinned_by_uid_[session.state->uid] += n;
  const uint64_t id = next_lease_id_++;
  session.leases[id] = Lease{std::move(keys), clock_->NowMs() + options_.lease_ttl_ms};
  return id;
}

absl::Status SessionManager::CheckSharedPinLimitsLocked(const Session& session, uint64_t n) const {
  const uint32_t uid = session.state->uid;
  auto of_uid = pinned_by_uid_.find(uid);
  const uint64_t user = of_uid == pinned_by_uid_.end() ? 0 : of_uid->second;
  if (user + n > user_pin_limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", uid, "'s sessions pin ", user, " blocks and session ", session.state->id,
        " asks for ", n, " more (",
        NameLimit("max_pinned_blocks_per_user", options_.max_pinned_blocks_per_user,
                  "max_pinned_pool_share_per_user", options_.max_pinned_pool_share_per_user,
                  options_.pool_slots, user_pin_limit_),
        "); Release leases first"));
  }
  if (pinned_total_ + n > pin_limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the sessions pin ", pinned_total_, " blocks (",
        NameLimit("max_pinned_blocks", options_.max_pinned_blocks, "max_pinned_pool_share",
                  options_.max_pinned_pool_share, options_.pool_slots, pin_limit_),
        "); try again once leases end"));
  }
  return absl::OkStatus();
}

void SessionManager::TakeOffPinsLocked(Session* s, uint32_t uid, uint64_t n) {
  if (s != nullptr) s->pinned -= n;
  pinned_total_ -= n;
  auto it = pinned_by_uid_.find(uid);
  if (it == pinned_by_uid_.end()) return;
  it->second -= n;
  if (it->second == 0) pinned_by_uid_.erase(it);
}

void SessionManager::EndLeaseLocked(Session& s, Lease& lease, Ended* ended) {
  TakeOffPinsLocked(&s, s.state->uid, lease.keys.size());
  ended->unpins.emplace_back(s.state->ns, std::move(lease.keys));
}

void SessionManager::UnpinClaimed(NamespaceId ns, absl::Span<const Key> keys,
                                  absl::Span<const ClaimOwner> owners) {
  unpin_(ns, keys);
  absl::MutexLock lock(&mu_);
  for (const ClaimOwner& owner : owners) {
    auto it = sessions_.find(owner.session);  // ids are never reused: a closed owner is absent
    TakeOffPinsLocked(it == sessions_.end() ? nullptr : &it->second, owner.uid, owner.pins);
  }
}

std::vector<SessionManager::Session*> SessionManager::SharersLocked(Session& self) {
  std::vector<Session*> out = {&self};
  const SessionState& me = *self.state;
  if (me.engine_group.empty()) return out;
  for (auto& [id, other] : sessions_) {
    const SessionState& o = *other.state;
    if (id != me.id && o.engine_group == me.engine_group && o.ns == me.ns && o.uid == me.uid) {
      out.push_back(&other);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ClaimedLease>> SessionManager::ClaimLeases(
    uint64_t session_id, absl::Span<const uint64_t> lease_ids, absl::Span<const Key> keys) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Session * self, FindLocked(session_id));
  const std::vector<Session*> sharers = SharersLocked(*self);
  // Every lease is found and the keys checked before any is taken.
  std::vector<std::pair<Session*, LeaseMap::iterator>> found;
  found.reserve(lease_ids.size());
  absl::flat_hash_set<uint64_t> seen;
  for (uint64_t lease_id : lease_ids) {
    if (!seen.insert(lease_id).second) {
      return absl::InvalidArgumentError(absl::StrCat("lease ", lease_id, " is named twice"));
    }
    auto owner = std::find_if(sharers.begin(), sharers.end(),
                              [&](Session* s) { return s->leases.contains(lease_id); });
    if (owner == sharers.end()) {
      return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is not held by session ",
                                              session_id, " (unknown, released or expired)"));
    }
    found.emplace_back(*owner, (*owner)->leases.find(lease_id));
  }
  absl::flat_hash_set<Key> leased;
  for (const auto& [s, it] : found) leased.insert(it->second.keys.begin(), it->second.keys.end());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!leased.contains(keys[i])) {
      return absl::FailedPreconditionError(absl::StrCat(
          "blocks[", i, "]: key ", keys[i].Hex(), " is not pinned under ",
          lease_ids.size() == 1 ? absl::StrCat("lease ", lease_ids[0])
                                : absl::StrCat("any of the ", lease_ids.size(), " leases named")));
    }
  }
  // The pins stay on their owners' counts and in pinned_total_ until the claim ends.
  std::vector<Key> all;
  std::vector<ClaimOwner> owners;
  for (auto& [s, it] : found) {
    owners.push_back(ClaimOwner{s->state->id, s->state->uid, it->second.keys.size()});
    all.insert(all.end(), it->second.keys.begin(), it->second.keys.end());
    s->leases.erase(it);
  }
  return std::make_unique<ClaimedLease>(
      self->state->ns, std::move(all),
      [this, owners = std::move(owners)](NamespaceId ns, absl::Span<const Key> keys) {
        UnpinClaimed(ns, keys, owners);
      });
}

absl::Status SessionManager::Release(uint64_t session_id, uint64_t lease_id) {
  Ended ended;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(auto found, FindLeaseLocked(session_id, lease_id));
    auto [s, it] = found;
    EndLeaseLocked(*s, it->second, &ended);
    s->leases.erase(it);
  }
  Finish(std::move(ended));
  return absl::OkStatus();
}

absl::Status SessionManager::Close(uint64_t session_id, std::string_view why) {
  Ended ended;
  {
    absl::MutexLock lock(&mu_);
    auto s = FindLocked(session_id);
    if (!s.ok()) return s.status();
    CloseLocked(session_id, &ended);
  }
  Finish(std::move(ended));
  log::Get("server")->info("session {}: {}", session_id, why);
  return absl::OkStatus();
}

absl::StatusOr<SessionManager::EndResult> SessionManager::End(uint64_t session_id,
                                                              bool leases_only) {
  Ended ended;
  EndResult result;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Session * s, FindLocked(session_id));
    result.leases_ended = s->leases.size();
    for (const auto& [id, lease] : s->leases) result.pins_released += lease.keys.size();
    if (leases_only) {
      for (auto& [id, lease] : s->leases) EndLeaseLocked(*s, lease, &ended);
      s->leases.clear();
    } else {
      CloseLocked(session_id, &ended);
      result.session_closed = true;
    }
  }
  Finish(std::move(ended));
  log::Get("server")->warn("session {}: {} by the operator ({} leases, {} pins released)",
                           session_id, leases_only ? "leases ended" : "ended", result.leases_ended,
                           result.pins_released);
  return result;
}

void SessionManager::CloseLocked(uint64_t session_id, Ended* ended) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  Session& s = it->second;
  for (auto& [id, lease] : s.leases) EndLeaseLocked(s, lease, ended);
  s.state->closed.store(true);
  ended->ios.push_back(s.state->io);
  ended->closed.push_back(session_id);
  sessions_.erase(it);  // the state goes when the last in-flight request drops its SessionRef
}

std::pair<uint32_t, uint32_t> SessionManager::Reap() {
  Ended ended;
  uint32_t sessions_ended = 0, leases_ended = 0;
  {
    absl::MutexLock lock(&mu_);
    const int64_t now = clock_->NowMs();
    std::vector<uint64_t> expired;
    for (auto& [id, s] : sessions_) {
      if (now - s.last_seen_ms > options_.session_ttl_ms) {
        expired.push_back(id);
        continue;
      }
      for (auto it = s.leases.begin(); it != s.leases.end();) {
        if (it->second.expires_ms <= now) {
          EndLeaseLocked(s, it->second, &ended);
          s.leases.erase(it++);
          ++leases_ended;
        } else {
          ++it;
        }
      }
    }
    for (uint64_t id : expired) {
      leases_ended += sessions_[id].leases.size();
      CloseLocked(id, &ended);
      log::Get("server")->warn("session {}: expired (no request for {} ms); its pins dropped", id,
                               options_.session_ttl_ms);
    }
    sessions_ended = expired.size();
  }
  Finish(std::move(ended));
  return {sessions_ended, leases_ended};
}

void SessionManager::Finish(Ended ended) {
  for (const auto& io : ended.ios) io->Close();  // first: stop copies before pins go
  if (closed_) {
    for (uint64_t id : ended.closed) closed_(id);
  }
  for (const auto& [ns, keys] : ended.unpins) unpin_(ns, keys);
}

uint32_t SessionManager::num_sessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

absl::flat_hash_map<NamespaceId, uint32_t> SessionManager::SessionsPerNamespace() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<NamespaceId, uint32_t> out;
  for (const auto& [id, s] : sessions_) ++out[s.state->ns];
  return out;
}

std::vector<SessionSummary> SessionManager::List() const {
  absl::MutexLock lock(&mu_);
  const int64_t now = clock_->NowMs();
  std::vector<SessionSummary> out;
  for (const auto& [id, s] : sessions_) {
    SessionSummary row;
    row.id = id;
    row.engine_id = s.state->engine_id;
    row.ns = s.state->ns;
    row.model_id = s.state->model_id;
    row.leases = s.leases.size();
    row.pinned_blocks = s.pinned;
    row.uid = s.state->uid;
    row.engine_pid = s.state->engine_pid;
    row.engine_process = s.state->engine_process;
    row.memoryless = s.state->memoryless;
    row.idle_ms = static_cast<uint64_t>(std::max<int64_t>(0, now - s.last_seen_ms));
    row.num_blocks = s.state->io->num_blocks();
    out.push_back(std::move(row));
  }
  std::sort(out.begin(), out.end(),
            [](const SessionSummary& a, const SessionSummary& b) { return a.id < b.id; });
  return out;
}

Reaper::Reaper(SessionManager* sessions, uint32_t period_ms)
    : thread_([this, sessions, period_ms] {
        while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(period_ms))) {
          sessions->Reap();
        }
      }) {}

Reaper::~Reaper() {
  stop_.Notify();
  thread_.join();
}

void RegisterSessionStats(std::function<uint32_t()> sessions, stats::Registry* registry) {
  registry->AddGroup<uint32_t>(std::move(sessions))
      .Gauge("tutti_sessions", "Engine sessions attached.", [](uint32_t n) { return n; },
             "sessions");
}

}  // namespace tutti::server

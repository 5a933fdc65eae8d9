// Engine sessions and their leases.
//
// A session is one attached engine: its identity, namespace, and EngineIo. A lease is a set of
// keys that a Lookup pinned in the store. Leases end by Release, by a Retrieve that claimed them
// (ClaimLeases), by expiry (lease_ttl_ms after the Lookup), or with their session (Close, or expiry
// session_ttl_ms after the session's last request). Ending a lease unpins its keys exactly once,
// through the `unpin` callback given at construction.
//
// Sharing (engine groups): a Retrieve of one session may claim a lease of another only when both
// sessions gave the same non-empty engine_group, have the same namespace and the same uid (vLLM:
// the scheduler's memory-less session looks up, its workers retrieve). Any other session's lease
// is NOT_FOUND exactly as an unknown one. A lease's pins count against its owner's limits until
// they end, claimed or not; a claim outlives its owner's Close safely (the pins end once, with the
// claim).
//
// Pin limits (docs/security.md "Pins"): a lease's keys count against its session
// (max_pinned_blocks_per_session), its session's uid (max_pinned_blocks_per_user, and at most
// max_pinned_pool_share_per_user of the pool's slots) and everyone (max_pinned_blocks, and at most
// max_pinned_pool_share of the slots). Keys are counted once per lease that pins them, so the
// counts are never below the blocks the store holds pinned: with the pool share below 1, at
// least (1 - max_pinned_pool_share) of the slots are never pinned by leases and a Store always
// finds blocks to evict into, and one user cannot take more than its share from the others.
// The operator ends a session's leases, or the session, with End (Admin EndSession).
//
// Pinned handles: requests hold a SessionRef (shared_ptr) while they run, so the session's state
// lives until the last in-flight request using it has finished, even if the session was closed or
// expired meanwhile; such requests see `closed` and stop early. Ending a session (Close, expiry,
// the manager's destruction) also calls EngineIo::Close() once, without the manager's lock held,
// so the engine's mappings are released at once and nothing more is copied into its memory.
//
// Who may act in a session: the engine that attached it. Open draws a token of 128 random bits
// (kSessionTokenBytes, from the kernel's CSPRNG) that only the Attach response carries; Touch
// needs it, and answers a wrong or missing token exactly as an unknown session, so that a caller
// cannot tell a live session from an unknown id. Every call of the engine API that names a
// session enters it through Touch; the other methods here trust a session id that Touch (or the
// daemon itself: expiry, engine death, the operator) produced.
//
// Time comes from the injected Clock; Reap() expires what is due (the server calls it
// periodically through a Reaper; tests call it directly with a ManualClock).
//
// Thread-safety: every method is thread-safe. `unpin` is never called with the manager's lock
// held.
#ifndef TUTTI_DAEMON_SERVER_SESSIONS_H_
#define TUTTI_DAEMON_SERVER_SESSIONS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/stats.h"
#include "common/types.h"
#include "daemon/engine/engine_io.h"
#include "daemon/server/engine_cpus.h"

namespace tutti::server {

inline constexpr size_t kSessionTokenBytes = 16;

// What a request needs of its session. Immutable except the atomics.
struct SessionState {
  uint64_t id = 0;
  std::string token;  // kSessionTokenBytes random bytes; never logged or listed
  std::string engine_id;
  NamespaceId ns = 0;
  std::string model_id;
  uint32_t engine_pid = 0;   // as the handoff socket saw it; 0: not known
  // That process, held (engine_cpus.h); null when its pid is not known.
  std::shared_ptr<const EngineProcess> engine_process;
  uint32_t uid = 0;          // the engine's user, as the handoff socket saw it
  std::string engine_group;  // empty: shares no lease
  bool memoryless = false;   // attached no memory: no Retrieve or Store
  // The namespace's last event seq when the session attached: a first WatchEvents (after_seq 0,
  // boot_id 0) streams the events after it, so that none between Attach and the watch is missed.
  uint64_t events_seq_at_attach = 0;
  std::shared_ptr<engine::EngineIo> io;
  mutable std::atomic<uint32_t> calls{0};   // calls of this session in flight (KvCacheService)
  mutable std::atomic<bool> closed{false};  // set when the session is closed or expires
  // Set while a Retrieve (Store) that writes ready words runs: one at a time per session.
  mutable std::atomic<bool> retrieving{false};
  mutable std::atomic<bool> storing{false};
};
using SessionRef = std::shared_ptr<const SessionState>;

// Leases taken out of their sessions by a Retrieve. Unpins their keys (once per lease that pinned
// them) when destroyed.
class ClaimedLease {
 public:
  using Unpinner = std::function<void(NamespaceId, absl::Span<const Key>)>;
  ClaimedLease(NamespaceId ns, std::vector<Key> keys, Unpinner unpin)
      : ns_(ns), keys_(std::move(keys)), unpin_(std::move(unpin)) {}
  ~ClaimedLease() { unpin_(ns_, keys_); }
  ClaimedLease(const ClaimedLease&) = delete;
  ClaimedLease& operator=(const ClaimedLease&) = delete;

 private:
  const NamespaceId ns_;
  const std::vector<Key> keys_;
  const Unpinner unpin_;
};

// One row of the admin API's session list.
struct SessionSummary {
  uint64_t id = 0;
  std::string engine_id;
  NamespaceId ns = 0;
  std::string model_id;
  uint32_t leases = 0;
  uint32_t pinned_blocks = 0;
  uint64_t idle_ms = 0;
  uint32_t num_blocks = 0;
  uint32_t uid = 0;
  uint32_t engine_pid = 0;  // 0: not known
  std::shared_ptr<const EngineProcess> engine_process;  // null: not known
  bool memoryless = false;
};

class SessionManager {
 public:
  struct Options {
    uint32_t session_ttl_ms = 30000;
    uint32_t lease_ttl_ms = 30000;
    uint32_t max_sessions = 64;
    uint32_t max_sessions_per_user = 64;
    uint32_t max_leases_per_session = 1u << 20;
    uint64_t max_pinned_blocks_per_session = 1ull << 32;
    uint64_t max_pinned_blocks = 1ull << 40;  // all sessions' leases, claimed ones included
    uint64_t max_pinned_blocks_per_user = 1ull << 40;  // all sessions of one uid
    // The pool's slots (StoreStats::slots_total); 0: the shares below bound nothing.
    uint64_t pool_slots = 0;
    double max_pinned_pool_share_per_user = 0.5;  // of pool_slots, per uid
    double max_pinned_pool_share = 0.75;          // of pool_slots, all sessions together
  };
  // What End did.
  struct EndResult {
    uint32_t leases_ended = 0;
    // Keys of the ended leases (claimed leases end with their Retrieve).
    uint64_t pins_released = 0;
    bool session_closed = false;
  };
  using Unpinner = ClaimedLease::Unpinner;

  // `clock` must outlive the manager. `unpin` drops one pin of each key (BlockStore::Unpin).
  // `closed`, if set, is called once per ended session (after its EngineIo is closed, without
  // the lock), e.g. to drop its partly captured blocks (BlockStore::DropPending).
  SessionManager(const Options& options, Clock* clock, Unpinner unpin,
                 std::function<void(uint64_t session_id)> closed = nullptr);
  // Ends every lease (unpinning) and closes every session.
  ~SessionManager();

  const Options& options() const { return options_; }

  // Opens a session for user `uid`, with a fresh random token (SessionState::token).
  // RESOURCE_EXHAUSTED (naming the limit) when max_sessions are open, or max_sessions_per_user of
  // `uid`; UNAVAILABLE if the kernel gave no random bytes. `io` must not be null (a memory-less
  // session passes MakeNoMemoryEngineIo() and memoryless = true). `engine_group`: see the file
  // comment. `events_seq_at_attach`: SessionState's.
  absl::StatusOr<SessionRef> Open(std::string engine_id, NamespaceId ns, std::string model_id,
                                  std::shared_ptr<engine::EngineIo> io, uint32_t engine_pid = 0,
                                  uint32_t uid = 0, std::string engine_group = "",
                                  bool memoryless = false, uint64_t events_seq_at_attach = 0);

  // Returns the session and marks it alive now, if `token` is its token (compared in constant
  // time). NOT_FOUND, with the same message, for an unknown or expired id and for a wrong or
  // missing token.
  // With `uid`, a session of another user is refused the same way (the lookup socket's peer).
  absl::StatusOr<SessionRef> Touch(uint64_t session_id, std::string_view token,
                                   std::optional<uint32_t> uid = std::nullopt);

  // Records `keys` (already pinned by the caller) as a new lease of the session and returns its
  // id (never 0). NOT_FOUND if the session is gone; RESOURCE_EXHAUSTED, naming the limit, when the
  // session holds max_leases_per_session leases, or the lease would take its pins past
  // max_pinned_blocks_per_session, its uid's past user_pin_limit() or everyone's past
  // pin_limit() (all or nothing: a lease never pins part of its keys). On error the caller still
  // owns the pins.
  absl::StatusOr<uint64_t> AddLease(uint64_t session_id, std::vector<Key> keys);

  // Takes leases `lease_ids` (distinct, not empty) out of their sessions for a Retrieve of
  // `keys` by session `session_id`: each is the session's own or one it may share (file comment).
  // The leases no longer expire; destroying the result ends them all. All or nothing: NOT_FOUND for
  // an unknown session, or a lease that is unknown, ended, or another session's that may not be
  // shared (the message does not tell which); FAILED_PRECONDITION if some key of `keys` is in none
  // of the leases. On error every lease stays as it was.
  absl::StatusOr<std::unique_ptr<ClaimedLease>> ClaimLeases(uint64_t session_id,
                                                            absl::Span<const uint64_t> lease_ids,
                                                            absl::Span<const Key> keys);

  // Ends a lease of the session itself (never a group peer's), unpinning its keys. NOT_FOUND as
  // for an unknown lease.
  absl::Status Release(uint64_t session_id, uint64_t lease_id);

  // Closes a session (Detach, or its engine died: `why` is logged): ends its leases and closes
  // its EngineIo (waiting for a copy in progress). NOT_FOUND for an unknown id.
  absl::Status Close(uint64_t session_id, std::string_view why = "detached");

  // The operator's way out of a pin hog (Admin EndSession): ends every lease the session holds
  // now, unpinning their keys, and unless `leases_only` closes the session as Close does (its
  // engine's later calls get NOT_FOUND). Leases already claimed by a Retrieve in flight end with
  // that Retrieve. NOT_FOUND for an unknown id.
  absl::StatusOr<EndResult> End(uint64_t session_id, bool leases_only);

  // The pins one uid's leases may hold: max_pinned_blocks_per_user, or fewer where
  // max_pinned_pool_share_per_user of pool_slots is fewer (at least 1).
  uint64_t user_pin_limit() const { return user_pin_limit_; }
  // The pins all leases together may hold: max_pinned_blocks, or max_pinned_pool_share of
  // pool_slots where that is fewer (at least 1).
  uint64_t pin_limit() const { return pin_limit_; }

  // Expires sessions idle longer than session_ttl_ms and leases older than lease_ttl_ms. Returns
  // how many sessions and leases ended.
  std::pair<uint32_t, uint32_t> Reap();

  uint32_t num_sessions() const;
  std::vector<SessionSummary> List() const;
  // How many sessions each namespace has now (namespaces without one are absent): the store's
  // NamespaceSessions, which decides whether a namespace is unused.
  absl::flat_hash_map<NamespaceId, uint32_t> SessionsPerNamespace() const;

 private:
  struct Lease {
    std::vector<Key> keys;
    int64_t expires_ms = 0;
  };
  struct Session {
    std::shared_ptr<SessionState> state;
    int64_t last_seen_ms = 0;
    absl::flat_hash_map<uint64_t, Lease> leases;
    uint64_t pinned = 0;  // keys of `leases` and of its leases claimed and not yet ended
  };
  // What ending leases and sessions leaves to do once the lock is dropped.
  struct Ended {
    std::vector<std::pair<NamespaceId, std::vector<Key>>> unpins;
    std::vector<std::shared_ptr<engine::EngineIo>> ios;  // of closed sessions
    std::vector<uint64_t> closed;                // their ids
  };

  using LeaseMap = absl::flat_hash_map<uint64_t, Lease>;
  absl::StatusOr<Session*> FindLocked(uint64_t session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The session and its lease; NOT_FOUND naming whichever is unknown.
  absl::StatusOr<std::pair<Session*, LeaseMap::iterator>> FindLeaseLocked(uint64_t session_id,
                                                                          uint64_t lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The session `self` first, then every other session whose leases `self` may claim.
  std::vector<Session*> SharersLocked(Session& self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseLocked(uint64_t session_id, Ended* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `lease` of `s` (to be unpinned by Finish) and takes its pins off the counts.
  void EndLeaseLocked(Session& s, Lease& lease, Ended* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unpins claimed leases' keys and takes them off pinned_total_ and off the counts of those of
  // their owners (session id, keys) that are still open.
  struct ClaimOwner {
    uint64_t session = 0;
    uint32_t uid = 0;
    uint64_t pins = 0;
  };
  void UnpinClaimed(NamespaceId ns, absl::Span<const Key> keys,
                    absl::Span<const ClaimOwner> owners);
  // RESOURCE_EXHAUSTED naming the limit when `n` more pins of `session` would pass its uid's or
  // everyone's bound.
  absl::Status CheckSharedPinLimitsLocked(const Session& session, uint64_t n) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `n` pins of a lease of `s` (whose uid is `uid`) off the counts.
  void TakeOffPinsLocked(Session* s, uint32_t uid, uint64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(Ended ended);

  const Options options_;
  Clock* const clock_;
  const Unpinner unpin_;
  const std::function<void(uint64_t)> closed_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_lease_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t pinned_total_ ABSL_GUARDED_BY(mu_) = 0;
  const uint64_t user_pin_limit_;
  const uint64_t pin_limit_;
  // Pins of each uid's leases, claimed ones included; a uid with none has no entry.
  absl::flat_hash_map<uint32_t, uint64_t> pinned_by_uid_ ABSL_GUARDED_BY(mu_);
};

// Calls SessionManager::Reap every `period_ms` on its own thread until destroyed.
class Reaper {
 public:
  Reaper(SessionManager* sessions, uint32_t period_ms);
  ~Reaper();

 private:
  absl::Notification stop_;
  std::thread thread_;
};

// The sessions' figures in the stats registry (common/stats.h): tutti_sessions, read from
// `sessions` (SessionManager::num_sessions) at each collection.
void RegisterSessionStats(std::function<uint32_t()> sessions, stats::Registry* registry);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_SESSIONS_H_

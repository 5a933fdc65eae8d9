// KvCache.WatchEvents (docs/events.md): the stream of a session's namespace's block events from
// the store's event hub (daemon/store/events.h). The handler is KvCacheService::WatchEvents, in
// watch_events.cc; this header holds its parts that need no service.
//
// A stream does not take one of its session's max_calls_per_session (it would hold one for
// hours), but it holds one gRPC thread (limits.max_rpc_threads) for its whole life. It passes the
// call gate only to be admitted and at each wake, so it never holds shutdown back: once the gate
// closes, it ends UNAVAILABLE at its next wake (at most kWatchTick later).
#ifndef TUTTI_DAEMON_SERVER_WATCH_EVENTS_H_
#define TUTTI_DAEMON_SERVER_WATCH_EVENTS_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/types.h"
#include "daemon/store/events.h"
#include "tutti/v1/kvcache.pb.h"

namespace tutti::server {

// Events are sent as they come (the hub wakes the stream); the end of the session, cancellation
// and shutdown, which the synchronous gRPC API does not announce, are looked at this often.
inline constexpr absl::Duration kWatchTick = absl::Milliseconds(100);
// The most events in one WatchEventsResponse.
inline constexpr size_t kMaxEventsPerMessage = 1024;

// The sessions that have a WatchEvents stream. Thread-safe.
class WatcherSet {
 public:
  // False when `session_id` has one already.
  bool TryAdd(uint64_t session_id);
  void Remove(uint64_t session_id);

 private:
  absl::Mutex mu_;
  absl::flat_hash_set<uint64_t> ids_ ABSL_GUARDED_BY(mu_);
};

// Streams namespace `ns`'s events of `hub` as `req` asks: after req.after_seq of req.boot_id;
// with both 0 (a first watch), after `seq_at_attach` of this run (the session's attach). When the
// events asked for cannot be given (another run's seq, or gone), resumed is false and the stream
// starts after `seq_at_attach` if every event since is kept, else from now. A first message with
// pool_id, boot_id, blocks_lost_at_start and resumed (and the events already there), then one
// message per batch of events, in seq order, at most kMaxEventsPerMessage each. Before each wait
// (of at most kWatchTick) it calls `ended`: a status there ends the stream with it. Returns
// CANCELLED when `write` fails (the client went away), the hub's RESOURCE_EXHAUSTED for a
// subscriber that fell behind the ring, and UNAVAILABLE once the hub is shut down.
absl::Status StreamEvents(store::EventHub& hub, NamespaceId ns, uint64_t seq_at_attach,
                          const tutti::v1::WatchEventsRequest& req,
                          const std::function<std::optional<absl::Status>()>& ended,
                          const std::function<bool(const tutti::v1::WatchEventsResponse&)>& write);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_WATCH_EVENTS_H_

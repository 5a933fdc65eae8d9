// The daemon's end of the lookup socket (common/lookup_wire.h): Lookups outside gRPC, so
// that vLLM's scheduler's first get_num_new_matched_tokens of a request does not pay gRPC's round
// trip (issue 21 section 4). Every request is answered by a LookupHandler (tuttid's:
// KvCacheService::LookupAs, the same code as KvCache.Lookup) for the peer's uid (SO_PEERCRED).
//
// Bounded, as the handoff socket: one thread accepts every connection as it comes, asks the
// kernel its uid, and admits it, answering an empty OK frame, or refuses it past LookupLimits
// (per uid, and in all) with RESOURCE_EXHAUSTED naming the limit, and closes it. Each admitted
// connection has a thread of its own, so a slow or dead client holds only its own. A connection
// may stay idle between requests; once a request has begun it must arrive whole within
// LookupLimits::io_timeout, and each answer must be taken within it, else the connection is
// dropped. A request longer than max_request_bytes is answered INVALID_ARGUMENT and the connection
// closed (its rest is never read); an unknown kind is UNIMPLEMENTED and bytes that are no
// LookupRequest INVALID_ARGUMENT, and the connection stays. Nothing a peer sends is logged.
//
// Thread-safety: Start and the destructor from one thread; the handler is called from the
// connections' threads at once.
#ifndef TUTTI_DAEMON_SERVER_LOOKUP_SERVER_H_
#define TUTTI_DAEMON_SERVER_LOOKUP_SERVER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/lookup_wire.h"
#include "common/unique_fd.h"
#include "daemon/server/socket_files.h"
#include "tutti/v1/kvcache.pb.h"

namespace tutti::server {

// Connections the lookup socket keeps open at once (config limits.max_lookup_connections*), and
// how long it waits for a peer.
struct LookupLimits {
  uint32_t max_connections_per_user = 16;  // of one uid; >= 1
  uint32_t max_connections = 256;          // of all uids; >= max_connections_per_user
  uint32_t max_request_bytes = MaxLookupRequest(2048);
  absl::Duration io_timeout = absl::Seconds(1);  // to finish a begun request, to take an answer
};

// Answers one Lookup of a peer the kernel says is user `uid`.
using LookupHandler = std::function<absl::Status(
    uint32_t uid, const tutti::v1::LookupRequest& req, tutti::v1::LookupResponse* resp)>;

class LookupServer {
 public:
  // Listens on `path` (prepared like the gRPC socket: stale files removed, FAILED_PRECONDITION
  // when another server answers) with `access`, answering through `handler` and keeping to
  // `limits`. UNAVAILABLE when the socket cannot be bound (the message has errno).
  static absl::StatusOr<std::unique_ptr<LookupServer>> Start(const std::string& path,
                                                             const SocketAccess& access,
                                                             LookupHandler handler,
                                                             const LookupLimits& limits = {});
  // Stops accepting, ends every connection (a request being answered finishes first), joins the
  // threads and removes the socket file.
  ~LookupServer();
  LookupServer(const LookupServer&) = delete;
  LookupServer& operator=(const LookupServer&) = delete;

  const std::string& path() const { return path_; }
  // Connections admitted and not yet ended.
  uint32_t open_connections() const;

 private:
  struct Conn {
    UniqueFd fd;  // closed when the thread is joined, never by the thread (Stop shuts it down)
    uid_t uid = 0;
    bool done = false;  // guarded by mu_
    std::thread thread;
  };

  LookupServer(std::string path, UniqueFd listen_fd, UniqueFd stop_fd, LookupHandler handler,
               const LookupLimits& limits);
  void AcceptLoop();
  // OK when a connection of `uid` may be admitted now; else RESOURCE_EXHAUSTED naming the limit.
  absl::Status RoomFor(uid_t uid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joins and closes the connections whose threads ended.
  void Reap() ABSL_LOCKS_EXCLUDED(mu_);
  // One connection's requests, until it ends or fails.
  void Serve(Conn* conn);

  const std::string path_;
  const UniqueFd listen_fd_;
  const UniqueFd stop_fd_;  // an eventfd; written once by the destructor
  const LookupHandler handler_;
  const LookupLimits limits_;
  mutable absl::Mutex mu_;
  std::list<Conn> conns_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, uint32_t> open_per_uid_ ABSL_GUARDED_BY(mu_);
  uint32_t open_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread accept_thread_;
};

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_LOOKUP_SERVER_H_

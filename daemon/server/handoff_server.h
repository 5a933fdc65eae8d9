// The daemon's end of the handoff (common/handoff.h): a SOCK_SEQPACKET unix socket whose
// one thread accepts engines, reads each one's message and descriptors, asks the kernel who the
// peer is (SO_PEERCRED), and answers with a credential from a CredentialTable.
//
// Bounded, so that one user cannot keep the others from attaching: the thread accepts every
// connection as it comes (the listen backlog, SOMAXCONN, never stays full) and asks the kernel
// its uid at once; a connection past HandoffLimits (per uid, and in all) is answered "ER" with
// RESOURCE_EXHAUSTED naming the limit and closed. An admitted connection is read for at most
// HandoffLimits::read_timeout; a peer that sends nothing in time, a malformed message, or the
// wrong number of descriptors is answered "ER" (when it can be) and dropped, its descriptors
// closed. Nothing a peer sends is logged unescaped.
//
// Thread-safety: Start and the destructor from one thread; the table is thread-safe.
#ifndef TUTTI_DAEMON_SERVER_HANDOFF_SERVER_H_
#define TUTTI_DAEMON_SERVER_HANDOFF_SERVER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "daemon/server/credentials.h"
#include "daemon/server/socket_files.h"

namespace tutti::server {

// Connections the handoff socket keeps open at once (config limits.max_handoff_connections*).
struct HandoffLimits {
  uint32_t max_connections_per_user = 16;          // of one uid; >= 1
  uint32_t max_connections = 256;                  // of all uids; >= max_connections_per_user
  absl::Duration read_timeout = absl::Seconds(1);  // from accept to the request
};

class HandoffServer {
 public:
  // Listens on `path` (prepared like the gRPC socket: stale files removed, FAILED_PRECONDITION
  // when another server answers) with `access`, issuing credentials from `table` (which must
  // outlive the server) and keeping to `limits`. UNAVAILABLE when the socket cannot be bound
  // (the message has errno).
  static absl::StatusOr<std::unique_ptr<HandoffServer>> Start(const std::string& path,
                                                              const SocketAccess& access,
                                                              CredentialTable* table,
                                                              const HandoffLimits& limits = {});
  // Stops the thread, closes pending connections and removes the socket file.
  ~HandoffServer();
  HandoffServer(const HandoffServer&) = delete;
  HandoffServer& operator=(const HandoffServer&) = delete;

  const std::string& path() const { return path_; }

 private:
  // An accepted connection awaiting its request.
  struct Pending {
    UniqueFd fd;
    uid_t uid;
    absl::Time deadline;
  };

  HandoffServer(std::string path, UniqueFd listen_fd, UniqueFd stop_fd, CredentialTable* table,
                const HandoffLimits& limits);
  void Loop();
  // Serves the pending connections that are readable (or hung up) per `revents` (one per
  // pending_ entry) and drops those past their deadline.
  void ServeOrExpire(const std::vector<short>& revents, absl::Time now);
  // OK when a connection of `uid` may be admitted now; else RESOURCE_EXHAUSTED naming the limit.
  absl::Status RoomFor(uid_t uid) const;
  // Accepts the connections waiting in the backlog (up to a round's worth): admits each one, or
  // refuses it past a limit.
  void AcceptAll(absl::Time now);
  // Reads one connection's message and answers it.
  void Serve(int conn);

  const std::string path_;
  const UniqueFd listen_fd_;
  const UniqueFd stop_fd_;  // an eventfd; written once by the destructor
  CredentialTable* const table_;
  const HandoffLimits limits_;
  // Owned by the thread.
  std::vector<Pending> pending_;
  absl::flat_hash_map<uid_t, uint32_t> pending_per_uid_;
  std::thread thread_;
};

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_HANDOFF_SERVER_H_

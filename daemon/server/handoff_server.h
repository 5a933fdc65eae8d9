// The daemon's end of the handoff (daemon/common/handoff.h): a SOCK_SEQPACKET unix socket whose
// one thread accepts engines, reads each one's message and descriptors, asks the kernel who the
// peer is (SO_PEERCRED), and answers with a credential from a CredentialTable.
//
// Bounded: at most kMaxPending connections are read at once, each for at most kReadTimeout; a
// peer that sends nothing, a malformed message, or the wrong number of descriptors is answered
// "ER" (when it can be) and dropped, its descriptors closed. Nothing a peer sends is logged
// unescaped.
//
// Thread-safety: Start and the destructor from one thread; the table is thread-safe.
#ifndef TUTTI_DAEMON_SERVER_HANDOFF_SERVER_H_
#define TUTTI_DAEMON_SERVER_HANDOFF_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/common/unique_fd.h"
#include "daemon/server/credentials.h"
#include "daemon/server/socket_files.h"

namespace tutti::server {

class HandoffServer {
 public:
  static constexpr int kMaxPending = 64;
  static constexpr absl::Duration kReadTimeout = absl::Seconds(2);

  // Listens on `path` (prepared like the gRPC socket: stale files removed, FAILED_PRECONDITION
  // when another server answers) with `access`, issuing credentials from `table` (which must
  // outlive the server). UNAVAILABLE when the socket cannot be bound (the message has errno).
  static absl::StatusOr<std::unique_ptr<HandoffServer>> Start(const std::string& path,
                                                              const SocketAccess& access,
                                                              CredentialTable* table);
  // Stops the thread, closes pending connections and removes the socket file.
  ~HandoffServer();
  HandoffServer(const HandoffServer&) = delete;
  HandoffServer& operator=(const HandoffServer&) = delete;

  const std::string& path() const { return path_; }

 private:
  HandoffServer(std::string path, UniqueFd listen_fd, UniqueFd stop_fd, CredentialTable* table);
  void Loop();
  // Reads one connection's message and answers it.
  void Serve(int conn);

  const std::string path_;
  const UniqueFd listen_fd_;
  const UniqueFd stop_fd_;  // an eventfd; written once by the destructor
  CredentialTable* const table_;
  std::thread thread_;
};

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_HANDOFF_SERVER_H_

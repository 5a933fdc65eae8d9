// Unix socket files of tuttid: probing, preparing the path, and setting who may connect.
//
// Thread-safety: free functions; PrepareSocketPath and BindUnixSocket change the process umask
// for a moment and are meant for start-up.
#ifndef TUTTI_DAEMON_SERVER_SOCKET_FILES_H_
#define TUTTI_DAEMON_SERVER_SOCKET_FILES_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace tutti::server {

// What is at a socket path now. For Start and for tools that wait for the daemon. `type` is the
// socket type to connect with (SOCK_STREAM for gRPC sockets).
enum class SocketState { kAbsent, kStale, kAnswering, kNotASocket };
SocketState ProbeSocket(const std::string& path, int type);

// Creates the path's directory (0755) if missing; refuses (FAILED_PRECONDITION) when a server
// answers on the path or it is not a socket; removes a stale socket file.
absl::Status PrepareSocketPath(const std::string& path, int type);

// Who may connect to a socket file: its mode and, when `group` is not empty, its group.
struct SocketAccess {
  uint32_t mode = 0660;
  std::string group;  // empty: keep the daemon's group
};

// Sets the socket file's mode and group. A group that does not exist, or a chmod/chown that
// fails, is logged as a warning and the file keeps what it has (owner-only until then: sockets
// are created with umask 0177).
void ApplySocketAccess(const std::string& path, const SocketAccess& access);

// A listening unix socket of `type` (SOCK_STREAM, SOCK_SEQPACKET; non-blocking, close-on-exec)
// at `path`: the path checked (absolute, shorter than sockaddr_un's 108), PrepareSocketPath,
// bound owner-only, listening, then ApplySocketAccess. `what` names it in errors ("handoff
// socket"). INVALID_ARGUMENT for a bad path, PrepareSocketPath's errors, UNAVAILABLE with the
// errno of a failed call.
absl::StatusOr<UniqueFd> ListenUnixSocket(const std::string& path, int type,
                                          const SocketAccess& access, const std::string& what);

// One connection taken from `listen_fd` (non-blocking, close-on-exec) and its peer's credentials
// (SO_PEERCRED); `peer_error` (INTERNAL with the errno) when they could not be read, and `peer`
// is then unset. nullopt when none is pending, or when accept failed (logged as `what`'s, at
// most every 5 s). EINTR and ECONNABORTED are retried.
struct AcceptedPeer {
  UniqueFd conn;
  ucred peer{};
  absl::Status peer_error;
};
std::optional<AcceptedPeer> AcceptPeer(int listen_fd, const std::string& what);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_SOCKET_FILES_H_

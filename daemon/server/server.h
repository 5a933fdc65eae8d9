// The gRPC server on tuttid's unix socket, with the standard health service and reflection.
//
// Start prepares the socket path: creates its directory (0755) if missing, refuses to start when
// another server answers on the path (FAILED_PRECONDITION) or when the path is not a socket,
// removes a stale socket file, binds, then sets the socket's mode and, if the group exists, its
// group (else logs a warning and keeps the daemon's group).
//
// Thread-safety: Shutdown and the destructor may be called from any one thread; the services are
// called by gRPC's threads.
#ifndef TUTTI_DAEMON_SERVER_SERVER_H_
#define TUTTI_DAEMON_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/server/call_gate.h"
#include "daemon/server/socket_files.h"
#include "grpcpp/server.h"

namespace tutti::server {

struct ServerOptions {
  std::string socket_path;  // absolute; at most 107 characters
  SocketAccess access;
  // The most threads gRPC may run for this server's calls (0: gRPC's default, unbounded). Past
  // it, new calls are answered RESOURCE_EXHAUSTED.
  uint32_t max_threads = 0;
};

class Server {
 public:
  // Serves `services` (which must outlive the server) on unix:<socket_path>. `gate`, if not null,
  // is the gate every call of `services` passes (it must outlive the server); Shutdown closes it.
  // Errors: FAILED_PRECONDITION (another server answers, the path is not a socket, the directory
  // cannot be made), UNAVAILABLE (gRPC could not bind).
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       const std::vector<grpc::Service*>& services,
                                                       CallGate* gate = nullptr);
  // Shuts down (with no grace) if Shutdown was not called, and removes the socket file.
  ~Server();

  // Stops admitting calls (the gate answers UNAVAILABLE), lets calls in flight finish for up to
  // `grace`, gives their answers up to 0.5 s (at most `grace`) to go out, then cancels what is
  // left, closes every connection, and returns once every handler has returned. Idle client
  // connections delay it by that 0.5 s at most. Without a gate: gRPC's own Shutdown(now + grace),
  // which waits for idle client connections to close, up to `grace`.
  void Shutdown(absl::Duration grace);

  // "unix:<socket_path>", for in-process clients and tests.
  const std::string& target() const { return target_; }

 private:
  Server(ServerOptions options, std::unique_ptr<grpc::Server> server, CallGate* gate);

  const ServerOptions options_;
  const std::string target_;
  std::unique_ptr<grpc::Server> server_;
  CallGate* const gate_;
  bool shut_down_ = false;
};

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_SERVER_H_

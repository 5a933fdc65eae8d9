// Connecting to tuttid's unix socket, and the gRPC -> absl status bridge.
//
// Thread-safety: free functions; the returned channel is thread-safe.
#ifndef TUTTI_COMMON_CONNECT_H_
#define TUTTI_COMMON_CONNECT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/status.h"

namespace tutti {

// The socket tuttid listens on by default (config.proto ListenConfig.socket_path).
inline constexpr char kDefaultSocket[] = "/run/tutti/tuttid.sock";

// Opens a channel to the tuttid listening on unix socket `socket_path` and waits until it is
// connected. Errors: UNAVAILABLE, with a message of the form "cannot reach tuttid at PATH:
// <reason>; is it running? (systemctl status tuttid)", where <reason> is the connect(2) error
// (no such file, connection refused, permission denied) or a timeout after `timeout`.
absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectToTuttid(const std::string& socket_path,
                                                               absl::Duration timeout);

// The same code and message (gRPC and absl codes are numerically equal).
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace tutti

#endif  // TUTTI_COMMON_CONNECT_H_

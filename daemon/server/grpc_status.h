// The one place where absl::Status becomes grpc::Status: at the edge of every RPC handler.
// The canonical codes are the same numbers in both.
#ifndef TUTTI_DAEMON_SERVER_GRPC_STATUS_H_
#define TUTTI_DAEMON_SERVER_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace tutti::server {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_GRPC_STATUS_H_

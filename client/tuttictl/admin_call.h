// Internal to tuttictl: connecting to tuttid's operator socket and calling one Admin method.
#ifndef TUTTI_CLIENT_TUTTICTL_ADMIN_CALL_H_
#define TUTTI_CLIENT_TUTTICTL_ADMIN_CALL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/tuttictl/command.h"
#include "common/connect.h"
#include "grpcpp/client_context.h"
#include "tutti/v1/admin.grpc.pb.h"

namespace tutti::tuttictl {

// A stub on AdminSocket(options), connected within options.timeout_ms. PERMISSION_DENIED says to
// try sudo; the connection's other errors as they are.
inline absl::StatusOr<std::unique_ptr<tutti::v1::Admin::Stub>> ConnectAdmin(
    const GlobalOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      ConnectToTuttid(AdminSocket(options), absl::Milliseconds(options.timeout_ms));
  if (!channel.ok() && absl::StrContains(channel.status().message(), "Permission denied")) {
    return absl::PermissionDeniedError(absl::StrCat(
        channel.status().message(), "; the operator socket is for tuttid's user and root "
        "(listen.admin_socket_mode, listen.admin_socket_group): try sudo"));
  }
  if (!channel.ok()) return channel.status();
  return tutti::v1::Admin::NewStub(*channel);
}

// The daemon's error, its message prefixed "tuttid: ".
inline absl::Status FromDaemon(const grpc::Status& s) {
  const absl::Status status = FromGrpc(s);
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("tuttid: ", status.message()));
}

// Connects and calls one unary Admin method with a deadline of `deadline` (default:
// options.timeout_ms).
template <typename Request, typename Response>
absl::Status CallAdmin(const GlobalOptions& options,
                       grpc::Status (tutti::v1::Admin::Stub::*method)(grpc::ClientContext*,
                                                                      const Request&, Response*),
                       const Request& request, Response* response,
                       absl::Duration deadline = absl::ZeroDuration()) {
  absl::StatusOr<std::unique_ptr<tutti::v1::Admin::Stub>> stub = ConnectAdmin(options);
  if (!stub.ok()) return stub.status();
  if (deadline == absl::ZeroDuration()) deadline = absl::Milliseconds(options.timeout_ms);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  return FromDaemon(((**stub).*method)(&ctx, request, response));
}

}  // namespace tutti::tuttictl

#endif  // TUTTI_CLIENT_TUTTICTL_ADMIN_CALL_H_

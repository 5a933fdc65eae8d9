#include "common/connect.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace tutti {
namespace {

absl::Status Unreachable(const std::string& path, const std::string& reason) {
  return absl::UnavailableError(absl::StrCat("cannot reach tuttid at ", path, ": ", reason,
                                             "; is it running? (systemctl status tuttid)"));
}

// Tries a plain connect(2), so the message can say why (gRPC only says "unavailable").
absl::Status ProbeSocket(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Unreachable(
        path, absl::StrCat("socket path must be 1..", sizeof(addr.sun_path) - 1, " characters"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unreachable(path, absl::StrCat("socket: ", strerror(errno)));
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  close(fd);
  if (rc != 0) return Unreachable(path, strerror(err));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectToTuttid(const std::string& socket_path,
                                                               absl::Duration timeout) {
  if (absl::Status probe = ProbeSocket(socket_path); !probe.ok()) return probe;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("unix:", socket_path),
                                           grpc::InsecureChannelCredentials(), args);
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  if (!channel->WaitForConnected(deadline)) {
    return Unreachable(socket_path,
                       absl::StrCat("no gRPC connection within ", absl::FormatDuration(timeout)));
  }
  return channel;
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace tutti

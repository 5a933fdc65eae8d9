#include "daemon/server/server.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/common/dirs.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace tutti::server {
namespace {

// After the gate is closed: how long gRPC may take to deliver the answers of finished calls.
constexpr absl::Duration kFlushLinger = absl::Milliseconds(500);

absl::Status PrepareSocketPath(const std::string& path) {
  RETURN_IF_ERROR(MakeDirs(path.substr(0, path.find_last_of('/')), 0755));
  switch (ProbeSocket(path)) {
    case SocketState::kAbsent:
      return absl::OkStatus();
    case SocketState::kAnswering:
      return absl::FailedPreconditionError(
          absl::StrCat("another server (tuttid?) is answering on ", path, "; stop it first"));
    case SocketState::kNotASocket:
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; not removing it"));
    case SocketState::kStale:
      if (unlink(path.c_str()) != 0 && errno != ENOENT) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot remove stale socket ", path, ": ", strerror(errno)));
      }
      log::Get("server")->info("removed stale socket {}", path);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

void ApplyModeAndGroup(const ServerOptions& o) {
  auto log = log::Get("server");
  if (chmod(o.socket_path.c_str(), o.socket_mode) != 0) {
    log->warn("chmod {:o} {}: {}", o.socket_mode, o.socket_path, strerror(errno));
  }
  if (o.socket_group.empty()) return;
  struct group grp, *found = nullptr;
  char buf[4096];
  if (getgrnam_r(o.socket_group.c_str(), &grp, buf, sizeof(buf), &found) != 0 || found == nullptr) {
    log->warn("group \"{}\" does not exist; {} keeps the daemon's group", o.socket_group,
              o.socket_path);
    return;
  }
  if (chown(o.socket_path.c_str(), static_cast<uid_t>(-1), found->gr_gid) != 0) {
    log->warn("chgrp {} {}: {}", o.socket_group, o.socket_path, strerror(errno));
  }
}

}  // namespace

SocketState ProbeSocket(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return SocketState::kAbsent;
  if (!S_ISSOCK(st.st_mode)) return SocketState::kNotASocket;
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return SocketState::kStale;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool answered = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return answered ? SocketState::kAnswering : SocketState::kStale;
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      const std::vector<grpc::Service*>& services,
                                                      CallGate* gate) {
  if (options.socket_path.empty() || options.socket_path[0] != '/' ||
      options.socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path \"", options.socket_path, "\": must be absolute, < 108 chars"));
  }
  RETURN_IF_ERROR(PrepareSocketPath(options.socket_path));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + options.socket_path, grpc::InsecureServerCredentials());
  for (grpc::Service* s : services) builder.RegisterService(s);
  // The socket is born owner-only and opened up to socket_mode afterwards, so no other user can
  // connect in the moment between bind and chmod. (umask is process-wide; this runs at start-up.)
  const mode_t old_umask = umask(0177);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  umask(old_umask);
  if (server == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "gRPC could not listen on unix:", options.socket_path, " (see gRPC's log above)"));
  }
  ApplyModeAndGroup(options);
  log::Get("server")->info("listening on unix:{}", options.socket_path);
  return std::unique_ptr<Server>(new Server(options, std::move(server), gate));
}

Server::Server(ServerOptions options, std::unique_ptr<grpc::Server> server, CallGate* gate)
    : options_(std::move(options)),
      target_("unix:" + options_.socket_path),
      server_(std::move(server)),
      gate_(gate) {}

Server::~Server() {
  if (!shut_down_) Shutdown(absl::ZeroDuration());
  unlink(options_.socket_path.c_str());
}

void Server::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  absl::Duration wait = grace;
  if (gate_ != nullptr) {
    const uint32_t running = gate_->Close(grace);
    if (running > 0) {
      log::Get("server")->warn("{} calls still running after {}; cancelling them", running,
                               absl::FormatDuration(grace));
    }
    // Handlers have returned, but their last messages and statuses may still be on the way out;
    // give them a moment before connections are cut. gRPC waits this long for idle clients too.
    wait = std::min(grace, kFlushLinger);
  }
  server_->Shutdown(absl::ToChronoTime(absl::Now() + wait));
  server_->Wait();
}

}  // namespace tutti::server

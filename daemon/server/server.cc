#include "daemon/server/server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/server/decode_errors.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace tutti::server {
namespace {

// After the gate is closed: how long gRPC may take to deliver the answers of finished calls.
constexpr absl::Duration kFlushLinger = absl::Milliseconds(500);

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      const std::vector<grpc::Service*>& services,
                                                      CallGate* gate) {
  if (options.socket_path.empty() || options.socket_path[0] != '/' ||
      options.socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path \"", options.socket_path, "\": must be absolute, < 108 chars"));
  }
  RETURN_IF_ERROR(PrepareSocketPath(options.socket_path, SOCK_STREAM));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + options.socket_path, grpc::InsecureServerCredentials());
  for (grpc::Service* s : services) builder.RegisterService(s);
  builder.experimental().SetInterceptorCreators(DecodeErrorInterceptors());
  if (options.max_threads > 0) {
    // Each call in flight holds one of gRPC's threads (a Retrieve for its whole stream): the quota
    // bounds them, so a flood of calls is answered RESOURCE_EXHAUSTED instead of growing threads.
    grpc::ResourceQuota quota("tuttid:" + options.socket_path);
    quota.SetMaxThreads(static_cast<int>(options.max_threads));
    builder.SetResourceQuota(quota);
  }
  // The socket is born owner-only and opened up to access.mode afterwards, so no other user can
  // connect in the moment between bind and chmod. (umask is process-wide; this runs at start-up.)
  const mode_t old_umask = umask(0177);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  umask(old_umask);
  if (server == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "gRPC could not listen on unix:", options.socket_path, " (see gRPC's log above)"));
  }
  ApplySocketAccess(options.socket_path, options.access);
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

#include "daemon/server/socket_files.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dirs.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tutti::server {

SocketState ProbeSocket(const std::string& path, int type) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return SocketState::kAbsent;
  if (!S_ISSOCK(st.st_mode)) return SocketState::kNotASocket;
  const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return SocketState::kStale;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool answered = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return answered ? SocketState::kAnswering : SocketState::kStale;
}

absl::Status PrepareSocketPath(const std::string& path, int type) {
  RETURN_IF_ERROR(MakeDirs(path.substr(0, path.find_last_of('/')), 0755));
  switch (ProbeSocket(path, type)) {
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

void ApplySocketAccess(const std::string& path, const SocketAccess& access) {
  auto log = log::Get("server");
  if (chmod(path.c_str(), access.mode) != 0) {
    log->warn("chmod {:o} {}: {}", access.mode, path, strerror(errno));
  }
  if (access.group.empty()) return;
  struct group grp, *found = nullptr;
  char buf[4096];
  if (getgrnam_r(access.group.c_str(), &grp, buf, sizeof(buf), &found) != 0 || found == nullptr) {
    log->warn("group \"{}\" does not exist; {} keeps the daemon's group", access.group, path);
    return;
  }
  if (chown(path.c_str(), static_cast<uid_t>(-1), found->gr_gid) != 0) {
    log->warn("chgrp {} {}: {}", access.group, path, strerror(errno));
  }
}

absl::StatusOr<UniqueFd> ListenUnixSocket(const std::string& path, int type,
                                          const SocketAccess& access, const std::string& what) {
  sockaddr_un addr{};
  if (path.empty() || path[0] != '/' || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " path \"", path, "\": must be absolute, < 108 chars"));
  }
  auto failed = [&](const char* call) {
    return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", call, ": ", strerror(errno)));
  };
  RETURN_IF_ERROR(PrepareSocketPath(path, type));
  UniqueFd fd(socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return failed("socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const mode_t old_umask = umask(0177);  // born owner-only, opened up below
  const int bound = bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_umask);
  if (bound != 0) return failed("bind");
  if (listen(fd.get(), SOMAXCONN) != 0) return failed("listen");
  ApplySocketAccess(path, access);
  return fd;
}

std::optional<AcceptedPeer> AcceptPeer(int listen_fd, const std::string& what) {
  for (;;) {
    AcceptedPeer a;
    a.conn = UniqueFd(accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!a.conn.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN) {
        TUTTI_LOG_EVERY_N_SEC(log::Get("server"), spdlog::level::warn, 5, "{}: accept: {}", what,
                              strerror(errno));
      }
      return std::nullopt;
    }
    socklen_t len = sizeof(a.peer);
    if (getsockopt(a.conn.get(), SOL_SOCKET, SO_PEERCRED, &a.peer, &len) != 0) {
      a.peer_error = absl::InternalError(absl::StrCat("SO_PEERCRED: ", strerror(errno)));
    }
    return a;
  }
}

}  // namespace tutti::server

#include "daemon/server/handoff_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/common/handoff.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"

namespace tutti::server {
namespace {

absl::Status Errno(const std::string& path, const char* call) {
  return absl::UnavailableError(absl::StrCat("handoff socket ", path, ": ", call, ": ",
                                             strerror(errno)));
}

void Answer(int conn, std::string_view reply) {
  (void)send(conn, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Refuse(int conn, const absl::Status& why) {
  std::string reply = absl::StrCat("ER", std::string(1, static_cast<char>(why.code())),
                                   why.message());
  if (reply.size() > kMaxHandoffMessage) reply.resize(kMaxHandoffMessage);
  Answer(conn, reply);
}

// The descriptors of a received message's SCM_RIGHTS, owned.
std::vector<UniqueFd> TakeFds(msghdr* msg) {
  std::vector<UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  return fds;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HandoffServer>> HandoffServer::Start(const std::string& path,
                                                                    const SocketAccess& access,
                                                                    CredentialTable* table) {
  sockaddr_un addr{};
  if (path.empty() || path[0] != '/' || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("handoff socket path \"", path, "\": must be absolute, < 108 chars"));
  }
  RETURN_IF_ERROR(PrepareSocketPath(path, SOCK_SEQPACKET));
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Errno(path, "socket");
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const mode_t old_umask = umask(0177);  // born owner-only, opened up below
  const int bound = bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_umask);
  if (bound != 0) return Errno(path, "bind");
  if (listen(fd.get(), 128) != 0) return Errno(path, "listen");
  ApplySocketAccess(path, access);
  UniqueFd stop(eventfd(0, EFD_CLOEXEC));
  if (!stop.valid()) return Errno(path, "eventfd");
  std::unique_ptr<HandoffServer> server(
      new HandoffServer(path, std::move(fd), std::move(stop), table));
  server->thread_ = std::thread(&HandoffServer::Loop, server.get());
  log::Get("server")->info("handoff socket listening on {}", path);
  return server;
}

HandoffServer::HandoffServer(std::string path, UniqueFd listen_fd, UniqueFd stop_fd,
                             CredentialTable* table)
    : path_(std::move(path)),
      listen_fd_(std::move(listen_fd)),
      stop_fd_(std::move(stop_fd)),
      table_(table) {}

HandoffServer::~HandoffServer() {
  const uint64_t one = 1;
  if (write(stop_fd_.get(), &one, sizeof(one)) != sizeof(one)) {
    log::Get("server")->error("handoff socket: cannot stop its thread: {}", strerror(errno));
  }
  if (thread_.joinable()) thread_.join();
  unlink(path_.c_str());
}

void HandoffServer::Loop() {
  struct Pending {
    UniqueFd fd;
    absl::Time deadline;
  };
  std::vector<Pending> pending;
  std::vector<pollfd> polls;
  for (;;) {
    polls.clear();
    polls.push_back({stop_fd_.get(), POLLIN, 0});
    const bool room = pending.size() < kMaxPending;
    polls.push_back({listen_fd_.get(), static_cast<short>(room ? POLLIN : 0), 0});
    for (const Pending& p : pending) polls.push_back({p.fd.get(), POLLIN, 0});
    const int n = poll(polls.data(), polls.size(), pending.empty() ? -1 : 100);
    if (n < 0 && errno != EINTR) {
      log::Get("server")->error("handoff socket: poll: {}; handoffs stop", strerror(errno));
      return;
    }
    if (polls[0].revents != 0) return;
    const absl::Time now = absl::Now();
    // Serve readable (or hung-up) connections and drop the late ones; polls[i + 2] is pending[i].
    std::vector<Pending> kept;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (polls[i + 2].revents != 0) {
        Serve(pending[i].fd.get());
      } else if (now < pending[i].deadline) {
        kept.push_back(std::move(pending[i]));
      }
    }
    pending = std::move(kept);
    if (polls[1].revents & POLLIN) {
      UniqueFd conn(accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (conn.valid()) {
        pending.push_back({std::move(conn), now + kReadTimeout});
      } else if (errno != EAGAIN && errno != EINTR) {
        TUTTI_LOG_EVERY_N_SEC(log::Get("server"), spdlog::level::warn, 5,
                              "handoff socket: accept: {}", strerror(errno));
      }
    }
  }
}

void HandoffServer::Serve(int conn) {
  char payload[kHandoffMagicBytes + 4 + 1];  // one byte more than a request, to see longer ones
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxHandoffFds)];
  iovec iov{payload, sizeof(payload)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t got = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (got <= 0) return;  // hung up, or nothing: dropped
  std::vector<UniqueFd> fds = TakeFds(&msg);
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    Refuse(conn, absl::InternalError(absl::StrCat("SO_PEERCRED: ", strerror(errno))));
    return;
  }
  uint32_t want = 0;
  for (int i = 0; i < 4; ++i) {
    want |= uint32_t{static_cast<uint8_t>(payload[kHandoffMagicBytes + i])} << (8 * i);
  }
  if (got != static_cast<ssize_t>(kHandoffMagicBytes + 4) ||
      std::memcmp(payload, kHandoffMagic, kHandoffMagicBytes) != 0 || want > kMaxHandoffFds) {
    Refuse(conn, absl::InvalidArgumentError("not a handoff request (daemon/common/handoff.h)"));
    return;
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || fds.size() != want) {
    Refuse(conn, absl::InvalidArgumentError(
                     absl::StrCat("the request announced ", want, " descriptors and carried ",
                                  fds.size(), (msg.msg_flags & MSG_CTRUNC) ? " or more" : "")));
    return;
  }
  absl::StatusOr<std::string> token =
      table_->Issue({cred.pid, cred.uid, cred.gid}, std::move(fds));
  if (!token.ok()) {
    TUTTI_LOG_EVERY_N_SEC(log::Get("server"), spdlog::level::warn, 1,
                          "handoff from pid {} uid {} refused: {}", cred.pid, cred.uid,
                          std::string(token.status().message()));
    Refuse(conn, token.status());
    return;
  }
  Answer(conn, absl::StrCat("OK", *token));
}

}  // namespace tutti::server

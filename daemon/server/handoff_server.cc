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
#include "common/handoff.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tutti::server {
namespace {

absl::Status Errno(const std::string& path, const char* call) {
  return absl::UnavailableError(
      absl::StrCat("handoff socket ", path, ": ", call, ": ", strerror(errno)));
}

void Answer(int conn, std::string_view reply) {
  (void)send(conn, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Refuse(int conn, const absl::Status& why) {
  std::string reply =
      absl::StrCat("ER", std::string(1, static_cast<char>(why.code())), why.message());
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
                                                                    CredentialTable* table,
                                                                    const HandoffLimits& limits) {
  ASSIGN_OR_RETURN(UniqueFd fd, ListenUnixSocket(path, SOCK_SEQPACKET, access, "handoff socket"));
  UniqueFd stop(eventfd(0, EFD_CLOEXEC));
  if (!stop.valid()) return Errno(path, "eventfd");
  std::unique_ptr<HandoffServer> server(
      new HandoffServer(path, std::move(fd), std::move(stop), table, limits));
  server->thread_ = std::thread(&HandoffServer::Loop, server.get());
  log::Get("server")->info("handoff socket listening on {}", path);
  return server;
}

HandoffServer::HandoffServer(std::string path, UniqueFd listen_fd, UniqueFd stop_fd,
                             CredentialTable* table, const HandoffLimits& limits)
    : path_(std::move(path)),
      listen_fd_(std::move(listen_fd)),
      stop_fd_(std::move(stop_fd)),
      table_(table),
      limits_(limits) {}

HandoffServer::~HandoffServer() {
  const uint64_t one = 1;
  if (write(stop_fd_.get(), &one, sizeof(one)) != sizeof(one)) {
    log::Get("server")->error("handoff socket: cannot stop its thread: {}", strerror(errno));
  }
  if (thread_.joinable()) thread_.join();
  unlink(path_.c_str());
}

void HandoffServer::Loop() {
  std::vector<pollfd> polls;
  std::vector<short> revents;
  for (;;) {
    polls.clear();
    polls.push_back({stop_fd_.get(), POLLIN, 0});
    polls.push_back({listen_fd_.get(), POLLIN, 0});
    for (const Pending& p : pending_) polls.push_back({p.fd.get(), POLLIN, 0});
    const int n = poll(polls.data(), polls.size(), pending_.empty() ? -1 : 100);
    if (n < 0 && errno != EINTR) {
      log::Get("server")->error("handoff socket: poll: {}; handoffs stop", strerror(errno));
      return;
    }
    if (polls[0].revents != 0) return;
    const absl::Time now = absl::Now();
    revents.clear();
    for (size_t i = 2; i < polls.size(); ++i) revents.push_back(n > 0 ? polls[i].revents : 0);
    ServeOrExpire(revents, now);
    if (n > 0 && (polls[1].revents & POLLIN) != 0) AcceptAll(now);
  }
}

void HandoffServer::ServeOrExpire(const std::vector<short>& revents, absl::Time now) {
  std::vector<Pending> kept;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending& p = pending_[i];
    if (revents[i] == 0 && now < p.deadline) {
      kept.push_back(std::move(p));
      continue;
    }
    if (revents[i] != 0) {
      Serve(p.fd.get());
    } else {
      Refuse(p.fd.get(), absl::DeadlineExceededError(absl::StrCat(
                             "no handoff request within ",
                             absl::FormatDuration(limits_.read_timeout), " of connecting")));
    }
    if (--pending_per_uid_[p.uid] == 0) pending_per_uid_.erase(p.uid);
  }
  pending_ = std::move(kept);
}

absl::Status HandoffServer::RoomFor(uid_t uid) const {
  if (pending_.size() >= limits_.max_connections) {
    return absl::ResourceExhaustedError(
        absl::StrCat("tuttid has ", pending_.size(),
                     " handoff connections open (limits.max_handoff_connections)"));
  }
  const auto it = pending_per_uid_.find(uid);
  const uint32_t open = it == pending_per_uid_.end() ? 0 : it->second;
  if (open >= limits_.max_connections_per_user) {
    return absl::ResourceExhaustedError(
        absl::StrCat("user ", uid, " has ", open,
                     " handoff connections open (limits.max_handoff_connections_per_user)"));
  }
  return absl::OkStatus();
}

void HandoffServer::AcceptAll(absl::Time now) {
  // At most this many per round, so that a flood of connections cannot keep the thread from
  // serving the admitted ones; the rest wait for the next round (poll returns at once).
  constexpr int kAcceptsPerRound = 1024;
  for (int accepted = 0; accepted < kAcceptsPerRound; ++accepted) {
    std::optional<AcceptedPeer> next = AcceptPeer(listen_fd_.get(), "handoff socket");
    if (!next.has_value()) return;
    UniqueFd conn = std::move(next->conn);
    const ucred cred = next->peer;
    if (!next->peer_error.ok()) {
      Refuse(conn.get(), next->peer_error);
      continue;
    }
    if (absl::Status room = RoomFor(cred.uid); !room.ok()) {
      TUTTI_LOG_EVERY_N_SEC(log::Get("server"), spdlog::level::warn, 5,
                            "handoff from pid {} uid {} refused: {}", cred.pid, cred.uid,
                            std::string(room.message()));
      Refuse(conn.get(), room);
      continue;
    }
    ++pending_per_uid_[cred.uid];
    pending_.push_back({std::move(conn), cred.uid, now + limits_.read_timeout});
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
    Refuse(conn, absl::InvalidArgumentError("not a handoff request (common/handoff.h)"));
    return;
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || fds.size() != want) {
    Refuse(conn, absl::InvalidArgumentError(
                     absl::StrCat("the request announced ", want, " descriptors and carried ",
                                  fds.size(), (msg.msg_flags & MSG_CTRUNC) ? " or more" : "")));
    return;
  }
  absl::StatusOr<std::string> token = table_->Issue({cred.pid, cred.uid, cred.gid}, std::move(fds));
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

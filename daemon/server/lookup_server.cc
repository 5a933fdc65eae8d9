#include "daemon/server/lookup_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tutti::server {
namespace {

absl::Status Errno(const std::string& path, const char* call) {
  return absl::UnavailableError(
      absl::StrCat("lookup socket ", path, ": ", call, ": ", strerror(errno)));
}

// Waits until `fd` has `events` or `deadline` passes; false on the deadline or a poll error.
bool WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    int ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 60'000));
    }
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, ms);
    if (n > 0) return true;  // ready, or hung up: the read or write says which
    if (n < 0 && errno != EINTR) return false;
  }
}

// Reads exactly `n` bytes by `deadline`; false when the peer hung up, failed or was too slow.
bool ReadFull(int fd, char* p, size_t n, absl::Time deadline) {
  while (n > 0) {
    const ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return false;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (!WaitFor(fd, POLLIN, deadline)) return false;
  }
  return true;
}

bool WriteFull(int fd, const char* p, size_t n, absl::Time deadline) {
  while (n > 0) {
    const ssize_t sent = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent > 0) {
      p += sent;
      n -= static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (!WaitFor(fd, POLLOUT, deadline)) return false;
  }
  return true;
}

// A response frame: `code` and `body` (cut to fit kMaxLookupResponse).
std::string Frame(absl::StatusCode code, std::string_view body) {
  body = body.substr(0, kMaxLookupResponse);
  std::string out(kLookupHeaderBytes, '\0');
  PutLookupU32(out.data(), static_cast<uint32_t>(body.size()));
  PutLookupU32(out.data() + 4, static_cast<uint32_t>(code));
  out.append(body);
  return out;
}

std::string Frame(const absl::Status& status) {
  return Frame(status.code(), std::string_view(status.message().data(), status.message().size()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LookupServer>> LookupServer::Start(const std::string& path,
                                                                  const SocketAccess& access,
                                                                  LookupHandler handler,
                                                                  const LookupLimits& limits) {
  ASSIGN_OR_RETURN(UniqueFd fd, ListenUnixSocket(path, SOCK_STREAM, access, "lookup socket"));
  UniqueFd stop(eventfd(0, EFD_CLOEXEC));
  if (!stop.valid()) return Errno(path, "eventfd");
  std::unique_ptr<LookupServer> server(
      new LookupServer(path, std::move(fd), std::move(stop), std::move(handler), limits));
  server->accept_thread_ = std::thread(&LookupServer::AcceptLoop, server.get());
  log::Get("server")->info("lookup socket listening on {}", path);
  return server;
}

LookupServer::LookupServer(std::string path, UniqueFd listen_fd, UniqueFd stop_fd,
                           LookupHandler handler, const LookupLimits& limits)
    : path_(std::move(path)),
      listen_fd_(std::move(listen_fd)),
      stop_fd_(std::move(stop_fd)),
      handler_(std::move(handler)),
      limits_(limits) {}

LookupServer::~LookupServer() {
  const uint64_t one = 1;
  if (write(stop_fd_.get(), &one, sizeof(one)) != sizeof(one)) {
    log::Get("server")->error("lookup socket: cannot stop its thread: {}", strerror(errno));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<Conn> conns;
  {
    absl::MutexLock lock(&mu_);
    for (Conn& c : conns_) shutdown(c.fd.get(), SHUT_RDWR);  // wakes its thread
    conns.splice(conns.end(), conns_);
  }
  for (Conn& c : conns) c.thread.join();
  unlink(path_.c_str());
}

uint32_t LookupServer::open_connections() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

void LookupServer::AcceptLoop() {
  // At most this many per round, so that the stop is seen during a flood.
  constexpr int kAcceptsPerRound = 1024;
  for (;;) {
    pollfd polls[2] = {{stop_fd_.get(), POLLIN, 0}, {listen_fd_.get(), POLLIN, 0}};
    const int n = poll(polls, 2, -1);
    if (n < 0 && errno != EINTR) {
      log::Get("server")->error("lookup socket: poll: {}; it stops accepting", strerror(errno));
      return;
    }
    if (polls[0].revents != 0) return;
    if (n <= 0 || (polls[1].revents & POLLIN) == 0) continue;
    Reap();
    for (int accepted = 0; accepted < kAcceptsPerRound; ++accepted) {
      std::optional<AcceptedPeer> next = AcceptPeer(listen_fd_.get(), "lookup socket");
      if (!next.has_value()) break;
      UniqueFd conn = std::move(next->conn);
      const ucred cred = next->peer;
      if (!next->peer_error.ok()) {
        const std::string f = Frame(next->peer_error);
        (void)send(conn.get(), f.data(), f.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        continue;
      }
      absl::MutexLock lock(&mu_);
      if (absl::Status room = RoomFor(cred.uid); !room.ok()) {
        TUTTI_LOG_EVERY_N_SEC(log::Get("server"), spdlog::level::warn, 5,
                              "lookup connection of pid {} uid {} refused: {}", cred.pid, cred.uid,
                              std::string(room.message()));
        const std::string f = Frame(room);
        (void)send(conn.get(), f.data(), f.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        continue;
      }
      // Admitted: an empty OK frame (a fresh socket's buffer takes it at once).
      const std::string hello = Frame(absl::StatusCode::kOk, "");
      if (send(conn.get(), hello.data(), hello.size(), MSG_DONTWAIT | MSG_NOSIGNAL) !=
          static_cast<ssize_t>(hello.size())) {
        continue;  // gone already
      }
      Conn& c = conns_.emplace_back();
      c.fd = std::move(conn);
      c.uid = cred.uid;
      ++open_;
      ++open_per_uid_[cred.uid];
      c.thread = std::thread(&LookupServer::Serve, this, &c);
    }
  }
}

absl::Status LookupServer::RoomFor(uid_t uid) const {
  if (open_ >= limits_.max_connections) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "tuttid has ", open_, " lookup connections open (limits.max_lookup_connections)"));
  }
  const auto it = open_per_uid_.find(uid);
  const uint32_t open = it == open_per_uid_.end() ? 0 : it->second;
  if (open >= limits_.max_connections_per_user) {
    return absl::ResourceExhaustedError(
        absl::StrCat("user ", uid, " has ", open,
                     " lookup connections open (limits.max_lookup_connections_per_user)"));
  }
  return absl::OkStatus();
}

void LookupServer::Reap() {
  std::list<Conn> ended;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto next = std::next(it);
      if (it->done) ended.splice(ended.end(), conns_, it);
      it = next;
    }
  }
  for (Conn& c : ended) c.thread.join();  // past its last use of mu_; closes the fd after
}

void LookupServer::Serve(Conn* conn) {
  const int fd = conn->fd.get();
  std::string body;
  tutti::v1::LookupRequest req;
  tutti::v1::LookupResponse resp;
  std::string answer;
  for (;;) {
    // Idle between requests as long as the peer likes; a begun request has io_timeout.
    if (!WaitFor(fd, POLLIN, absl::InfiniteFuture())) break;
    const absl::Time deadline = absl::Now() + limits_.io_timeout;
    char header[kLookupHeaderBytes];
    if (!ReadFull(fd, header, sizeof(header), deadline)) break;
    const uint32_t length = GetLookupU32(header);
    const uint32_t kind = GetLookupU32(header + 4);
    if (length > limits_.max_request_bytes) {
      answer = Frame(absl::InvalidArgumentError(absl::StrCat(
          "a lookup request of ", length, " bytes is longer than the lookup socket's limit of ",
          limits_.max_request_bytes, " (limits.max_blocks_per_call); the connection is closed")));
      (void)WriteFull(fd, answer.data(), answer.size(), deadline);
      break;
    }
    body.resize(length);
    if (!ReadFull(fd, body.data(), length, deadline)) break;
    absl::Status status;
    resp.Clear();
    if (kind != kLookupKind) {
      status = absl::UnimplementedError(
          absl::StrCat("lookup socket: request kind ", kind, " is unknown (", kLookupKind,
                       ": Lookup)"));
    } else if (!req.ParseFromString(body)) {
      status = absl::InvalidArgumentError(
          "lookup socket: the request is not a serialized tutti.v1.LookupRequest");
    } else {
      status = handler_(conn->uid, req, &resp);
    }
    if (status.ok()) {
      std::string bytes;
      resp.SerializeToString(&bytes);
      answer = Frame(absl::StatusCode::kOk, bytes);
    } else {
      answer = Frame(status);
    }
    if (!WriteFull(fd, answer.data(), answer.size(), absl::Now() + limits_.io_timeout)) break;
  }
  shutdown(fd, SHUT_RDWR);
  absl::MutexLock lock(&mu_);
  conn->done = true;
  --open_;
  if (--open_per_uid_[conn->uid] == 0) open_per_uid_.erase(conn->uid);
}

}  // namespace tutti::server

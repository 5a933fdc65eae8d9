#include "common/handoff.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"

namespace tutti {
namespace {

// What a failed call on the handoff socket most likely means, for the error message.
const char* Hint(int err) {
  switch (err) {
    case ENOENT:
    case ECONNREFUSED:
      return "; is tuttid running?";
    case EACCES:
    case EPERM:
      return "; is this user in the group of tuttid's socket (listen.socket_group)?";
    case EAGAIN:
      return "; tuttid did not accept the connection in time (its backlog is full: tuttid is "
             "overloaded or stuck)";
    default:
      return "";
  }
}

absl::Status Unreachable(const std::string& path, const char* call, int err) {
  return absl::UnavailableError(
      absl::StrCat("tuttid's handoff socket ", path, ": ", call, ": ", strerror(err), Hint(err)));
}

// Waits until `fd` is readable or `timeout` has passed.
bool WaitReadable(int fd, absl::Duration timeout) {
  pollfd p{fd, POLLIN, 0};
  const int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
  int n;
  do {
    n = poll(&p, 1, ms);
  } while (n < 0 && errno == EINTR);
  return n > 0;
}

absl::Status SendRequest(int sock, absl::Span<const int> fds) {
  char payload[kHandoffMagicBytes + 4];
  std::memcpy(payload, kHandoffMagic, kHandoffMagicBytes);
  const uint32_t n = static_cast<uint32_t>(fds.size());
  for (int i = 0; i < 4; ++i) payload[kHandoffMagicBytes + i] = static_cast<char>(n >> (8 * i));
  iovec iov{payload, sizeof(payload)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxHandoffFds));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0) {
    return absl::UnavailableError(absl::StrCat("handoff: sendmsg: ", strerror(errno)));
  }
  return absl::OkStatus();
}

// The credential in tuttid's `reply`, or its refusal with the code it gave.
absl::StatusOr<std::string> ParseReply(const std::string& path, absl::string_view r) {
  if (r.size() == 2 + kCredentialBytes && r.substr(0, 2) == "OK") {
    return std::string(r.substr(2));
  }
  if (r.size() >= 3 && r.substr(0, 2) == "ER") {
    return absl::Status(static_cast<absl::StatusCode>(static_cast<uint8_t>(r[2])),
                        absl::StrCat("tuttid refused the handoff: ", r.substr(3)));
  }
  return absl::UnavailableError(absl::StrCat("tuttid's handoff socket ", path, ": an answer of ",
                                             r.size(), " bytes that is not a handoff"));
}

// A reply already waiting on `sock`, if any: tuttid refuses a connection past its limits at
// once, before it reads the request, so a failed send or a reset may have the reason queued.
// The first call may return the reset (ECONNRESET: tuttid closed with the request unread) that
// the kernel reports before the reply queued ahead of it.
std::optional<std::string> WaitingReply(int sock) {
  char reply[kMaxHandoffMessage];
  for (int attempt = 0; attempt < 2; ++attempt) {
    const ssize_t n = recv(sock, reply, sizeof(reply), MSG_DONTWAIT);
    if (n > 0) return std::string(reply, static_cast<size_t>(n));
    if (n == 0 || errno != ECONNRESET) break;
  }
  return std::nullopt;
}

}  // namespace

std::string HandoffPath(const std::string& socket_path) { return socket_path + ".handoff"; }

absl::StatusOr<std::string> HandOff(const std::string& socket_path, absl::Span<const int> fds,
                                    absl::Duration timeout) {
  if (fds.size() > kMaxHandoffFds) {
    return absl::InvalidArgumentError(
        absl::StrCat("handoff: ", fds.size(), " descriptors; at most ", kMaxHandoffFds));
  }
  const std::string path = HandoffPath(socket_path);
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("handoff path ", path, ": too long"));
  }
  UniqueFd sock(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return Unreachable(path, "socket", errno);
  // A connect to a full backlog waits this long (SO_SNDTIMEO) before EAGAIN.
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Unreachable(path, "connect", errno);
  }
  if (absl::Status s = SendRequest(sock.get(), fds); !s.ok()) {
    if (std::optional<std::string> refusal = WaitingReply(sock.get())) {
      return ParseReply(path, *refusal);
    }
    return s;
  }
  if (!WaitReadable(sock.get(), timeout)) {
    return absl::UnavailableError(absl::StrCat("tuttid's handoff socket ", path, ": no answer in ",
                                               absl::FormatDuration(timeout)));
  }
  char reply[kMaxHandoffMessage];
  const ssize_t n = recv(sock.get(), reply, sizeof(reply), 0);
  if (n < 0) {
    const int err = errno;
    if (std::optional<std::string> refusal = WaitingReply(sock.get())) {
      return ParseReply(path, *refusal);
    }
    return Unreachable(path, "recv", err);
  }
  return ParseReply(path, absl::string_view(reply, static_cast<size_t>(n)));
}

}  // namespace tutti

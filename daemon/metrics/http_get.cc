#include "daemon/metrics/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tutti::metrics {
namespace {

absl::Status Errno(const char* what, int port) {
  return absl::UnavailableError(
      absl::StrCat("GET 127.0.0.1:", port, ": ", what, ": ", std::strerror(errno)));
}

absl::Status SendAll(int fd, int port, const std::string& request) {
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("send", port);
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// A connected TCP socket to 127.0.0.1:`port` whose sends and receives give up after `timeout_ms`.
absl::StatusOr<UniqueFd> Connect(int port, int timeout_ms) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Errno("socket", port);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("connect", port);
  }
  return fd;
}

// Sends `request` on `fd` and reads until the peer closes.
absl::StatusOr<std::string> Exchange(int fd, int port, const std::string& request) {
  if (absl::Status s = SendAll(fd, port, request); !s.ok()) return s;
  std::string reply;
  char buf[16384];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("recv", port);
    if (n == 0) return reply;
    reply.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace

absl::StatusOr<std::string> HttpGet(int port, const std::string& path, int timeout_ms,
                                    const std::string& basic_auth) {
  absl::StatusOr<UniqueFd> fd = Connect(port, timeout_ms);
  if (!fd.ok()) return fd.status();
  std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n");
  if (!basic_auth.empty()) {
    absl::StrAppend(&request, "Authorization: Basic ", absl::Base64Escape(basic_auth), "\r\n");
  }
  absl::StatusOr<std::string> reply = Exchange(fd->get(), port, request + "\r\n");
  if (!reply.ok()) return reply.status();
  const size_t end = reply->find("\r\n\r\n");
  const std::string status_line = reply->substr(0, reply->find("\r\n"));
  if (end == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("GET ", path, ": no header end in ", reply->size(), " bytes of reply"));
  }
  if (status_line.find(" 200 ") == std::string::npos) {
    return absl::InternalError(absl::StrCat("GET ", path, ": ", status_line));
  }
  return reply->substr(end + 4);
}

absl::StatusOr<UniqueFd> OpenHalfSentRequest(int port) {
  absl::StatusOr<UniqueFd> fd = Connect(port, 5000);
  if (!fd.ok()) return fd.status();
  if (absl::Status s = SendAll(fd->get(), port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n");
      !s.ok()) {
    return s;
  }
  return fd;
}

}  // namespace tutti::metrics

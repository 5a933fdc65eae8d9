#include "daemon/metrics/http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tutti::metrics {
namespace {

absl::Status Errno(const char* what, int port) {
  return absl::UnavailableError(
      absl::StrCat("GET 127.0.0.1:", port, ": ", what, ": ", std::strerror(errno)));
}

// Sends `request` on `fd` and reads until the peer closes.
absl::StatusOr<std::string> Exchange(int fd, int port, const std::string& request) {
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("send", port);
    sent += static_cast<size_t>(n);
  }
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

absl::StatusOr<std::string> HttpGet(int port, const std::string& path, int timeout_ms) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket", port);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  absl::StatusOr<std::string> reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    reply = Errno("connect", port);
  } else {
    reply = Exchange(fd, port, absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"));
  }
  close(fd);
  if (!reply.ok()) return reply.status();
  const size_t end = reply->find("\r\n\r\n");
  const std::string status_line = reply->substr(0, reply->find("\r\n"));
  if (end == std::string::npos) {
    return absl::InternalError(absl::StrCat("GET ", path, ": no header end in ", reply->size(),
                                            " bytes of reply"));
  }
  if (status_line.find(" 200 ") == std::string::npos) {
    return absl::InternalError(absl::StrCat("GET ", path, ": ", status_line));
  }
  return reply->substr(end + 4);
}

}  // namespace tutti::metrics

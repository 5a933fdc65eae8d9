// A tiny blocking HTTP/1.0 GET over a TCP socket, for tests that scrape /metrics. Test support:
// no TLS, no redirects, no chunked bodies (prometheus-cpp answers HTTP/1.0 with a plain body).
#ifndef TUTTI_DAEMON_METRICS_HTTP_GET_H_
#define TUTTI_DAEMON_METRICS_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace tutti::metrics {

// The body of GET http://127.0.0.1:`port``path`, with HTTP basic auth when `basic_auth`
// ("user:password") is not empty. UNAVAILABLE (with strerror) when it cannot connect or read,
// within about `timeout_ms` per step; INTERNAL for a status other than 200 (the status line is in
// the message) or a reply with no header end.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path, int timeout_ms = 5000,
                                    const std::string& basic_auth = "");

// A connection to 127.0.0.1:`port` that has sent the start of a GET and not its end (no blank
// line): what a client that stalls mid-request leaves the server. UNAVAILABLE when it cannot
// connect or send.
absl::StatusOr<UniqueFd> OpenHalfSentRequest(int port);

}  // namespace tutti::metrics

#endif  // TUTTI_DAEMON_METRICS_HTTP_GET_H_

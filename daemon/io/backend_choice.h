// Which I/O backend runs when the configured one cannot run on this host (io.fallback), and why:
// one decision shared by the backends that may fall back ("uring_cmd", "gds", "nvme"), reported
// in the log, in StatusResponse (io_backend, io_backend_requested, io_backend_reason) and metrics.
//
// Thread-safety: plain functions; thread-safe.
#ifndef TUTTI_DAEMON_IO_BACKEND_CHOICE_H_
#define TUTTI_DAEMON_IO_BACKEND_CHOICE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti::io {

struct BackendChoice {
  std::string backend;    // the backend that runs
  std::string requested;  // io.backend
  std::string reason;     // why `backend` differs from `requested`; empty when it does not
};

// The configured backend runs: {requested, requested, ""}.
BackendChoice Chosen(const std::string& requested);

// `requested` could not start here because of `why`. With `fallback` "uring" or "" (the default)
// returns {"uring", requested, "<requested> cannot run: <why's message>"}: the caller then opens
// the pool on pool.dirs through io_uring. With "fail" returns `why`'s code with a message naming
// io.backend and io.fallback. A `why` of INVALID_ARGUMENT (a configuration error, not the host) is
// returned as it is with either setting. `why` must not be OK.
absl::StatusOr<BackendChoice> ChooseFallback(const std::string& requested,
                                             const std::string& fallback, const absl::Status& why);

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_BACKEND_CHOICE_H_

// Which I/O backend start-up chose, and why: one value shown in the log, in Admin.Status
// (io_backend, io_backend_requested, io_backend_reason) and in the metric tutti_io_backend_info.
// Every backend that can fall back (gds, uring_cmd, nvme) reports through this one type, and the
// decision of what runs instead (io.fallback) is ChooseFallback's.
//
// Thread-safety: plain functions; thread-safe.
#ifndef TUTTI_DAEMON_IO_BACKEND_CHOICE_H_
#define TUTTI_DAEMON_IO_BACKEND_CHOICE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti::io {

struct BackendChoice {
  std::string backend;    // the backend running, e.g. "uring"
  std::string requested;  // io.backend as configured (the default filled in), e.g. "gds"
  // Empty when backend == requested; otherwise why the requested one could not run, in words,
  // starting with its name, e.g. "gds: cuFileHandleRegister(pool file 0): CU_FILE_... (5027)".
  std::string reason;

  bool fell_back() const { return backend != requested; }
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

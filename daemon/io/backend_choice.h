// Which I/O backend start-up chose, and why: one value shown in the log, in Admin.Status
// (io_backend, io_backend_requested, io_backend_reason) and in the metric tutti_io_backend_info.
//
// And the fallback rule, written here only. OpenIoBackend (io_factory.h) is its one caller at
// start-up, for every backend; the daemon opens the pool through it (daemon/open_pool.h).
//
//  1. A backend's opener answers UNAVAILABLE when, and only when, the backend cannot run on this
//     host; each opener's header says which failures those are ("gds": no GPU staging, no
//     libcufile, cuFileDriverOpen or cuFileHandleRegister failing; "nvme": ProbeVfio's failure;
//     "uring_cmd": its char devices cannot be opened or used for passthrough -- missing, not a char
//     device, not NVMe, no permission, a kernel without IORING_OP_URING_CMD). "uring" is what the
//     others fall back to and never falls back itself.
//  2. Such a failure, with io.fallback "uring" or "" (the default): kFallbackBackend ("uring")
//     runs over the pool files of pool.dirs, and BackendChoice::reason says why (see
//     ChooseFallback). With "fail": start-up stops with FAILED_PRECONDITION,
//     `io.backend "<requested>" cannot run on this host and io.fallback is "fail": <cause>`
//     (docs/operations.md).
//  3. Any other failure (a configuration error, a pool file that does not match its layout, an
//     SSD that passes the probe but cannot be brought up, ...) stops start-up as it is, whatever
//     io.fallback says.
//
// Thread-safety: plain functions; thread-safe.
#ifndef TUTTI_DAEMON_IO_BACKEND_CHOICE_H_
#define TUTTI_DAEMON_IO_BACKEND_CHOICE_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti::io {

struct BackendChoice {
  std::string backend;    // the backend running, e.g. "uring"
  std::string requested;  // io.backend as configured (the default filled in), e.g. "gds"
  // Empty when backend == requested; otherwise why the requested one could not run, in words,
  // starting with its name, e.g. "gds: cuFileHandleRegister(pool file 0): CU_FILE_... (5027)" or
  // "uring_cmd cannot run: io.passthrough_devices: open /dev/ng0n1: No such file or directory".
  std::string reason;

  bool fell_back() const { return backend != requested; }
};

// The configured backend runs: {requested, requested, ""}.
BackendChoice Chosen(std::string_view requested);

// OK if `fallback` is a value io.fallback takes (kFallbackValues, backend_registry.h); otherwise
// INVALID_ARGUMENT naming the allowed ones.
absl::Status CheckFallbackSetting(std::string_view fallback);

// True when `why`, the failure of opening `requested`, means it cannot run on this host (rule 1:
// UNAVAILABLE, and `requested` is not the fallback itself).
bool CannotRunHere(std::string_view requested, const absl::Status& why);

// The rule, for `requested` that failed to open with `why` (not OK):
//  - INVALID_ARGUMENT if `fallback` is not a value io.fallback takes;
//  - `why` as it is when !CannotRunHere(requested, why) (rule 3);
//  - with `fallback` "fail": FAILED_PRECONDITION `io.backend "<requested>" cannot run on this host
//    and io.fallback is "fail": <why's message>`;
//  - with "uring" or "": {"uring", requested, reason}, where the reason is why's message when it
//    already starts with "<requested>: " (gds's do), else "<requested> cannot run: <message>".
//    The caller then opens "uring" over the pool files of pool.dirs.
absl::StatusOr<BackendChoice> ChooseFallback(std::string_view requested, std::string_view fallback,
                                             const absl::Status& why);

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_BACKEND_CHOICE_H_

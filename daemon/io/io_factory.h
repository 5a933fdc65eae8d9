// Opens an I/O backend by its configured name (config.proto IoConfig.backend): the one way the
// daemon opens the pool's backend (OpenIoBackend, with the fallback rule of backend_choice.h),
// and CreateIoBackend, the factories alone (tests, tools).
//
// Thread-safety: the functions are thread-safe; see io_backend.h for the backends.
#ifndef TUTTI_DAEMON_IO_IO_FACTORY_H_
#define TUTTI_DAEMON_IO_IO_FACTORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/io/backend_choice.h"
#include "daemon/io/gds_backend.h"
#include "daemon/io/io_backend.h"
#include "daemon/io/nvme_open.h"

namespace tutti::io {

struct IoOptions {
  uint32_t queue_depth = 64;  // requests in flight per file (queue pair for "nvme"), 1 .. 4096
  uint32_t memory_read_workers = 16;  // "uring": UringOptions::memory_read_workers
  uint32_t memory_read_rings = 1;     // "uring": UringOptions::memory_read_rings
  // io.fallback, for OpenIoBackend: "uring" (or empty) or "fail".
  std::string fallback = "uring";
  GdsOptions gds;  // "gds": where libcufile is, and whether the daemon has GPU staging
  // "nvme": io.nvme_devices and io.nvme_nsid (its queue_depth is replaced by the one above).
  NvmeOpenOptions nvme;
  // "uring_cmd" through OpenIoBackend: io.passthrough_devices, the namespaces' char devices.
  std::vector<std::string> passthrough_devices;
};

// The names CreateIoBackend accepts: backend_registry.h's kBackendNames ("uring", "memory", "gds",
// "uring_cmd", "nvme"), the list config validates io.backend against.
std::vector<std::string_view> IoBackendNames();

// Creates the backend called `name` over the pool's files. No fallback.
//  - "uring": `fds` are the pool files opened O_DIRECT, in pool order; the backend owns them from
//    this call on (they are closed on error too). If `file_sizes` is not empty it must hold each
//    file's actual size, else FAILED_PRECONDITION (a pool file that does not match its layout;
//    INVALID_ARGUMENT when it holds a different number of sizes); "gds" checks the same.
//  - "memory": files of `file_sizes` bytes in host memory; nothing persists. `fds`, if any, are
//    closed.
//  - "gds": cuFile over the same files as "uring" (gds_backend.h); UNAVAILABLE when it cannot
//    run on this host, the fds closed.
//  - "uring_cmd": `fds` are NVMe generic char devices (OpenPassthroughDevices in
//    uring_cmd_backend.h), owned from this call on; when `fds` is empty, options.
//    passthrough_devices are opened here. Each backend "file" is a whole namespace, and
//    `file_sizes`, if given, must each fit in its namespace, else FAILED_PRECONDITION. Every
//    failure to open or use the devices (OpenPassthroughDevices', UringCmdBackend::Create's) but
//    INVALID_ARGUMENT is UNAVAILABLE, with their message (it names the device and the errno):
//    passthrough cannot run here.
//  - "nvme": tuttid's own NVMe driver on options.nvme's SSDs (OpenNvmeBackend, nvme_open.h); each
//    file is a whole namespace. `fds` are not used; `file_sizes`, if given, must each
//    fit in its namespace, else FAILED_PRECONDITION. UNAVAILABLE (with ProbeVfio's reason) when
//    vfio cannot be used here.
// Errors: INVALID_ARGUMENT naming the allowed values for an unknown `name`; otherwise those of
// UringBackend::Create / MemoryDisk::Create / GdsBackend::Create / UringCmdBackend::Create /
// OpenNvmeBackend, as above.
absl::StatusOr<std::unique_ptr<IoBackend>> CreateIoBackend(std::string_view name,
                                                           std::vector<int> fds,
                                                           std::vector<uint64_t> file_sizes,
                                                           const IoOptions& options = {});

// A backend and what start-up chose.
struct OpenedBackend {
  std::unique_ptr<IoBackend> backend;
  BackendChoice choice;
};

// The pool files on pool.dirs (PoolPlaces::kFiles, backend_registry.h): `fds` opened O_DIRECT, in
// pool order, each of `sizes[i]` bytes (its layout's).
struct PoolFileSet {
  std::vector<int> fds;
  std::vector<uint64_t> sizes;
};
// Gives OpenIoBackend the pool files when it needs them, and only then: with `open` true the
// files themselves (created on first start), for a backend over files ("uring", "gds") and for
// the fallback; with `open` false only their sizes, for "memory". Called at most once with `open`
// true, and not at all for a backend on whole namespaces that runs. Its error is returned as it
// is (for the fallback: prefixed as the fallback's own errors below).
using PoolFilesSource = std::function<absl::StatusOr<PoolFileSet>(bool open)>;

// What start-up calls, for every backend: opens `requested` where backend_registry.h says its pool
// lives (the files of `files`; or options.passthrough_devices, options.nvme's SSDs: whole
// namespaces, the files' sizes not used), and applies the fallback rule (backend_choice.h) when it
// cannot run on this host: with options.fallback "uring" or empty it opens "uring" over the files
// of `files` instead and says why in `choice.reason`. The caller logs the choice, and puts it in
// Admin.Status and the metrics. A backend over files that answers UNAVAILABLE leaves the fds to
// the fallback (the factories' contract).
// Errors: INVALID_ARGUMENT for an io.fallback value not allowed (checked first) or an unknown
// `requested`; FAILED_PRECONDITION naming the reason when the requested backend cannot run here
// and options.fallback is "fail"; the fallback's own errors with its code, prefixed "fallback to
// uring (<reason>) failed: "; otherwise as CreateIoBackend. Every fd taken from `files` is closed
// on every error.
absl::StatusOr<OpenedBackend> OpenIoBackend(std::string_view requested,
                                            const PoolFilesSource& files,
                                            const IoOptions& options = {});

// The same over pool files opened already (tests, gds_probe): `fds` and their `file_sizes`, owned
// from this call on and closed on every error. The backends on whole namespaces do not see
// `file_sizes`.
absl::StatusOr<OpenedBackend> OpenIoBackend(std::string_view requested, std::vector<int> fds,
                                            std::vector<uint64_t> file_sizes,
                                            const IoOptions& options = {});

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_IO_FACTORY_H_

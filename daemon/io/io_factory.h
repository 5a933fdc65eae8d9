// Picks an I/O backend by its configured name (config.proto IoConfig.backend).
//
// Thread-safety: the functions are thread-safe; see io_backend.h for the backends.
#ifndef TUTTI_DAEMON_IO_IO_FACTORY_H_
#define TUTTI_DAEMON_IO_IO_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/io/backend_choice.h"
#include "daemon/io/gds_backend.h"
#include "daemon/io/io_backend.h"
#include "daemon/io/nvme_open.h"

namespace tutti::io {

struct IoOptions {
  uint32_t queue_depth = 64;  // "uring": requests in flight per file, 1 .. 4096
  uint32_t memory_read_workers = 16;  // "uring": UringOptions::memory_read_workers
  // io.fallback, for OpenIoBackend: "uring" (or empty) or "fail".
  std::string fallback = "uring";
  GdsOptions gds;  // "gds": where libcufile is, and whether the daemon has GPU staging
  // "nvme": io.nvme_devices and io.nvme_nsid (its queue_depth is replaced by the one above).
  NvmeOpenOptions nvme;
};

// The names CreateIoBackend accepts: backend_registry.h's kBackendNames ("uring", "memory", "gds",
// "uring_cmd", "nvme"), the list config validates io.backend against.
std::vector<std::string_view> IoBackendNames();

// Creates the backend called `name` over the pool's files.
//  - "uring": `fds` are the pool files opened O_DIRECT, in pool order; the backend owns them from
//    this call on (they are closed on error too). If `file_sizes` is not empty it must hold each
//    file's actual size, else FAILED_PRECONDITION (a pool file that does not match its layout).
//  - "memory": files of `file_sizes` bytes in host memory; nothing persists. `fds`, if any, are
//    closed.
//  - "gds": cuFile over the same files as "uring" (gds_backend.h); UNAVAILABLE when it cannot
//    run on this host, the fds closed.
//  - "uring_cmd": `fds` are NVMe generic char devices (OpenPassthroughDevices in
//    uring_cmd_backend.h), owned from this call on; each backend "file" is a whole namespace, and
//    `file_sizes`, if given, must each fit in its namespace, else FAILED_PRECONDITION.
//  - "nvme": tuttid's own NVMe driver on options.nvme's SSDs (OpenNvmeBackend, nvme_open.h); each
//    file is a whole namespace. `fds` are not used; `file_sizes`, if given, must each
//    fit in its namespace, else FAILED_PRECONDITION. UNAVAILABLE (with ProbeVfio's reason) when
//    vfio cannot be used here.
// Errors: INVALID_ARGUMENT naming the allowed values for an unknown `name`; otherwise those of
// UringBackend::Create / MemoryDisk::Create / GdsBackend::Create / UringCmdBackend::Create.
absl::StatusOr<std::unique_ptr<IoBackend>> CreateIoBackend(std::string_view name,
                                                           std::vector<int> fds,
                                                           std::vector<uint64_t> file_sizes,
                                                           const IoOptions& options = {});

// A backend and what start-up chose.
struct OpenedBackend {
  std::unique_ptr<IoBackend> backend;
  BackendChoice choice;
};

// What start-up calls: CreateIoBackend(requested, ...), except that when the requested backend
// cannot run on this host (it answers UNAVAILABLE: no cuFile, no passthrough device, ...) and
// options.fallback is "uring" or empty, it opens "uring" over the same fds instead and says why in
// `choice.reason` (the requested backend's message, e.g. "gds: cuFileDriverOpen: ..."). The
// caller logs it, and puts it in Admin.Status and the metrics.
// Errors: FAILED_PRECONDITION naming the reason when the requested backend cannot run here and
// options.fallback is "fail"; INVALID_ARGUMENT for another fallback value; otherwise as
// CreateIoBackend (the fallback's own errors included). The fds are closed on every error.
absl::StatusOr<OpenedBackend> OpenIoBackend(std::string_view requested, std::vector<int> fds,
                                            std::vector<uint64_t> file_sizes,
                                            const IoOptions& options = {});

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_IO_FACTORY_H_

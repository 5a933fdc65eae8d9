// Start-up of the pool and its I/O backend, for every io.backend: where the pool lives (the files
// of pool.dirs, host memory, or whole NVMe namespaces) is the backend registry's
// (daemon/io/backend_registry.h), the opening and the fallback rule are io::OpenIoBackend's
// (daemon/io/io_factory.h, backend_choice.h); this lays the pool out and opens or creates it there.
//
// Thread-safety: call once, at start-up.
#ifndef TUTTI_DAEMON_OPEN_POOL_H_
#define TUTTI_DAEMON_OPEN_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/io/backend_choice.h"
#include "daemon/io/gds_backend.h"
#include "daemon/io/io_backend.h"
#include "daemon/pool/layout.h"
#include "proto/tutti/v1/config.pb.h"

namespace tutti {

struct OpenedPool {
  std::unique_ptr<io::IoBackend> backend;  // never null on success
  pool::PoolLayout layout;
  // store::PoolIdOf of the pool's uuid; 0 for "memory", whose pool is new at every start.
  uint64_t pool_id = 0;
  io::BackendChoice choice;  // what io.backend asked for, what runs, and why they differ
  // Where the pool is: pool.dirs, or the namespaces as configured (io.passthrough_devices,
  // io.nvme_devices) when a backend on whole namespaces runs.
  std::vector<std::string> places;
};

// Opens the backend io.backend names through io::OpenIoBackend (its options from `config`;
// `gds`: whether the daemon has GPU staging, and another libcufile for tests), which falls back
// to "uring" over pool.dirs, or refuses with io.fallback "fail", when the backend cannot run on
// this host (backend_choice.h's rule). Then:
//  - a backend over files ("uring", "gds"): the pool laid out over pool.dirs (pool.capacity_bytes)
//    and its files opened, or created on first start (pool::OpenOrCreatePool; only the default
//    directory, state_dir/pool, is created);
//  - "memory": the same layout, in host memory;
//  - a backend on whole namespaces ("uring_cmd", "nvme"): the pool laid out over the namespaces
//    (pool.capacity_bytes, at most their number times the smallest) and opened or created there
//    (pool::OpenOrCreateRawPool). A namespace that holds something else is an error whatever
//    io.fallback says, as is a layout that does not fit.
// The fallback itself is not logged here: the caller logs `choice` (main.cc).
absl::StatusOr<OpenedPool> OpenPool(const v1::Config& config, const io::GdsOptions& gds);

}  // namespace tutti

#endif  // TUTTI_DAEMON_OPEN_POOL_H_

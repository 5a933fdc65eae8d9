// Start-up of the pool on raw NVMe namespaces through io_uring passthrough (io.backend
// "uring_cmd"), with the fallback to io_uring on pool.dirs when passthrough cannot run here.
//
// Thread-safety: call once, at start-up.
#ifndef TUTTI_DAEMON_PASSTHROUGH_POOL_H_
#define TUTTI_DAEMON_PASSTHROUGH_POOL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/io/backend_choice.h"
#include "daemon/io/io_backend.h"
#include "daemon/pool/layout.h"
#include "proto/tutti/v1/config.pb.h"

namespace tutti {

struct PassthroughPool {
  // Null when io.backend is not "uring_cmd" or when it fell back: then `choice` says what to run
  // instead (over pool.dirs) and why, and `layout` is empty.
  std::unique_ptr<io::IoBackend> backend;
  std::optional<pool::PoolLayout> layout;  // of the pool on the namespaces
  uint64_t pool_id = 0;                    // store::PoolIdOf of the pool's uuid
  io::BackendChoice choice;
  std::vector<std::string> devices;  // the namespaces as configured (empty for other backends)
};

// For io.backend "uring_cmd": opens io.passthrough_devices, reads their geometry, lays the pool
// out over them (pool.capacity_bytes, at most the number of namespaces times the smallest) and
// opens or creates it (pool::OpenOrCreateRawPool). When the devices cannot be used for
// passthrough (missing, not char devices, not NVMe, permission, kernel without uring_cmd) the
// result is io::ChooseFallback's: a fallback (logged as a warning) or its error with io.fallback
// "fail". A namespace that passthrough can use but that holds something else is an error whatever
// io.fallback says (pool::OpenOrCreateRawPool's errors), as is a layout that does not fit.
// For io.backend "nvme" the same over the SSDs of io.nvme_devices (namespace io.nvme_nsid of each,
// through io_factory's "nvme"), except that only UNAVAILABLE (ProbeVfio: no vfio for the address)
// falls back; an SSD that passes the probe but cannot be opened or brought up is an error.
// For any other io.backend: returns {nullptr, {}, 0, Chosen(io.backend)}.
absl::StatusOr<PassthroughPool> OpenPassthroughPool(const v1::Config& config);

}  // namespace tutti

#endif  // TUTTI_DAEMON_PASSTHROUGH_POOL_H_

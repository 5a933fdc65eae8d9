#include "daemon/passthrough_pool.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/io/io_factory.h"
#include "daemon/io/uring_cmd_backend.h"
#include "daemon/pool/raw_pool.h"
#include "daemon/store/events.h"

namespace tutti {
namespace {

// The backend over the namespaces, or why it cannot run here.
absl::StatusOr<std::unique_ptr<io::IoBackend>> OpenDevices(const v1::Config& config,
                                                           const std::vector<std::string>& paths) {
  if (config.io().backend() == "nvme") {  // tuttid's own driver over vfio-pci (nvme_open.h)
    io::IoOptions o;
    o.queue_depth = config.io().queue_depth();
    o.nvme.pci_addresses = paths;
    o.nvme.nsid = config.io().nvme_nsid();
    return io::CreateIoBackend("nvme", {}, {}, o);
  }
  ASSIGN_OR_RETURN(std::vector<int> fds, io::OpenPassthroughDevices(paths));
  return io::CreateIoBackend("uring_cmd", std::move(fds), {},
                             io::IoOptions{config.io().queue_depth()});
}

}  // namespace

absl::StatusOr<PassthroughPool> OpenPassthroughPool(const v1::Config& config) {
  PassthroughPool out;
  const std::string& name = config.io().backend();
  out.choice = io::Chosen(name);
  if (name != "uring_cmd" && name != "nvme") return out;
  const auto& devices = name == "nvme" ? config.io().nvme_devices()
                                       : config.io().passthrough_devices();
  const std::vector<std::string> paths(devices.begin(), devices.end());
  out.devices = paths;
  auto backend = OpenDevices(config, paths);
  if (!backend.ok()) {
    // "nvme": only the probe's UNAVAILABLE (no vfio here) falls back; a controller that is there
    // but cannot be opened or brought up stops start-up.
    if (name == "nvme" && !absl::IsUnavailable(backend.status())) return backend.status();
    ASSIGN_OR_RETURN(out.choice,
                     io::ChooseFallback(name, config.io().fallback(), backend.status()));
    log::Get("main")->warn("io: {}; falling back to {} on pool.dirs (io.fallback \"{}\")",
                           out.choice.reason, out.choice.backend, config.io().fallback());
    return out;
  }
  std::vector<uint64_t> sizes;
  for (uint32_t i = 0; i < (*backend)->num_files(); ++i) sizes.push_back((*backend)->file_size(i));
  const v1::PoolConfig& p = config.pool();
  ASSIGN_OR_RETURN(out.layout, pool::PoolLayout::Compute(
                                   pool::RawPoolCapacity(p.capacity_bytes(), sizes), paths.size(),
                                   p.object_bytes(), p.max_objects(), p.extent_slots()));
  ASSIGN_OR_RETURN(const pool::RawPool raw,
                   pool::OpenOrCreateRawPool(backend->get(), paths, *out.layout,
                                             name == "nvme" ? "io.nvme_devices"
                                                            : "io.passthrough_devices"));
  log::Get("main")->info("pool {}: {} on the raw namespaces {} ({})", raw.UuidHex(),
                         raw.created ? "created" : "opened", absl::StrJoin(paths, ", "),
                         name == "nvme" ? "tuttid's NVMe driver" : "io_uring passthrough");
  out.pool_id = store::PoolIdOf(raw.uuid);
  out.backend = *std::move(backend);
  return out;
}

}  // namespace tutti

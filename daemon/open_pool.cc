#include "daemon/open_pool.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/dirs.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/io/backend_registry.h"
#include "daemon/io/io_factory.h"
#include "daemon/pool/pool_files.h"
#include "daemon/pool/raw_pool.h"
#include "daemon/store/events.h"

namespace tutti {
namespace {

std::vector<std::string> DevicesOf(const v1::IoConfig& io, const io::BackendSpec& spec) {
  const auto& d = spec.places == io::PoolPlaces::kPciDevices ? io.nvme_devices()
                                                             : io.passthrough_devices();
  return std::vector<std::string>(d.begin(), d.end());
}

io::IoOptions IoOptionsOf(const v1::Config& config, const io::GdsOptions& gds) {
  io::IoOptions o;
  o.queue_depth = config.io().queue_depth();
  o.memory_read_workers = config.io().memory_read_workers();
  o.memory_read_rings = config.io().memory_read_rings();
  o.fallback = config.io().fallback();
  o.gds = gds;
  o.nvme.pci_addresses.assign(config.io().nvme_devices().begin(),
                              config.io().nvme_devices().end());
  o.nvme.nsid = config.io().nvme_nsid();
  o.passthrough_devices.assign(config.io().passthrough_devices().begin(),
                               config.io().passthrough_devices().end());
  return o;
}

void LogLayout(const v1::Config& config, const pool::PoolLayout& layout) {
  log::Get("main")->info(
      "pool: {} files of {} bytes, {} slots of {} objects x {} bytes, in extents of {} slots per "
      "file (pool.extent_slots = {})",
      layout.num_files(), layout.file_bytes(), layout.num_slots(), layout.max_objects(),
      layout.object_bytes(), layout.extent_slots(), config.pool().extent_slots());
}

// The pool on pool.dirs: laid out (into out->layout), and with `open` its files opened or created
// (out->pool_id). For io::OpenIoBackend, which asks when a backend over files runs.
absl::StatusOr<io::PoolFileSet> PoolOnDirs(const v1::Config& config, bool open, OpenedPool* out) {
  const v1::PoolConfig& p = config.pool();
  ASSIGN_OR_RETURN(out->layout,
                   pool::PoolLayout::Compute(p.capacity_bytes(), p.dirs_size(), p.object_bytes(),
                                             p.max_objects(), p.extent_slots()));
  LogLayout(config, out->layout);
  io::PoolFileSet set;
  set.sizes.assign(out->layout.num_files(), out->layout.file_bytes());
  if (!open) return set;
  // Only the default pool directory is created. A configured one must exist: it is an SSD's
  // mount point, and creating it would silently put the pool on the root filesystem when the SSD
  // is not mounted.
  const std::string default_dir = config.state_dir() + "/pool";
  for (const std::string& d : out->places) {
    if (d == default_dir) RETURN_IF_ERROR(MakeDirs(d, 0750));
  }
  auto log = log::Get("main");
  int last_tenth = -1;
  ASSIGN_OR_RETURN(pool::PoolFiles files,
                   pool::OpenOrCreatePool(
                       out->places, out->layout,
                       [&](const std::string& path, uint64_t done, uint64_t total) {
                         const int tenth = total == 0 ? 10 : static_cast<int>(done * 10 / total);
                         if (tenth == last_tenth) return;
                         last_tenth = tenth;
                         log->info("pool: allocating {}: {}%", path, tenth * 10);
                       }));
  log->info("pool {}: {} {}", files.UuidHex(), files.created ? "created" : "opened",
            absl::StrJoin(files.paths, ", "));
  out->pool_id = store::PoolIdOf(files.uuid);
  set.fds = files.TakeFds();
  return set;
}

// The pool on the namespaces `backend` runs on (each of its files a whole namespace).
absl::Status PoolOnDevices(const v1::Config& config, const io::BackendSpec& spec,
                           OpenedPool* out) {
  out->places = DevicesOf(config.io(), spec);
  std::vector<uint64_t> sizes;
  for (uint32_t i = 0; i < out->backend->num_files(); ++i) {
    sizes.push_back(out->backend->file_size(i));
  }
  const v1::PoolConfig& p = config.pool();
  ASSIGN_OR_RETURN(out->layout, pool::PoolLayout::Compute(
                                    pool::RawPoolCapacity(p.capacity_bytes(), sizes),
                                    out->places.size(), p.object_bytes(), p.max_objects(),
                                    p.extent_slots()));
  ASSIGN_OR_RETURN(const pool::RawPool raw,
                   pool::OpenOrCreateRawPool(out->backend.get(), out->places, out->layout,
                                             std::string(spec.devices_field)));
  log::Get("main")->info("pool {}: {} on the raw namespaces {} ({})", raw.UuidHex(),
                         raw.created ? "created" : "opened", absl::StrJoin(out->places, ", "),
                         spec.places == io::PoolPlaces::kPciDevices ? "tuttid's NVMe driver"
                                                                    : "io_uring passthrough");
  LogLayout(config, out->layout);
  out->pool_id = store::PoolIdOf(raw.uuid);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenedPool> OpenPool(const v1::Config& config, const io::GdsOptions& gds) {
  OpenedPool out;
  out.places.assign(config.pool().dirs().begin(), config.pool().dirs().end());
  ASSIGN_OR_RETURN(
      io::OpenedBackend opened,
      io::OpenIoBackend(
          config.io().backend(),
          [&](bool open) { return PoolOnDirs(config, open, &out); }, IoOptionsOf(config, gds)));
  out.backend = std::move(opened.backend);
  out.choice = std::move(opened.choice);
  const io::BackendSpec* running = io::FindBackend(out.backend->name());
  if (running != nullptr && io::OnWholeDevices(running->places)) {
    RETURN_IF_ERROR(PoolOnDevices(config, *running, &out));
  }
  return out;
}

}  // namespace tutti

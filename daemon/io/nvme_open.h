// Opening the "nvme" backend over SSDs dedicated to tuttid (io.nvme_devices): for each PCI address
// ProbeVfio, VfioDevice::Open, Controller::Create, then one NvmeBackend over all of them. The
// returned IoBackend owns every part, so their lifetimes nest: the devices outlive the controllers,
// which outlive the NvmeBackend. Destroying it stops the backend's workers (queued work finished),
// shuts each controller down (CC.SHN, so no write is left in a volatile cache) and closes each vfio
// device (bus mastering off), after which tools/nvme_bind.sh can hand the SSD back to the kernel.
//
// Thread-safety: OpenNvmeBackend is thread-compatible (start-up); the result is as IoBackend.
#ifndef TUTTI_DAEMON_IO_NVME_OPEN_H_
#define TUTTI_DAEMON_IO_NVME_OPEN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/io/io_backend.h"
#include "daemon/io/nvme/device.h"

namespace tutti::io {

struct NvmeOpenOptions {
  std::vector<std::string> pci_addresses;  // io.nvme_devices; pool file i is SSD i's namespace
  uint32_t nsid = 1;                       // io.nvme_nsid
  uint32_t queue_depth = 64;               // io.queue_depth: entries of each I/O queue pair
  std::string sysfs_root = "/sys";         // tests: a made-up tree
  std::string dev_root = "/dev";
};

// One opened SSD: its BAR0 and DMA memory, kept alive by `owner` (a VfioDevice, or a model in
// tests), which is destroyed after the SSD's controller.
struct OpenedNvmeDevice {
  std::shared_ptr<void> owner;
  nvme::RegisterSpace* regs = nullptr;
  nvme::DmaAllocator* dma = nullptr;
};
// Opens the SSD at a PCI address. UNAVAILABLE means "cannot run on this host" (the fallback).
using NvmeDeviceOpener =
    std::function<absl::StatusOr<OpenedNvmeDevice>(const std::string& pci_address)>;

// The real opener: ProbeVfio (any failure becomes UNAVAILABLE "io.nvme_devices: ADDR: <the
// probe's reason>", which start-up's fallback to io_uring reports), then VfioDevice::Open (its
// errors as they are, except its UNAVAILABLE -- the group open in another process, e.g. a second
// tuttid -- which becomes FAILED_PRECONDITION: a device that is there but busy must not send the
// pool elsewhere).
NvmeDeviceOpener VfioOpener(const NvmeOpenOptions& options);

// Opens every device with `opener` (VfioOpener(options) when null), brings its controller up on
// namespace options.nsid with one queue pair of options.queue_depth entries, and makes the backend.
// Errors: INVALID_ARGUMENT without addresses; the opener's (UNAVAILABLE: fall back); then
// Controller::Create's and NvmeBackend::Create's, prefixed with the address. Whatever was opened
// is shut down and closed again on error.
absl::StatusOr<std::unique_ptr<IoBackend>> OpenNvmeBackend(const NvmeOpenOptions& options,
                                                           NvmeDeviceOpener opener = nullptr);

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_NVME_OPEN_H_

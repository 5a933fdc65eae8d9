// The block devices behind tuttid's pool directories (tuttictl devices): a walk of sysfs from a
// directory's st_dev to its disk (through a partition, device-mapper or md to the disks beneath),
// and, for an NVMe namespace, its controller's identify data and SMART / health log via libnvme.
//
// The sysfs walk needs no privilege. The libnvme part sends admin commands to the controller's
// character device (/dev/nvme0), which needs root (CAP_SYS_ADMIN and the device's mode): tuttictl
// runs it itself, not tuttid, which runs as user tutti; without root it reports PERMISSION_DENIED
// and the sysfs figures (model, serial, firmware, capacity) still show.
//
// Thread-safety: plain functions over the file system; safe to call from any thread.
#ifndef TUTTI_CLIENT_TUTTICTL_DEVICES_H_
#define TUTTI_CLIENT_TUTTICTL_DEVICES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti::tuttictl {

// One disk (a whole block device, not a partition) as sysfs describes it.
struct Disk {
  std::string name;  // "nvme0n1", "vda", "sda"
  std::string kind;  // "NVMe namespace", "virtio block device", "SCSI disk", "loop device", ...
  uint64_t capacity_bytes = 0;  // sysfs size x 512
  bool nvme = false;
  // NVMe only: the namespace and its controller (for a multipath namespace, the first path's).
  uint32_t nsid = 0;
  std::string controller;  // "nvme0": /dev/nvme0 takes its admin commands
  std::string model, serial, firmware, transport, address;  // the controller's sysfs attributes
};

// What one pool directory lives on.
struct DirDevice {
  std::string dir;
  uint32_t major = 0, minor = 0;  // st_dev
  std::string block_device;  // what st_dev names: "nvme0n1p1", "dm-0", "vda"; empty if none
  std::vector<Disk> disks;   // the disks beneath it (several under a dm or md device)
  // "" when every disk is NVMe; else in words, e.g. "not on NVMe (virtio block device vda)".
  std::string not_nvme;
};

// Resolves device major:minor under sysfs mounted at `sysfs_root` ("/sys"). A device without
// /sys/dev/block/MAJ:MIN (major 0: tmpfs, overlay, ...) gives no block_device and says so in
// not_nvme. Errors: INTERNAL for an unreadable sysfs entry that should be there (the path and
// strerror named).
absl::StatusOr<DirDevice> ResolveBlockDevice(const std::string& sysfs_root, uint32_t major,
                                             uint32_t minor);

// stat(dir) and ResolveBlockDevice. NOT_FOUND (with strerror) if `dir` cannot be stat'ed.
absl::StatusOr<DirDevice> DeviceOfDir(const std::string& dir, const std::string& sysfs_root = "/sys");

// The controller's identify data, the namespace's capacity and the SMART / health log.
struct NvmeHealth {
  std::string model, serial, firmware;  // identify controller
  uint64_t namespace_bytes = 0;         // identify namespace: size in blocks x block size
  uint64_t namespace_used_bytes = 0;    // ... utilization (nuse)
  int temperature_c = 0;                // composite temperature
  uint32_t available_spare_pct = 0, spare_threshold_pct = 0;
  uint32_t percentage_used = 0;  // endurance used (wear); may pass 100
  uint64_t media_errors = 0;
  uint64_t power_on_hours = 0;
  uint64_t unsafe_shutdowns = 0;
  uint8_t critical_warning = 0;  // the bit field of the SMART log
};

// Reads them through libnvme from `dev_root`/`controller` ("/dev", "nvme0") for namespace `nsid`.
// PERMISSION_DENIED (saying root is needed) if the device cannot be opened for that reason;
// NOT_FOUND if it does not exist; UNAVAILABLE naming the command for a failed admin command
// (the errno's strerror, or the NVMe status code).
absl::StatusOr<NvmeHealth> ReadNvmeHealth(const std::string& dev_root,
                                          const std::string& controller, uint32_t nsid);

// The set bits of a SMART critical warning, in words ("available spare below threshold", ...).
std::vector<std::string> CriticalWarnings(uint8_t bits);

}  // namespace tutti::tuttictl

#endif  // TUTTI_CLIENT_TUTTICTL_DEVICES_H_

// device.h's seam over vfio-pci: an NVMe controller dedicated to tuttid (bound to vfio-pci, see
// docs/nvme.md and tools/nvme_bind.sh) opened from user space. BAR0 is mmapped from the vfio
// device (RegisterSpace); DMA memory is mapped into the controller's IOMMU domain through a type1
// container (DmaAllocator).
//
// Open() does, in order, each step's failure naming the step, the path and strerror(errno):
//   1. the device's IOMMU group: readlink SYSFS/bus/pci/devices/ADDR/iommu_group -> N;
//   2. the group is viable: every device in SYSFS/kernel/iommu_groups/N/devices is bound to
//      vfio-pci (or pci-stub, pcieport, or no driver), and VFIO_GROUP_GET_STATUS says so;
//   3. open DEV/vfio/vfio (a container), check VFIO_API_VERSION and VFIO_TYPE1_IOMMU;
//   4. open DEV/vfio/N, VFIO_GROUP_SET_CONTAINER, VFIO_SET_IOMMU(VFIO_TYPE1_IOMMU);
//   5. VFIO_GROUP_GET_DEVICE_FD(ADDR);
//   6. PCI command register: memory space and bus master enabled;
//   7. BAR0: VFIO_DEVICE_GET_REGION_INFO, mmap of the part that may be mapped from offset 0 (the
//      whole BAR, or the first sparse-mmap area: the registers and doorbells, MSI-X table
//      excluded).
// Close (the destructor): bus mastering off, BAR0 unmapped, the device fd closed. The container
// and group stay open until the last DmaBuffer allocated from the device is destroyed, so buffers
// may outlive the device (their IOMMU mappings are removed when they go).
//
// Privileges: /dev/vfio/N must be readable and writable (root, or its owner: docs/nvme.md), and the
// pinned DMA memory counts against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK.
//
// Thread-safety: registers() as RegisterSpace (one writer per register); dma() may be called from
// any thread. The VfioDevice itself is not copied or moved; destroy it from one thread.
#ifndef TUTTI_DAEMON_IO_NVME_VFIO_H_
#define TUTTI_DAEMON_IO_NVME_VFIO_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/io/nvme/device.h"

namespace tutti::io::nvme {

struct VfioOptions {
  std::string pci_address;  // "0000:01:00.0" (domain:bus:device.function, lower-case hex)
  // Where sysfs and /dev are (tests point these at a made-up tree).
  std::string sysfs_root = "/sys";
  std::string dev_root = "/dev";
  // DMA memory from 2 MiB hugepages (MAP_HUGETLB) for allocations of 2 MiB or more, falling back
  // to normal pages when none are free; false: normal pages only.
  bool hugepages = true;
};

// Whether the "nvme" backend can run on `options.pci_address` here, without opening anything but
// sysfs (and access(2) on the vfio nodes). OK when Open() may be tried; otherwise the reason, which
// the backend's fallback to io_uring reports: INVALID_ARGUMENT (malformed address), NOT_FOUND (no
// such PCI device), FAILED_PRECONDITION (not an NVMe controller; bound to nvme or another driver:
// "run tools/nvme_bind.sh bind ADDR"; no IOMMU group: IOMMU off; another device of the group not
// bound to vfio-pci; no /dev/vfio/vfio: vfio-pci not loaded), PERMISSION_DENIED (/dev/vfio/N not
// readable and writable by this process: root or the group's owner needed).
[[nodiscard]] absl::Status ProbeVfio(const VfioOptions& options);

class VfioDevice {
 public:
  // Opens the controller (the steps above). FAILED_PRECONDITION / PERMISSION_DENIED / NOT_FOUND as
  // ProbeVfio; INTERNAL for an ioctl or mmap the kernel refused, naming it, the path and errno.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<VfioDevice>> Open(const VfioOptions& options);
  ~VfioDevice();
  VfioDevice(const VfioDevice&) = delete;
  VfioDevice& operator=(const VfioDevice&) = delete;

  // BAR0, valid while this device lives. DoorbellAddress() is the mmapped doorbell.
  RegisterSpace& registers();
  // DMA memory mapped in the device's IOMMU domain; the allocator lives as long as this device,
  // the buffers it returns may live longer. Allocate(): page-aligned, zeroed, mlocked memory.
  DmaAllocator& dma();
  const std::string& pci_address() const;
  int iommu_group() const;
  // The BAR0 region's full size (registers() may map less: size() of it).
  size_t bar0_region_size() const;
  // Bytes currently mapped for DMA through dma() (hugepage rounding included).
  size_t dma_mapped_bytes() const;

  struct Parts;  // vfio.cc

 private:
  explicit VfioDevice(std::unique_ptr<Parts> parts);
  std::unique_ptr<Parts> parts_;
};

}  // namespace tutti::io::nvme

#endif  // TUTTI_DAEMON_IO_NVME_VFIO_H_

// The hardware seam of tuttid's NVMe driver: a controller's register space (BAR0) and memory the
// controller can reach by DMA. Production: vfio-pci (vfio.h: BAR0 mmapped from the vfio device,
// DMA memory mapped into the IOMMU). Tests: the software controller model (model/), which serves
// the same register and queue protocol over host memory.
//
// Nothing here knows NVMe commands; queue.h and controller.h build on these two interfaces, and
// the same queue code runs on the CPU and (GPU-initiated submission, bench/nvme_gpu) on the GPU.
#ifndef TUTTI_DAEMON_IO_NVME_DEVICE_H_
#define TUTTI_DAEMON_IO_NVME_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace tutti::io::nvme {

// A controller's BAR0, accessed with 32- and 64-bit loads and stores at byte offsets (NVMe base
// spec 3.1: CAP at 0x0, CC at 0x14, CSTS at 0x1c, AQA/ASQ/ACQ, doorbells from 0x1000). Accesses
// must be naturally aligned and inside size(). Thread-safety: a register may be written by its one
// owner only (CC and the admin doorbells by the controller's owner, each I/O queue's doorbells by
// that queue's owner thread); reads are safe from any thread.
class RegisterSpace {
 public:
  virtual ~RegisterSpace() = default;
  virtual size_t size() const = 0;
  virtual uint32_t Read32(size_t offset) const = 0;
  virtual uint64_t Read64(size_t offset) const = 0;
  virtual void Write32(size_t offset, uint32_t value) = 0;
  virtual void Write64(size_t offset, uint64_t value) = 0;
  // Where doorbell `offset` lives in this process's address space (a mapping of BAR0 for vfio, a
  // word the model polls), so that a GPU can ring it (cuMemHostRegister with IOMEMORY); nullptr
  // when the space cannot be mapped so.
  virtual volatile uint32_t* DoorbellAddress(size_t offset) = 0;
};

// Memory the controller can read and write by DMA: `host` in this process, `iova` as the
// controller addresses it (the IOMMU's mapping for vfio). Page-aligned, zeroed, pinned; freed
// (and unmapped) when the object is destroyed.
class DmaBuffer {
 public:
  virtual ~DmaBuffer() = default;
  virtual uint8_t* host() const = 0;
  virtual uint64_t iova() const = 0;
  virtual size_t size() const = 0;
};

class DmaAllocator {
 public:
  virtual ~DmaAllocator() = default;
  // `size` rounded up to the page size. RESOURCE_EXHAUSTED (with errno text) when the memory or
  // the IOMMU mapping cannot be had.
  virtual absl::StatusOr<std::unique_ptr<DmaBuffer>> Allocate(size_t size) = 0;
  // Maps caller-owned, page-aligned memory (tuttid's staging) for DMA; it must outlive the
  // result. The result's host() is `memory`.
  virtual absl::StatusOr<std::unique_ptr<DmaBuffer>> Map(uint8_t* memory, size_t size) = 0;
};

}  // namespace tutti::io::nvme

#endif  // TUTTI_DAEMON_IO_NVME_DEVICE_H_

// Descriptors for a registered DMA region, built once at registration and never per I/O.
//
// Two forms, chosen by the controller's Identify SGLS field:
//  - SGL (controller supports SGLs for NVM commands): a DmaBuffer is IOVA-contiguous, so every I/O
//    is one 16-byte data block descriptor carried inside the SQE (SGL1). Extra DMA memory: none.
//    (Were the region made of N IOVA runs, N descriptors: 16 bytes per run.)
//  - PRP (otherwise): windowed PRP lists (queue.h, RegionDescriptor) in DMA memory, one 8-byte
//    entry per page of the region plus the windows' overlap: 4 KiB of list per `window` pages,
//    window = 512 - max_transfer/4KiB. For 60 GB of staging with 128 KiB transfers: 15.7 M pages,
//    window 480, 32 K list pages = 128 MiB. The Tutti paper allocates one 4 KiB PRP list page per
//    64 KiB I/O unit: 983 K lists = 3.75 GiB at 60 GB, where SGLs need 15 MB (a 16-byte
//    descriptor per unit) -- and 0 bytes here, since they ride in the SQE.
//  DescriptorMemoryBytes() computes these figures; queue_test (DescriptorsTest) checks them.
//
// Thread-safety: immutable after Create; descriptor() may be read from any thread (and copied to
// a GPU).
#ifndef TUTTI_DAEMON_IO_NVME_DESCRIPTORS_H_
#define TUTTI_DAEMON_IO_NVME_DESCRIPTORS_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "daemon/io/nvme/device.h"
#include "daemon/io/nvme/queue.h"

namespace tutti::io::nvme {

struct DescriptorOptions {
  bool use_sgl = false;
  uint32_t page_shift = 12;        // controller memory page size (CC.MPS)
  uint32_t max_transfer = 131072;  // bytes per command (min of MDTS and the driver's limit)
};

// DMA memory (bytes) the descriptors of a `region_bytes` region cost in each form.
uint64_t DescriptorMemoryBytes(const DescriptorOptions& options, uint64_t region_bytes);

class RegisteredRegion {
 public:
  // Builds the descriptors for `buffer`, which must outlive the result. PRP lists are allocated
  // from `dma` (and freed with the result). INVALID_ARGUMENT for an unaligned or empty buffer or a
  // max_transfer that a PRP list page cannot hold; allocation errors from `dma` as they come.
  static absl::StatusOr<std::unique_ptr<RegisteredRegion>> Create(const DescriptorOptions& options,
                                                                  const DmaBuffer& buffer,
                                                                  DmaAllocator* dma);

  const RegionDescriptor& descriptor() const { return descriptor_; }
  const DmaBuffer& buffer() const { return buffer_; }
  // Bytes of DMA memory the PRP lists take (0 in SGL form).
  uint64_t list_bytes() const { return prp_lists_ ? prp_lists_->size() : 0; }

 private:
  RegisteredRegion(const DmaBuffer& buffer, const RegionDescriptor& d,
                   std::unique_ptr<DmaBuffer> lists)
      : buffer_(buffer), descriptor_(d), prp_lists_(std::move(lists)) {}

  const DmaBuffer& buffer_;
  const RegionDescriptor descriptor_;
  const std::unique_ptr<DmaBuffer> prp_lists_;  // null in SGL form
};

}  // namespace tutti::io::nvme

#endif  // TUTTI_DAEMON_IO_NVME_DESCRIPTORS_H_

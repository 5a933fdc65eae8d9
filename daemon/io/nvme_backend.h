// The "nvme" I/O backend: pool files are NVMe namespaces driven by tuttid's own driver
// (nvme/controller.h), one namespace per configured device (io.nvme_devices), byte offsets mapped
// to LBAs. io_factory's "nvme" opens it through nvme_open.h (vfio devices, controllers, config).
//
// Each file has one worker thread that owns queue pair 0 of its controller (the one-owner rule of
// nvme/queue_pair.h); Submit and Sync hand it work by message. A batch's requests are issued in
// their order, reads and writes in the same rounds (the scheduler orders classes). A request is
// split into commands of at most the controller's max transfer. Data moves
// directly when the buffer lies in the region given to RegisterBuffer (DMA-mapped and described
// once, at registration); otherwise through a per-file bounce buffer in DMA memory (a copy).
// Sync sends Flush when the device has a volatile write cache.
//
// Thread-safety: as IoBackend (any thread). The controllers (and their DMA allocators) must
// outlive the backend, and nothing else may use their queue pair 0 meanwhile.
#ifndef TUTTI_DAEMON_IO_NVME_BACKEND_H_
#define TUTTI_DAEMON_IO_NVME_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/io/io_backend.h"
#include "daemon/io/nvme/controller.h"
#include "daemon/io/nvme/device.h"

namespace tutti::io {

struct NvmeBackendDevice {
  nvme::Controller* controller = nullptr;  // not owned
  nvme::DmaAllocator* dma = nullptr;       // the controller's; not owned
};

struct NvmeBackendOptions {
  uint64_t bounce_bytes = 4 << 20;  // per file, for buffers outside the registered region
};

class NvmeBackend final : public IoBackend {
 public:
  // INVALID_ARGUMENT without devices, with a null controller/allocator, or a namespace whose LBA
  // size does not divide kAlignment; DMA allocation errors as they come. Starts one worker per
  // device.
  static absl::StatusOr<std::unique_ptr<NvmeBackend>> Create(
      const NvmeBackendOptions& options, const std::vector<NvmeBackendDevice>& devices);
  // Waits for queued work, then stops the workers.
  ~NvmeBackend() override;

  std::string_view name() const override { return "nvme"; }
  uint32_t num_files() const override;
  uint64_t file_size(uint32_t file) const override;
  [[nodiscard]] absl::Status RegisterBuffer(absl::Span<uint8_t> region) override;
  void Submit(absl::Span<IoRequest> batch, std::function<void()> done) override;
  [[nodiscard]] absl::Status Sync(uint32_t file) override;

 private:
  class Worker;
  NvmeBackend() = default;
  std::vector<NvmeBackendDevice> devices_;
  std::vector<uint64_t> file_sizes_;
  std::vector<std::unique_ptr<Worker>> workers_;  // by file
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_NVME_BACKEND_H_

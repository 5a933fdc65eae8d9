// An engine's KV memory on the GPU, opened through CUDA IPC handles: the "cuda_ipc" EngineMemory.
//
// Open() maps each region's cudaIpcMemHandle_t into this process (cudaIpcOpenMemHandle with lazy
// peer access), after checking that every region is on the daemon's GPU (UUID) and that the
// layout fits in the sizes the engine declared; then it checks the declared sizes against the
// allocations actually mapped (cuMemGetAddressRange). Scatter and Gather move objects between
// registered staging (pinned host or device memory) and the engine's blocks with the copy kernel
// on the I/O stream: one launch per up to 2040 objects, whatever the layout.
//
// Failure model: a CUDA error on the I/O path is returned as INTERNAL; errors that poison this
// process's CUDA context (gpu/cuda_status.h IsStickyError) cannot be recovered in-process; see
// docs/gpu.md for what an engine's death does to memory that is open here.
//
// The copies go through a gpu::Device (gpu/device.h): a CudaDevice over the IoStream, or the one
// given to WrapLocal (a HostDevice in tests, whose regions and staging are host memory).
//
// Thread-safety: Scatter, Gather and the Enqueue calls may run concurrently from several threads;
// they share the I/O stream (in enqueue order). Destroy the object only when no call is running.
// Lifetimes: the IoStream (or Device) and the staging memory must outlive the object.
#ifndef TUTTI_DAEMON_GPU_CUDA_IPC_MEMORY_H_
#define TUTTI_DAEMON_GPU_CUDA_IPC_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/engine/engine_memory.h"
#include "daemon/gpu/placement.h"
#include "gpu/device.h"
#include "gpu/io_stream.h"
#include "gpu/ipc_mapping.h"

namespace tutti::gpu {

// A region already mapped in this process (an in-process engine, tests): nothing is opened or
// closed for it.
struct LocalRegion {
  void* device_ptr = nullptr;
  uint64_t size_bytes = 0;
};

class CudaIpcMemory final : public engine::EngineMemory {
 public:
  // Opens `regions` on the I/O stream's device. INVALID_ARGUMENT when a handle is not 64 bytes, a
  // region's UUID names another GPU or is malformed, the layout does not fit (ValidateLayout), a
  // staging region is invalid, or a mapped allocation is smaller than its declared size; the
  // CUDA error (INVALID_ARGUMENT / INTERNAL) when a handle does not open. On any error every
  // handle opened so far is closed again.
  static absl::StatusOr<std::unique_ptr<CudaIpcMemory>> Open(
      const EngineLayout& layout, absl::Span<const IpcRegion> regions,
      absl::Span<const StagingRegion> staging, IoStream* stream);

  // The same over memory this process already maps. Errors as Open, less the IPC ones.
  static absl::StatusOr<std::unique_ptr<CudaIpcMemory>> WrapLocal(
      const EngineLayout& layout, absl::Span<const LocalRegion> regions,
      absl::Span<const StagingRegion> staging, IoStream* stream);
  // The same on `device` (its io_stream() is the I/O stream): `regions` are its device memory.
  static absl::StatusOr<std::unique_ptr<CudaIpcMemory>> WrapLocal(
      const EngineLayout& layout, absl::Span<const LocalRegion> regions,
      absl::Span<const StagingRegion> staging, Device* device);

  // Waits for the I/O stream, then closes the IPC mappings (errors are logged).
  ~CudaIpcMemory() override;

  std::string_view kind() const override { return "cuda_ipc"; }

  // EngineMemory: enqueue, then wait for the I/O stream. INVALID_ARGUMENT for ops outside the
  // layout or staging (nothing is enqueued then); INTERNAL for CUDA errors.
  [[nodiscard]] absl::Status Scatter(absl::Span<const engine::CopyOp> ops) override;
  [[nodiscard]] absl::Status Gather(absl::Span<const engine::CopyOp> ops) override;

  // Enqueue only: the copies run on the I/O stream after everything enqueued before; staging read
  // by a scatter must not change, and staging written by a gather must not be read, until the
  // stream has passed them (Synchronize, or an event/ready word enqueued after).
  [[nodiscard]] absl::Status EnqueueScatter(absl::Span<const engine::CopyOp> ops);
  [[nodiscard]] absl::Status EnqueueGather(absl::Span<const engine::CopyOp> ops);
  // Like EnqueueScatter and EnqueueGather, but the copy engines move each object (one
  // cudaMemcpyBatchAsync, with cudaMemcpyFlagPreferOverlapWithCompute): no SM runs, at about half
  // the kernel's bandwidth.
  // EnqueueGatherByCopyEngine on `stream` (null: the I/O stream): its copies are ordered after
  // what was enqueued on that stream only.
  [[nodiscard]] absl::Status EnqueueScatterByCopyEngine(absl::Span<const engine::CopyOp> ops);
  [[nodiscard]] absl::Status EnqueueGatherByCopyEngine(absl::Span<const engine::CopyOp> ops,
                                                       Device::Stream stream = nullptr);
  [[nodiscard]] absl::Status Synchronize();

  // Device address of region `i` in this process (tests and diagnostics).
  uint8_t* region_base(size_t i) const { return bases_[i]; }
  // Device address of object `object` of engine block `block` in this process; null when either
  // is out of range.
  const uint8_t* EngineObject(uint32_t block, uint32_t object) const;

 private:
  CudaIpcMemory(const EngineLayout& layout, Device* device, std::unique_ptr<Device> owned_device)
      : EngineMemory(layout.num_blocks, static_cast<uint32_t>(layout.placements.size()),
                     layout.object_len),
        layout_(layout),
        owned_device_(std::move(owned_device)),
        device_(device) {}
  absl::Status Enqueue(absl::Span<const engine::CopyOp> ops, CopyDirection direction);
  absl::Status EnqueueByCopyEngine(absl::Span<const engine::CopyOp> ops, CopyDirection direction,
                                   Device::Stream stream);

  const EngineLayout layout_;
  const std::unique_ptr<Device> owned_device_;  // null when the caller's
  Device* const device_;
  StagingMap staging_;
  std::vector<std::unique_ptr<IpcMapping>> mappings_;  // empty for WrapLocal
  std::vector<uint8_t*> bases_;
};

}  // namespace tutti::gpu

#endif  // TUTTI_DAEMON_GPU_CUDA_IPC_MEMORY_H_

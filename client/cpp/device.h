// Internal: the seam between the client library and the engine's GPU (cuda memory mode).
//
// The real implementation (cuda_device.cc) uses gpu/ (ReadyWordArray, WaitLayer) and the CUDA
// runtime and driver; tests use fakes over host memory. Host memory mode uses none of this.
//
// Thread-safety: implementations are thread-safe.
#ifndef TUTTI_CLIENT_CPP_DEVICE_H_
#define TUTTI_CLIENT_CPP_DEVICE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tutti/v1/kvcache.pb.h"

namespace tutti::client::internal {

// One device allocation (what a CUDA IPC handle exports).
struct Allocation {
  uintptr_t base = 0;
  uint64_t size = 0;
};

// The engine's layer-ready words (kvcache.proto ReadyWordsRegion), in an allocation of their own.
class ReadyWords {
 public:
  virtual ~ReadyWords() = default;
  virtual uint32_t count() const = 0;
  // The handle, size and GPU to send at Attach.
  virtual absl::StatusOr<tutti::v1::CudaIpcRegion> Export() const = 0;
  // Enqueues on `stream` a wait until word `index` >= `ticket` (wrap-around safe); returns at once.
  virtual absl::Status EnqueueWait(void* stream, uint32_t index, uint32_t ticket) = 0;
  // Writes `ticket` into every word (from a private stream) and returns once written: releases
  // every wait for a ticket <= `ticket`. For when tuttid cannot do it any more.
  virtual absl::Status ForceRelease(uint32_t ticket) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  // The allocation holding device address `ptr`. INVALID_ARGUMENT when `ptr` is not device memory
  // of this device.
  virtual absl::StatusOr<Allocation> AllocationOf(const void* ptr) = 0;
  // An IPC handle of `allocation` (kvcache.proto CudaIpcRegion: handle, size, GPU UUID).
  virtual absl::StatusOr<tutti::v1::CudaIpcRegion> Export(const Allocation& allocation) = 0;
  // `count` zeroed ready words.
  virtual absl::StatusOr<std::unique_ptr<ReadyWords>> CreateReadyWords(uint32_t count) = 0;
  // Returns once all work enqueued on `stream` so far has run.
  virtual absl::Status SynchronizeStream(void* stream) = 0;
};

// The CUDA device `ordinal` of this process. UNAVAILABLE without a usable GPU (no driver, no
// device, compute capability below 9.0: see gpu/probe.h).
absl::StatusOr<std::unique_ptr<Device>> OpenCudaDevice(int ordinal);

}  // namespace tutti::client::internal

#endif  // TUTTI_CLIENT_CPP_DEVICE_H_

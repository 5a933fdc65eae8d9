// One CUDA IPC memory handle of another process, opened in this one.
//
// Thread-safety: immutable after Open; destroy it only when no work that touches it is in flight.
#ifndef TUTTI_GPU_IPC_MAPPING_H_
#define TUTTI_GPU_IPC_MAPPING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu/probe.h"

namespace tutti::gpu {

// A region as the engine describes it (kvcache.proto CudaIpcRegion).
struct IpcRegion {
  std::string handle;       // cudaIpcMemHandle_t bytes (64)
  uint64_t size_bytes = 0;  // bytes from the start of the allocation that may be used
  std::string gpu_uuid;     // "GPU-..." as nvidia-smi prints it
};

class IpcMapping {
 public:
  // Opens `region` on `device` (cudaIpcOpenMemHandle, lazy peer access). `what` names the region
  // in messages ("regions[3]"). INVALID_ARGUMENT when the handle is not 64 bytes, the UUID is
  // malformed or names another GPU, or the mapped allocation is smaller than size_bytes (then the
  // mapping is closed again); the CUDA error when the handle does not open (a stale handle, an
  // exporting process that is gone, or a handle of this same process).
  static absl::StatusOr<std::unique_ptr<IpcMapping>> Open(const IpcRegion& region,
                                                          const DeviceInfo& device,
                                                          absl::string_view what);
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;
  // Closes the mapping if Close() was not called; errors are logged.
  ~IpcMapping();

  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }  // the declared size

  // Closes the mapping now and returns cudaIpcCloseMemHandle's result. Idempotent.
  [[nodiscard]] absl::Status Close();

 private:
  IpcMapping(uint8_t* base, uint64_t size, int device)
      : base_(base), size_(size), device_(device) {}

  uint8_t* base_;
  const uint64_t size_;
  const int device_;
  bool closed_ = false;
};

// Checks the handle length and GPU of `region` without opening it (the first checks of Open).
absl::Status CheckIpcRegion(const IpcRegion& region, const DeviceInfo& device,
                            absl::string_view what);

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_IPC_MAPPING_H_

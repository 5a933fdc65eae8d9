#include "gpu/ipc_mapping.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/cuda_status.h"
#include "gpu/driver_api.h"

namespace tutti::gpu {

absl::Status CheckIpcRegion(const IpcRegion& region, const DeviceInfo& device,
                            absl::string_view what) {
  if (region.handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": IPC handle of ", region.handle.size(),
                                                   " bytes, expected ",
                                                   sizeof(cudaIpcMemHandle_t)));
  }
  absl::StatusOr<Uuid> uuid = ParseUuid(region.gpu_uuid);
  if (!uuid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", uuid.status().message()));
  }
  if (*uuid != device.uuid) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is on ", FormatUuid(*uuid),
                                                   "; this daemon serves ", device.uuid_text));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<IpcMapping>> IpcMapping::Open(const IpcRegion& region,
                                                             const DeviceInfo& device,
                                                             absl::string_view what) {
  RETURN_IF_ERROR(CheckIpcRegion(region, device, what));
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device.ordinal), "cudaSetDevice"));
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, region.handle.data(), sizeof(handle));
  void* ptr = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess),
                             absl::StrCat("cudaIpcOpenMemHandle(", what, ")")));
  std::unique_ptr<IpcMapping> m(
      new IpcMapping(static_cast<uint8_t*>(ptr), region.size_bytes, device.ordinal));
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUdeviceptr p = reinterpret_cast<CUdeviceptr>(ptr);
  RETURN_IF_ERROR(CuStatus(api->MemGetAddressRange(&base, &size, p), "cuMemGetAddressRange"));
  const uint64_t mapped = size - (p - base);
  if (mapped < region.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": declared ", region.size_bytes,
                                                   " bytes, but the allocation has ", mapped));
  }
  return m;
}

absl::Status IpcMapping::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  return CudaStatus(cudaIpcCloseMemHandle(base_), "cudaIpcCloseMemHandle");
}

IpcMapping::~IpcMapping() {
  absl::Status s = Close();
  if (!s.ok()) log::Get("gpu")->error("gpu{}: {}", device_, s.ToString());
}

}  // namespace tutti::gpu

// Internal to gpu/: the CUDA driver API functions tutti uses, resolved at run time.
//
// Nothing in tutti links libcuda: a binary linked against the toolkit's stub libcuda.so does not
// even start on a machine without the driver (the loader cannot find libcuda.so.1), and the daemon
// must start there and run in host mode. The functions are looked up through the static CUDA
// runtime (cudaGetDriverEntryPointByVersion), which loads the driver's libcuda.so.1 itself and
// reports a missing driver as an error, so the pointers below belong to the same driver instance
// as the runtime's contexts.
//
// Thread-safety: GetDriverApi() is safe to call from any thread; the table it returns is
// immutable and lives until the process exits.
#ifndef TUTTI_GPU_DRIVER_API_H_
#define TUTTI_GPU_DRIVER_API_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include "absl/status/statusor.h"

namespace tutti::gpu {

struct DriverApi {
  // Always present when GetDriverApi() succeeds.
  PFN_cuGetErrorName_v6000 GetErrorName = nullptr;
  PFN_cuDeviceGet_v2000 DeviceGet = nullptr;
  PFN_cuStreamWriteValue32_v11070 StreamWriteValue32 = nullptr;
  PFN_cuStreamWaitValue32_v11070 StreamWaitValue32 = nullptr;
  PFN_cuMemGetAddressRange_v3020 MemGetAddressRange = nullptr;
  PFN_cuStreamDestroy_v4000 StreamDestroy = nullptr;

  // Green contexts (driver 12.5 and later); all null when any is missing.
  PFN_cuDeviceGetDevResource_v12040 DeviceGetDevResource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 DevSmResourceSplitByCount = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 DevResourceGenerateDesc = nullptr;
  PFN_cuGreenCtxCreate_v12040 GreenCtxCreate = nullptr;
  PFN_cuGreenCtxDestroy_v12040 GreenCtxDestroy = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 GreenCtxStreamCreate = nullptr;
  PFN_cuGreenCtxGetDevResource_v12040 GreenCtxGetDevResource = nullptr;

  // Virtual memory management with shareable handles; all null when any is missing.
  PFN_cuMemCreate_v10020 MemCreate = nullptr;
  PFN_cuMemRelease_v10020 MemRelease = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle = nullptr;
  PFN_cuMemAddressReserve_v10020 MemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 MemAddressFree = nullptr;
  PFN_cuMemMap_v10020 MemMap = nullptr;
  PFN_cuMemUnmap_v10020 MemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 MemSetAccess = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity = nullptr;

  bool has_green_contexts() const { return GreenCtxCreate != nullptr; }
  bool has_vmm() const { return MemCreate != nullptr; }
};

// Returns the driver table, loading it on first use. UNAVAILABLE (with the runtime's reason) when
// no CUDA driver is installed or it is too old for the required functions; the result of the first
// call is remembered. The returned pointer is never null on success and is never freed.
absl::StatusOr<const DriverApi*> GetDriverApi();

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_DRIVER_API_H_

#include "gpu/driver_api.h"

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tutti::gpu {
namespace {

// Resolves `symbol` (the base name, e.g. "cuStreamWriteValue32") at the ABI of CUDA `version`.
// Returns false when the driver does not have it; `*err` is set to the first hard error.
template <typename Fn>
bool Resolve(const char* symbol, unsigned version, Fn* out, cudaError_t* err) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &query);
  if (e != cudaSuccess) {
    if (*err == cudaSuccess) *err = e;
    return false;
  }
  if (query != cudaDriverEntryPointSuccess || fn == nullptr) return false;
  *out = reinterpret_cast<Fn>(fn);
  return true;
}

absl::StatusOr<DriverApi> Load() {
  DriverApi api;
  cudaError_t err = cudaSuccess;
  bool core = Resolve("cuGetErrorName", 6000, &api.GetErrorName, &err);
  core &= Resolve("cuDeviceGet", 2000, &api.DeviceGet, &err);
  core &= Resolve("cuStreamWriteValue32", 11070, &api.StreamWriteValue32, &err);
  core &= Resolve("cuStreamWaitValue32", 11070, &api.StreamWaitValue32, &err);
  core &= Resolve("cuMemGetAddressRange", 3020, &api.MemGetAddressRange, &err);
  core &= Resolve("cuStreamDestroy", 4000, &api.StreamDestroy, &err);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("CUDA driver not usable: ", cudaGetErrorName(err),
                                               " (", cudaGetErrorString(err), ")"));
  }
  if (!core) return absl::UnavailableError("CUDA driver lacks stream memory operations");

  DriverApi green = api;
  cudaError_t ignored = cudaSuccess;
  bool ok = Resolve("cuDeviceGetDevResource", 12040, &green.DeviceGetDevResource, &ignored);
  ok &= Resolve("cuDevSmResourceSplitByCount", 12040, &green.DevSmResourceSplitByCount, &ignored);
  ok &= Resolve("cuDevResourceGenerateDesc", 12040, &green.DevResourceGenerateDesc, &ignored);
  ok &= Resolve("cuGreenCtxCreate", 12040, &green.GreenCtxCreate, &ignored);
  ok &= Resolve("cuGreenCtxDestroy", 12040, &green.GreenCtxDestroy, &ignored);
  ok &= Resolve("cuGreenCtxStreamCreate", 12050, &green.GreenCtxStreamCreate, &ignored);
  ok &= Resolve("cuGreenCtxGetDevResource", 12040, &green.GreenCtxGetDevResource, &ignored);
  if (ok) api = green;

  DriverApi vmm = api;
  ok = Resolve("cuMemCreate", 10020, &vmm.MemCreate, &ignored);
  ok &= Resolve("cuMemRelease", 10020, &vmm.MemRelease, &ignored);
  ok &= Resolve("cuMemExportToShareableHandle", 10020, &vmm.MemExportToShareableHandle, &ignored);
  ok &=
      Resolve("cuMemImportFromShareableHandle", 10020, &vmm.MemImportFromShareableHandle, &ignored);
  ok &= Resolve("cuMemAddressReserve", 10020, &vmm.MemAddressReserve, &ignored);
  ok &= Resolve("cuMemAddressFree", 10020, &vmm.MemAddressFree, &ignored);
  ok &= Resolve("cuMemMap", 10020, &vmm.MemMap, &ignored);
  ok &= Resolve("cuMemUnmap", 10020, &vmm.MemUnmap, &ignored);
  ok &= Resolve("cuMemSetAccess", 10020, &vmm.MemSetAccess, &ignored);
  ok &= Resolve("cuMemGetAllocationGranularity", 10020, &vmm.MemGetAllocationGranularity, &ignored);
  if (ok) api = vmm;
  return api;
}

}  // namespace

absl::StatusOr<const DriverApi*> GetDriverApi() {
  static const absl::StatusOr<DriverApi>* const loaded = new absl::StatusOr<DriverApi>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace tutti::gpu

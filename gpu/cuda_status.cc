#include "gpu/cuda_status.h"

#include "absl/strings/str_cat.h"
#include "gpu/driver_api.h"

namespace tutti::gpu {
namespace {

absl::StatusCode CodeFor(cudaError_t err) {
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorInitializationError:
      return absl::StatusCode::kUnavailable;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevice:
    case cudaErrorMapBufferObjectFailed:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorNotSupported:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode CodeFor(CUresult res) {
  switch (res) {
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
      return absl::StatusCode::kUnavailable;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NOT_FOUND:
      return absl::StatusCode::kInvalidArgument;
    case CUDA_ERROR_NOT_SUPPORTED:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  // The runtime also keeps the error as this thread's "last error", where a later, unrelated
  // cudaGetLastError() (after a kernel launch) would find it. It is reported here: clear it.
  // Sticky errors stay whatever is done.
  cudaGetLastError();
  return absl::Status(CodeFor(err), absl::StrCat(what, ": ", cudaGetErrorName(err), " (",
                                                 cudaGetErrorString(err), ")"));
}

absl::Status CuStatus(CUresult res, absl::string_view what) {
  if (res == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = nullptr;
  auto api = GetDriverApi();
  if (api.ok()) (*api)->GetErrorName(res, &name);
  return absl::Status(CodeFor(res), absl::StrCat(what, ": ", name ? name : "CUresult ",
                                                 name ? "" : absl::StrCat(static_cast<int>(res))));
}

bool IsStickyError(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

}  // namespace tutti::gpu

// Internal to gpu/: turns CUDA runtime and driver results into absl::Status.
//
// Codes: no driver or no device -> UNAVAILABLE; out of memory -> RESOURCE_EXHAUSTED; an invalid
// argument or handle -> INVALID_ARGUMENT; anything else (including the sticky errors that poison
// a context, such as an illegal address) -> INTERNAL. Messages name the call and CUDA's error name.
#ifndef TUTTI_GPU_CUDA_STATUS_H_
#define TUTTI_GPU_CUDA_STATUS_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tutti::gpu {

// OK for cudaSuccess; otherwise a status naming `what` and the error, and the error is cleared
// from the runtime's per-thread last-error state (so it is not reported again by the next launch).
absl::Status CudaStatus(cudaError_t err, absl::string_view what);

// OK for CUDA_SUCCESS; otherwise a status naming `what` and the error (named through the driver
// when it is loaded).
absl::Status CuStatus(CUresult res, absl::string_view what);

// True for errors after which the CUDA context of this process is unusable (every later call
// fails): the process must be restarted to use the GPU again.
bool IsStickyError(cudaError_t err);

}  // namespace tutti::gpu

// Returns from the current function if the runtime call `expr` fails.
#define CUDA_RETURN_IF_ERROR(expr)                                               \
  do {                                                                           \
    ::absl::Status tutti_cuda_status_ = ::tutti::gpu::CudaStatus((expr), #expr); \
    if (!tutti_cuda_status_.ok()) return tutti_cuda_status_;                     \
  } while (0)

// Returns from the current function if the driver call `expr` fails.
#define CU_RETURN_IF_ERROR(expr)                                             \
  do {                                                                       \
    ::absl::Status tutti_cu_status_ = ::tutti::gpu::CuStatus((expr), #expr); \
    if (!tutti_cu_status_.ok()) return tutti_cu_status_;                     \
  } while (0)

#endif  // TUTTI_GPU_CUDA_STATUS_H_

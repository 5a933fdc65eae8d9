#include "gpu/pinned.h"

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/cuda_status.h"
#include "gpu/probe.h"

namespace tutti::gpu {

absl::StatusOr<std::unique_ptr<PinnedRegion>> PinnedRegion::Register(void* addr, size_t len) {
  if (addr == nullptr || len == 0) {
    return absl::InvalidArgumentError("PinnedRegion::Register: null or empty range");
  }
  RETURN_IF_ERROR(Probe().status());
  RETURN_IF_ERROR(
      CudaStatus(cudaHostRegister(addr, len, cudaHostRegisterPortable | cudaHostRegisterMapped),
                 "cudaHostRegister"));
  void* dev = nullptr;
  absl::Status s = CudaStatus(cudaHostGetDevicePointer(&dev, addr, 0), "cudaHostGetDevicePointer");
  if (!s.ok()) {
    cudaHostUnregister(addr);
    return s;
  }
  return std::unique_ptr<PinnedRegion>(new PinnedRegion(
      static_cast<uint8_t*>(addr), len, static_cast<uint8_t*>(dev), /*owned=*/false));
}

absl::StatusOr<std::unique_ptr<PinnedRegion>> PinnedRegion::Allocate(size_t len) {
  if (len == 0) return absl::InvalidArgumentError("PinnedRegion::Allocate: empty");
  RETURN_IF_ERROR(Probe().status());
  void* host = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&host, len, cudaHostAllocPortable | cudaHostAllocMapped),
                             "cudaHostAlloc"));
  void* dev = nullptr;
  absl::Status s = CudaStatus(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer");
  if (!s.ok()) {
    cudaFreeHost(host);
    return s;
  }
  return std::unique_ptr<PinnedRegion>(new PinnedRegion(
      static_cast<uint8_t*>(host), len, static_cast<uint8_t*>(dev), /*owned=*/true));
}

PinnedRegion::~PinnedRegion() {
  absl::Status s = owned_ ? CudaStatus(cudaFreeHost(host_), "cudaFreeHost")
                          : CudaStatus(cudaHostUnregister(host_), "cudaHostUnregister");
  if (!s.ok()) log::Get("gpu")->error("releasing pinned staging: {}", s.ToString());
}

}  // namespace tutti::gpu

// The CUDA implementation of the client's Device seam, over gpu/.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "client/cpp/device.h"
#include "common/status_macros.h"
#include "gpu/cuda_status.h"
#include "gpu/driver_api.h"
#include "gpu/probe.h"
#include "gpu/ready_words.h"

namespace tutti::client::internal {
namespace {

class CudaReadyWords final : public ReadyWords {
 public:
  explicit CudaReadyWords(std::unique_ptr<gpu::ReadyWordArray> array) : array_(std::move(array)) {}

  uint32_t count() const override { return array_->num_words(); }

  absl::StatusOr<tutti::v1::CudaIpcRegion> Export() const override {
    ASSIGN_OR_RETURN(gpu::IpcRegion region, array_->ExportIpc());
    tutti::v1::CudaIpcRegion out;
    out.set_ipc_handle(region.handle);
    out.set_size_bytes(region.size_bytes);
    out.set_gpu_uuid(region.gpu_uuid);
    return out;
  }

  absl::Status EnqueueWait(void* stream, uint32_t index, uint32_t ticket) override {
    if (index >= count()) {
      return absl::InvalidArgumentError(absl::StrCat("ready word ", index, " of ", count()));
    }
    return gpu::WaitLayer(static_cast<cudaStream_t>(stream), array_->word(index), ticket);
  }

  absl::Status ForceRelease(uint32_t ticket) override { return array_->ForceRelease(ticket); }

 private:
  std::unique_ptr<gpu::ReadyWordArray> array_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(gpu::DeviceInfo info) : info_(std::move(info)) {}

  absl::StatusOr<Allocation> AllocationOf(const void* ptr) override {
    ASSIGN_OR_RETURN(const gpu::DriverApi* api, gpu::GetDriverApi());
    RETURN_IF_ERROR(gpu::CudaStatus(cudaSetDevice(info_.ordinal), "cudaSetDevice"));
    cudaPointerAttributes attrs{};
    RETURN_IF_ERROR(
        gpu::CudaStatus(cudaPointerGetAttributes(&attrs, ptr), "cudaPointerGetAttributes"));
    if (attrs.type != cudaMemoryTypeDevice || attrs.device != info_.ordinal) {
      return absl::InvalidArgumentError(absl::StrCat(
          "address ", reinterpret_cast<uintptr_t>(ptr), " is not device memory of GPU ",
          info_.ordinal, " (cudaMalloc it, or pass host memory in host mode)"));
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    RETURN_IF_ERROR(
        gpu::CuStatus(api->MemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)),
                      "cuMemGetAddressRange"));
    return Allocation{static_cast<uintptr_t>(base), size};
  }

  absl::StatusOr<tutti::v1::CudaIpcRegion> Export(const Allocation& allocation) override {
    RETURN_IF_ERROR(gpu::CudaStatus(cudaSetDevice(info_.ordinal), "cudaSetDevice"));
    cudaIpcMemHandle_t handle;
    RETURN_IF_ERROR(gpu::CudaStatus(
        cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(allocation.base)),
        "cudaIpcGetMemHandle (memory from cuMemCreate/expandable segments cannot be shared "
        "this way)"));
    tutti::v1::CudaIpcRegion out;
    out.set_ipc_handle(std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
    out.set_size_bytes(allocation.size);
    out.set_gpu_uuid(info_.uuid_text);
    return out;
  }

  absl::StatusOr<std::unique_ptr<ReadyWords>> CreateReadyWords(uint32_t count) override {
    ASSIGN_OR_RETURN(std::unique_ptr<gpu::ReadyWordArray> array,
                     gpu::ReadyWordArray::Create(info_.ordinal, count));
    return std::unique_ptr<ReadyWords>(new CudaReadyWords(std::move(array)));
  }

  absl::Status SynchronizeStream(void* stream) override {
    return gpu::CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                           "cudaStreamSynchronize(engine stream)");
  }

 private:
  const gpu::DeviceInfo info_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> OpenCudaDevice(int ordinal) {
  ASSIGN_OR_RETURN(gpu::DeviceInfo info, gpu::Probe(ordinal));
  return std::unique_ptr<Device>(new CudaDevice(std::move(info)));
}

}  // namespace tutti::client::internal

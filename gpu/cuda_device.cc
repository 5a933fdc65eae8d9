#include "gpu/cuda_device.h"

#include <cuda.h>

#include <limits>
#include <vector>

#include "common/status_macros.h"
#include "gpu/copy_kernel.h"
#include "gpu/copy_runs.h"
#include "gpu/cuda_status.h"
#include "gpu/driver_api.h"
#include "gpu/hash_desc.h"
#include "gpu/hash_kernel.h"
#include "gpu/pinned.h"
#include "gpu/probe.h"

namespace tutti::gpu {
namespace {

CUstream Cu(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }
CUdeviceptr Cu(const uint32_t* p) { return reinterpret_cast<CUdeviceptr>(p); }

class CudaPinnedBuffer final : public Device::PinnedBuffer {
 public:
  explicit CudaPinnedBuffer(std::unique_ptr<PinnedRegion> region) : region_(std::move(region)) {}
  uint8_t* host() const override { return region_->host(); }

 private:
  std::unique_ptr<PinnedRegion> region_;
};

}  // namespace

absl::Status CudaDevice::Activate() {
  RETURN_IF_ERROR(Probe(io_->device()).status());
  return CudaStatus(cudaSetDevice(io_->device()), "cudaSetDevice");
}

absl::StatusOr<uint64_t> CudaDevice::MaxPitch() {
  int max_pitch = 0;
  RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, io_->device()),
                             "max pitch"));
  return static_cast<uint64_t>(max_pitch);
}

absl::Status CudaDevice::Synchronize() {
  return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

absl::StatusOr<uint8_t*> CudaDevice::Allocate(uint64_t bytes, const char* what) {
  void* p = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), what));
  return static_cast<uint8_t*>(p);
}

void CudaDevice::Free(void* p) {
  if (p != nullptr) cudaFree(p);
}

absl::Status CudaDevice::Memset(void* p, int value, uint64_t bytes, const char* what) {
  return CudaStatus(cudaMemset(p, value, bytes), what);
}

absl::StatusOr<std::unique_ptr<Device::PinnedBuffer>> CudaDevice::AllocatePinned(uint64_t bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<PinnedRegion> region, PinnedRegion::Allocate(bytes));
  return std::unique_ptr<PinnedBuffer>(new CudaPinnedBuffer(std::move(region)));
}

absl::StatusOr<Device::Stream> CudaDevice::CreateStream(const char* what) {
  cudaStream_t s = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), what));
  return FromCuda(s);
}

void CudaDevice::DestroyStream(Stream stream) {
  if (stream == nullptr) return;
  cudaStreamSynchronize(ToCuda(stream));
  cudaStreamDestroy(ToCuda(stream));
}

absl::Status CudaDevice::SyncStream(Stream stream, const char* what) {
  if (ToCuda(stream) == io_->stream()) return io_->Synchronize();
  return CudaStatus(cudaStreamSynchronize(ToCuda(stream)), what);
}

absl::StatusOr<Device::Event> CudaDevice::CreateEvent(EventKind kind, const char* what) {
  cudaEvent_t ev = nullptr;
  switch (kind) {
    case EventKind::kTiming:
      RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&ev), what));
      break;
    case EventKind::kBlocking:
      RETURN_IF_ERROR(CudaStatus(
          cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync), what));
      break;
    case EventKind::kOrder:
      RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), what));
      break;
  }
  return FromCuda(ev);
}

void CudaDevice::DestroyEvent(Event event) {
  if (event != nullptr) cudaEventDestroy(ToCuda(event));
}

absl::Status CudaDevice::RecordEvent(Event event, Stream stream, const char* what) {
  return CudaStatus(cudaEventRecord(ToCuda(event), ToCuda(stream)), what);
}

absl::Status CudaDevice::SyncEvent(Event event, const char* what) {
  return CudaStatus(cudaEventSynchronize(ToCuda(event)), what);
}

bool CudaDevice::EventDone(Event event) { return cudaEventQuery(ToCuda(event)) == cudaSuccess; }

absl::StatusOr<float> CudaDevice::ElapsedMs(Event start, Event end) {
  float ms = 0;
  RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, ToCuda(start), ToCuda(end)), "elapsed"));
  return ms;
}

absl::Status CudaDevice::CopyToDevice(void* dst, const void* src, uint64_t len, Stream stream,
                                      const char* what) {
  return CudaStatus(cudaMemcpyAsync(dst, src, len, cudaMemcpyHostToDevice, ToCuda(stream)), what);
}

absl::Status CudaDevice::CopyToDevice2D(void* dst, uint64_t dpitch, const void* src,
                                        uint64_t spitch, uint64_t width, uint64_t rows,
                                        Stream stream, const char* what) {
  return CudaStatus(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyHostToDevice,
                                      ToCuda(stream)),
                    what);
}

absl::Status CudaDevice::WriteValue32(Stream stream, uint32_t* word, uint32_t value,
                                      const char* what) {
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  return CuStatus(
      api->StreamWriteValue32(Cu(ToCuda(stream)), Cu(word), value, CU_STREAM_WRITE_VALUE_DEFAULT),
      what);
}

absl::Status CudaDevice::WaitValue32(Stream stream, const uint32_t* word, uint32_t value,
                                     const char* what) {
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  return CuStatus(
      api->StreamWaitValue32(Cu(ToCuda(stream)), Cu(word), value, CU_STREAM_WAIT_VALUE_EQ), what);
}

absl::Status CudaDevice::LaunchCopy(const CopyDesc* descs, size_t count, uint32_t object_len,
                                    Stream stream, const char* what) {
  return CudaStatus(LaunchCopyObjects(descs, count, object_len, io_->ctas(), ToCuda(stream)), what);
}

absl::Status CudaDevice::CopyByCopyEngine(const CopyDesc* descs, const uint32_t* groups,
                                          size_t count, uint32_t object_len, Stream stream,
                                          const char* what) {
  // One copy per run of adjacent objects, not per object: each copy costs the driver and the
  // engines microseconds of set-up (copy_runs.h).
  thread_local std::vector<CopyRun> runs;  // these keep their capacity across calls
  thread_local std::vector<void*> dsts;
  thread_local std::vector<const void*> srcs;
  thread_local std::vector<size_t> sizes;
  MergeCopyRuns(descs, groups, count, object_len, &runs);
  dsts.clear();
  srcs.clear();
  sizes.clear();
  for (const CopyRun& r : runs) {
    dsts.push_back(r.dst);
    srcs.push_back(r.src);
    sizes.push_back(r.bytes);
  }
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attr_index = 0;
  return CudaStatus(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), runs.size(), &attr,
                                         &attr_index, 1, ToCuda(stream)),
                    what);
}

absl::Status CudaDevice::LaunchHash(const HashDesc* descs, size_t count, uint64_t* hashes,
                                    Stream stream, const char* what) {
  if (count > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", count, " objects in one launch"));
  }
  return CudaStatus(LaunchHashObjects(descs, static_cast<uint32_t>(count), DefaultXxh3Secret(),
                                      hashes, ToCuda(stream)),
                    what);
}

}  // namespace tutti::gpu

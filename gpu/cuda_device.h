// CudaDevice: gpu::Device (gpu/device.h) over the CUDA runtime and driver, on an IoStream's device.
//
// Each method is the CUDA call the copy path made directly before the seam: io_stream() is the
// IoStream's stream and io_mutex() its mutex; CreateStream is cudaStreamCreateWithFlags
// (non-blocking); events are cudaEventCreate (kTiming) or cudaEventCreateWithFlags with
// cudaEventDisableTiming (kOrder) plus cudaEventBlockingSync (kBlocking); copies are
// cudaMemcpyAsync / cudaMemcpy2DAsync host to device; the value calls are cuStreamWriteValue32
// (default flags) and cuStreamWaitValue32 (equal); LaunchCopy is LaunchCopyObjects with the
// IoStream's CTAs; CopyByCopyEngine is one cudaMemcpyBatchAsync of the descriptors merged into
// runs (gpu/copy_runs.h; stream order of sources, cudaMemcpyFlagPreferOverlapWithCompute); pinned buffers are PinnedRegion::Allocate.
// Errors: CudaStatus / CuStatus of the failed call (gpu/cuda_status.h).
//
// Thread-safety: as gpu::Device. Lifetimes: the IoStream must outlive the device.
#ifndef TUTTI_GPU_CUDA_DEVICE_H_
#define TUTTI_GPU_CUDA_DEVICE_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "gpu/device.h"
#include "gpu/io_stream.h"

namespace tutti::gpu {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(IoStream* io) : io_(io) {}
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  static cudaStream_t ToCuda(Stream s) { return reinterpret_cast<cudaStream_t>(s); }
  static cudaEvent_t ToCuda(Event e) { return reinterpret_cast<cudaEvent_t>(e); }
  static Stream FromCuda(cudaStream_t s) { return reinterpret_cast<Stream>(s); }
  static Event FromCuda(cudaEvent_t e) { return reinterpret_cast<Event>(e); }

  int ordinal() const override { return io_->device(); }
  Stream io_stream() const override { return FromCuda(io_->stream()); }
  absl::Mutex& io_mutex() const override { return io_->mutex(); }

  absl::Status Activate() override;
  absl::StatusOr<uint64_t> MaxPitch() override;
  absl::Status Synchronize() override;

  absl::StatusOr<uint8_t*> Allocate(uint64_t bytes, const char* what) override;
  void Free(void* p) override;
  absl::Status Memset(void* p, int value, uint64_t bytes, const char* what) override;
  absl::StatusOr<std::unique_ptr<PinnedBuffer>> AllocatePinned(uint64_t bytes) override;

  absl::StatusOr<Stream> CreateStream(const char* what) override;
  void DestroyStream(Stream stream) override;
  // The I/O stream through IoStream::Synchronize (its own message), others by
  // cudaStreamSynchronize.
  absl::Status SyncStream(Stream stream, const char* what) override;

  absl::StatusOr<Event> CreateEvent(EventKind kind, const char* what) override;
  void DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Stream stream, const char* what) override;
  absl::Status SyncEvent(Event event, const char* what) override;
  bool EventDone(Event event) override;
  absl::StatusOr<float> ElapsedMs(Event start, Event end) override;

  absl::Status CopyToDevice(void* dst, const void* src, uint64_t len, Stream stream,
                            const char* what) override;
  absl::Status CopyToDevice2D(void* dst, uint64_t dpitch, const void* src, uint64_t spitch,
                              uint64_t width, uint64_t rows, Stream stream,
                              const char* what) override;
  absl::Status WriteValue32(Stream stream, uint32_t* word, uint32_t value,
                            const char* what) override;
  absl::Status WaitValue32(Stream stream, const uint32_t* word, uint32_t value,
                           const char* what) override;
  absl::Status LaunchCopy(const CopyDesc* descs, size_t count, uint32_t object_len, Stream stream,
                          const char* what) override;
  absl::Status CopyByCopyEngine(const CopyDesc* descs, const uint32_t* groups, size_t count,
                                uint32_t object_len, Stream stream, const char* what) override;
  absl::Status LaunchHash(const HashDesc* descs, size_t count, uint64_t* hashes, Stream stream,
                          const char* what) override;

 private:
  IoStream* const io_;
};

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_CUDA_DEVICE_H_

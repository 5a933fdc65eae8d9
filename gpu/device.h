// gpu::Device: the GPU as the daemon's copy path uses it, one seam with two implementations.
//
//   CudaDevice (gpu/cuda_device.h): the CUDA runtime and driver over an IoStream, each call the
//     one the copy path made directly before the seam (same streams, same flags, same order).
//   HostDevice (gpu/host_device.h): host memory; streams run each operation at once, in the
//     calling thread, so tests run the copy path's logic (and check its bytes) without a GPU.
//
// Work goes on streams and runs in enqueue order per stream; events mark a point of a stream;
// 32-bit words in device memory let one stream wait for another without a host thread. "Device
// memory" and "pinned memory" are whatever the implementation allocates; addresses of either are
// plain pointers the copy calls accept (pinned memory is mapped, at the same address).
//
// Errors: every fallible call returns the implementation's error with `what` (a short name of the
// operation, given by the caller) in its message: INTERNAL for a failed CUDA call,
// RESOURCE_EXHAUSTED for an allocation that does not fit, whatever a HostDevice was told to inject.
// An operation that fails to enqueue did nothing on its stream.
//
// Thread-safety: every method may be called from any thread; enqueue sequences on io_stream() that
// must stay contiguous are made under io_mutex() (IoStream::mutex()).
// Lifetimes: handles (streams, events, allocations) belong to the caller, who destroys them through
// the device that made them before the device goes.
#ifndef TUTTI_GPU_DEVICE_H_
#define TUTTI_GPU_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/copy_desc.h"
#include "gpu/hash_desc.h"

namespace tutti::gpu {

class Device {
 public:
  // Opaque handles, owned by the caller. A CudaDevice's are cudaStream_t and cudaEvent_t.
  struct StreamHandle;
  struct EventHandle;
  using Stream = StreamHandle*;
  using Event = EventHandle*;

  enum class EventKind {
    kTiming,    // ElapsedMs works on it
    kBlocking,  // no timing; SyncEvent sleeps instead of spinning a core
    kOrder,     // no timing; only ordering and SyncEvent
  };

  // Page-locked host memory mapped into the device (host() is also its device address); freed
  // when destroyed. Destroy it only when no copy that reads or writes it is in flight.
  class PinnedBuffer {
   public:
    virtual ~PinnedBuffer() = default;
    virtual uint8_t* host() const = 0;
  };

  virtual ~Device() = default;

  // The device ordinal, for logs.
  virtual int ordinal() const = 0;
  // The I/O stream: the one the copy kernels and ready words run on (not owned by the caller).
  virtual Stream io_stream() const = 0;
  // Serializes enqueue sequences on io_stream().
  virtual absl::Mutex& io_mutex() const = 0;

  // Makes the device current for the calling thread. UNAVAILABLE when there is no usable device.
  [[nodiscard]] virtual absl::Status Activate() = 0;
  // The largest pitch a 2D copy accepts (bytes).
  [[nodiscard]] virtual absl::StatusOr<uint64_t> MaxPitch() = 0;
  // Waits until all work on the device has run.
  [[nodiscard]] virtual absl::Status Synchronize() = 0;

  // Device memory of `bytes` (not initialized); Free(nullptr) does nothing.
  [[nodiscard]] virtual absl::StatusOr<uint8_t*> Allocate(uint64_t bytes, const char* what) = 0;
  virtual void Free(void* p) = 0;
  // Sets `bytes` of device memory at `p` to `value`, returning once done.
  [[nodiscard]] virtual absl::Status Memset(void* p, int value, uint64_t bytes,
                                            const char* what) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<PinnedBuffer>> AllocatePinned(
      uint64_t bytes) = 0;

  // A stream of its own, not ordered with any other (non-blocking).
  [[nodiscard]] virtual absl::StatusOr<Stream> CreateStream(const char* what) = 0;
  // Waits for the stream, then destroys it (errors ignored: for tear-down).
  virtual void DestroyStream(Stream stream) = 0;
  // Returns once everything enqueued on `stream` has run, with the first error it met.
  [[nodiscard]] virtual absl::Status SyncStream(Stream stream, const char* what) = 0;

  [[nodiscard]] virtual absl::StatusOr<Event> CreateEvent(EventKind kind, const char* what) = 0;
  virtual void DestroyEvent(Event event) = 0;
  // Marks the point of `stream` after everything enqueued so far.
  [[nodiscard]] virtual absl::Status RecordEvent(Event event, Stream stream, const char* what) = 0;
  // Returns once the work before the event's last record has run.
  [[nodiscard]] virtual absl::Status SyncEvent(Event event, const char* what) = 0;
  // Whether the work before the event's last record has run (false also on any error).
  virtual bool EventDone(Event event) = 0;
  // Milliseconds between two completed records of kTiming events.
  [[nodiscard]] virtual absl::StatusOr<float> ElapsedMs(Event start, Event end) = 0;

  // Copies `len` bytes from host (pinned or pageable) memory to device memory on `stream`.
  // Pageable sources are read before the call returns or by the stream, as the implementation
  // chooses: keep them unchanged until the stream has passed the copy.
  [[nodiscard]] virtual absl::Status CopyToDevice(void* dst, const void* src, uint64_t len,
                                                  Stream stream, const char* what) = 0;
  // `rows` rows of `width` bytes, at pitches `dpitch` and `spitch` (both <= MaxPitch()).
  [[nodiscard]] virtual absl::Status CopyToDevice2D(void* dst, uint64_t dpitch, const void* src,
                                                    uint64_t spitch, uint64_t width, uint64_t rows,
                                                    Stream stream, const char* what) = 0;
  // Enqueues *word = value (no fence) / makes `stream` wait until *word == value. `word` is device
  // memory.
  [[nodiscard]] virtual absl::Status WriteValue32(Stream stream, uint32_t* word, uint32_t value,
                                                  const char* what) = 0;
  [[nodiscard]] virtual absl::Status WaitValue32(Stream stream, const uint32_t* word,
                                                 uint32_t value, const char* what) = 0;

  // The copy kernel (gpu/copy_kernel.h) over `count` descriptors of `object_len` bytes on `stream`;
  // the descriptors may be reused once the call returns. Preconditions as LaunchCopyObjects.
  [[nodiscard]] virtual absl::Status LaunchCopy(const CopyDesc* descs, size_t count,
                                                uint32_t object_len, Stream stream,
                                                const char* what) = 0;
  // The same copies by the copy engines alone (no SM runs), ordered on `stream`. Objects of one
  // group (groups[i] for descs[i]) adjacent both where they come from and where they go are
  // copied as one run (gpu/copy_runs.h), so a group must lie in one allocation on each side; null
  // `groups`: one copy an object. No destination may overlap another descriptor's source or
  // destination.
  [[nodiscard]] virtual absl::Status CopyByCopyEngine(const CopyDesc* descs, const uint32_t* groups,
                                                      size_t count, uint32_t object_len,
                                                      Stream stream, const char* what) = 0;
  // The hash kernel (gpu/hash_kernel.h) on `stream`: hashes[i] = XXH3_64bits_withSeed(
  // descs[i].data, descs[i].len, descs[i].seed) for i < count, with XXH3's default secret.
  // `descs` and `hashes` are device-addressable (device or pinned memory) and stay valid until
  // the stream has passed the kernel. Preconditions: GpuHashSupports(len) for every desc.
  [[nodiscard]] virtual absl::Status LaunchHash(const HashDesc* descs, size_t count,
                                                uint64_t* hashes, Stream stream,
                                                const char* what) = 0;
};

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_DEVICE_H_

// HostDevice: gpu::Device (gpu/device.h) in host memory, for tests of the GPU copy path in CI.
//
// Device memory and pinned buffers are host heap (aligned to 4 KiB); every stream runs each
// operation at once in the calling thread, so an enqueue call returns with its work done: copies
// are memcpy, the copy kernel and the copy engines a loop over the descriptors (the hash kernel
// one over libxxhash), a recorded event
// is complete (its time is the host clock's at the record), WriteValue32 a store. WaitValue32 is a
// check: with every stream already past all its work, a word that does not hold the value now never
// will, so the call fails (FAILED_PRECONDITION) where a GPU stream would hang; the stream then
// stays stuck, as a GPU's would: every later call on it, SyncStream included, fails the same way.
//
// It checks what a GPU would fault on: copies into device memory must land inside one allocation;
// the copy kernel's and copy engines' sources and destinations must lie in device memory or a
// pinned buffer (a kernel cannot read pageable memory); events and streams must be this device's.
// Such misuse fails with INTERNAL, naming the operation and address, and copies nothing.
//
// Failure injection: FailOp(op, after, status) makes the call of kind `op` that comes after
// `after` more successful ones fail with `status`, doing nothing (once). Counts per kind say which
// paths a test took.
//
// Thread-safety: as gpu::Device; FailOp and the counters may be used from any thread.
#ifndef TUTTI_GPU_HOST_DEVICE_H_
#define TUTTI_GPU_HOST_DEVICE_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gpu/device.h"

namespace tutti::gpu {

class HostDevice final : public Device {
 public:
  // The kinds of call counted and failed on purpose.
  enum class Op {
    kAllocate,
    kCopyToDevice,
    kCopyToDevice2D,
    kWriteValue32,
    kWaitValue32,
    kLaunchCopy,
    kCopyByCopyEngine,
    kRecordEvent,
    kSyncEvent,
    kSyncStream,
    kLaunchHash,
  };
  static constexpr size_t kNumOps = static_cast<size_t>(Op::kLaunchHash) + 1;

  // `max_pitch`: what MaxPitch() returns.
  explicit HostDevice(uint64_t max_pitch = 1ull << 21);
  HostDevice(const HostDevice&) = delete;
  HostDevice& operator=(const HostDevice&) = delete;
  // Frees what is still allocated (a test's leak is its own to check: live_allocations()).
  ~HostDevice() override;

  void FailOp(Op op, uint64_t after, absl::Status status);
  // Runs `hook` at the start of every SyncEvent, outside the device's locks, as the time a GPU
  // event takes to complete (a test holds a waiter there to see what else runs meanwhile); null
  // removes it.
  void SetSyncEventHook(std::function<void()> hook);
  // Calls of kind `op` that succeeded so far.
  uint64_t count(Op op) const;
  // Descriptors the copy kernel (LaunchCopy) and the copy engines (CopyByCopyEngine) moved.
  uint64_t kernel_objects() const;
  uint64_t copy_engine_objects() const;
  // The copies CopyByCopyEngine made of them: its descriptors merged into runs (copy_runs.h).
  uint64_t copy_engine_runs() const;
  // Device allocations and pinned buffers not yet freed (registered host memory not counted).
  size_t live_allocations() const;
  // Treats [p, p + bytes), host memory the caller owns (the store's staging region), as pinned
  // memory, as cudaHostRegister makes it: copies and kernels may use it. Unregister it before it
  // goes; Free leaves it alone.
  void RegisterHost(void* p, uint64_t bytes);
  void UnregisterHost(void* p);

  int ordinal() const override { return 0; }
  Stream io_stream() const override { return io_stream_; }
  absl::Mutex& io_mutex() const override ABSL_LOCK_RETURNED(io_mu_) { return io_mu_; }

  absl::Status Activate() override { return absl::OkStatus(); }
  absl::StatusOr<uint64_t> MaxPitch() override { return max_pitch_; }
  absl::Status Synchronize() override { return absl::OkStatus(); }

  absl::StatusOr<uint8_t*> Allocate(uint64_t bytes, const char* what) override;
  void Free(void* p) override;
  absl::Status Memset(void* p, int value, uint64_t bytes, const char* what) override;
  absl::StatusOr<std::unique_ptr<PinnedBuffer>> AllocatePinned(uint64_t bytes) override;

  absl::StatusOr<Stream> CreateStream(const char* what) override;
  void DestroyStream(Stream stream) override;
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
  // XXH3_64bits_withSeed (libxxhash) over each descriptor's bytes, which must lie in device
  // memory (the kernel hashes engine objects there); `descs` and `hashes` in device or pinned
  // memory. An unsupported length is misuse too.
  absl::Status LaunchHash(const HashDesc* descs, size_t count, uint64_t* hashes, Stream stream,
                          const char* what) override;

 private:
  friend class HostPinnedBuffer;
  struct Block {
    uint64_t size;
    bool pinned;
    bool registered = false;  // the caller's memory (RegisterHost)
  };
  struct EventState {
    EventKind kind;
    bool recorded = false;
    std::chrono::steady_clock::time_point at;
  };
  struct Failure {
    Op op;
    uint64_t after;
    absl::Status status;
  };

  // Counts the call, or returns the injected failure (and counts nothing).
  absl::Status Begin(Op op, Stream stream, const char* what);
  // OK when [p, p + len) lies in one allocation (device memory, or also pinned with
  // `pinned_ok`).
  absl::Status CheckRange(const void* p, uint64_t len, bool pinned_ok, const char* what) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckDescs(const CopyDesc* descs, size_t count, uint32_t object_len,
                          const char* what) const;
  uint8_t* AllocateBlock(uint64_t bytes, bool pinned);
  void FreeBlock(void* p);

  const uint64_t max_pitch_;
  Stream const io_stream_;
  mutable absl::Mutex io_mu_;
  mutable absl::Mutex mu_;
  std::map<uintptr_t, Block> blocks_ ABSL_GUARDED_BY(mu_);
  std::set<Stream> streams_ ABSL_GUARDED_BY(mu_);
  std::set<Stream> stuck_ ABSL_GUARDED_BY(mu_);  // behind a wait that never ends
  std::map<Event, EventState> events_ ABSL_GUARDED_BY(mu_);
  std::array<uint64_t, kNumOps> counts_ ABSL_GUARDED_BY(mu_){};
  std::vector<Failure> failures_ ABSL_GUARDED_BY(mu_);
  std::function<void()> sync_event_hook_ ABSL_GUARDED_BY(mu_);
  uint64_t kernel_objects_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copy_engine_objects_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copy_engine_runs_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_HOST_DEVICE_H_

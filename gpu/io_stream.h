// The daemon's I/O-domain stream: a CUDA stream whose kernels run on a bounded set of SMs.
//
// Create() builds a green context holding `sm_count` SMs (a multiple of 8: Hopper's split
// granularity) of the device and a stream in it, so the daemon's scatter and gather kernels never
// take more of the GPU than configured. Where green contexts are unavailable (old driver, a GPU
// that cannot be split, or the split/launch test fails) it falls back to an ordinary non-blocking
// stream of the device's primary context and says so in description() and the "gpu" log, warning
// once: service continues, without the SM bound.
//
// All memory of the process's primary context is usable from the stream in either mode: a green
// context shares the primary context's address space.
//
// Thread-safety: the stream may be used from several threads; enqueue sequences that must stay
// contiguous (a layer's copies followed by its ready word) are made under mutex(). The design is one I/O
// thread per stream; the mutex makes sharing safe, not fast.
#ifndef TUTTI_GPU_IO_STREAM_H_
#define TUTTI_GPU_IO_STREAM_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tutti::gpu {

class IoStream {
 public:
  struct Options {
    int device = 0;
    // SMs for the I/O domain: a positive multiple of 8. 0 asks for an ordinary stream (no green
    // context, all SMs).
    uint32_t sm_count = 16;
    // Kernels launched per copy: CTAs. 0 means 2 per SM of the domain.
    uint32_t ctas = 0;
  };

  // INVALID_ARGUMENT if sm_count is not a multiple of 8 or exceeds the device's SMs (checked
  // before touching the GPU, so callers learn of bad configuration without one); UNAVAILABLE
  // without a usable device (see Probe); other errors if even the ordinary stream cannot be made.
  static absl::StatusOr<std::unique_ptr<IoStream>> Create(const Options& options);

  // Checks the options without a GPU (sm_count within [0, device_sms] and a multiple of 8).
  static absl::Status ValidateOptions(const Options& options, int device_sms);

  IoStream(const IoStream&) = delete;
  IoStream& operator=(const IoStream&) = delete;
  // Synchronizes, then destroys the stream and the green context.
  ~IoStream();

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  bool is_green() const { return green_ctx_ != nullptr; }
  // SMs the domain's kernels may use: the green context's, or the whole device's on fallback.
  uint32_t sm_count() const { return sm_count_; }
  // CTAs per copy launch.
  uint32_t ctas() const { return ctas_; }
  // "green context: 16 of 132 SMs" or "ordinary stream: <why the green context was not used>".
  const std::string& description() const { return description_; }

  // Serializes enqueue sequences; see the class comment.
  absl::Mutex& mutex() const ABSL_LOCK_RETURNED(mu_) { return mu_; }

  // Waits until all work enqueued so far has run; returns its error, if any (INTERNAL for sticky
  // errors that have poisoned this process's context).
  [[nodiscard]] absl::Status Synchronize();

 private:
  IoStream() = default;

  mutable absl::Mutex mu_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  void* green_ctx_ = nullptr;  // CUgreenCtx
  uint32_t sm_count_ = 0;
  uint32_t ctas_ = 0;
  std::string description_;
};

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_IO_STREAM_H_

// Layer-ready words: GPU-side signals from the daemon to an engine's stream, one uint32 per layer.
//
// The engine allocates the words in its own GPU memory (ReadyWordArray) and hands the daemon an
// IPC handle at Attach. For a Retrieve with ticket t, the daemon enqueues, after layer l's scatter
// on its I/O stream, word[l] = t (ReadyWords::Signal, cuStreamWriteValue32 with a memory fence, so
// the layer's bytes are visible before the word). Before layer l's attention the engine enqueues
// WaitLayer(stream, word[l], t) (cuStreamWaitValue32 >=) on its own stream: no host thread blocks
// and no message is sent per layer. Tickets grow per request; the comparison is wrap-around safe
// ((int32)(word - t) >= 0), so a stream waiting for t is released by t or any later ticket.
//
// Because the words are the engine's memory, a daemon that dies never leaves the engine waiting
// on freed memory; the engine's client then releases waiting streams itself (ForceRelease).
//
// Thread-safety: Signal may be called from any thread (it enqueues on the I/O stream under its
// mutex). ReadyWordArray's methods may be called from any thread; WaitLayer as cuStreamWaitValue32.
#ifndef TUTTI_GPU_READY_WORDS_H_
#define TUTTI_GPU_READY_WORDS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/device.h"
#include "gpu/io_stream.h"
#include "gpu/ipc_mapping.h"

namespace tutti::gpu {

// Daemon side: the engine's words, opened in this process.
class ReadyWords {
 public:
  // Opens `num_words` words at byte `offset` (a multiple of 4) of the engine allocation `region`.
  // INVALID_ARGUMENT for a bad handle, another GPU's UUID, words past the declared size, or an
  // allocation smaller than declared; the CUDA error if the handle does not open.
  static absl::StatusOr<std::unique_ptr<ReadyWords>> Open(const IpcRegion& region, uint64_t offset,
                                                          uint32_t num_words, IoStream* stream);
  // Words this process already maps (in-process engines, tests). Not closed on destruction.
  static absl::StatusOr<std::unique_ptr<ReadyWords>> WrapLocal(uint32_t* device_words,
                                                               uint32_t num_words,
                                                               IoStream* stream);
  // The same on `device` (its io_stream() is the I/O stream; a HostDevice in tests).
  static absl::StatusOr<std::unique_ptr<ReadyWords>> WrapLocal(uint32_t* device_words,
                                                               uint32_t num_words, Device* device);
  ReadyWords(const ReadyWords&) = delete;
  ReadyWords& operator=(const ReadyWords&) = delete;
  // Waits for the I/O stream, then closes the mapping.
  ~ReadyWords();

  uint32_t num_words() const { return num_words_; }

  // Enqueues word[index] = ticket on the I/O stream, ordered after all work enqueued before it
  // and preceded by a memory fence. INVALID_ARGUMENT when index >= num_words().
  [[nodiscard]] absl::Status Signal(uint32_t index, uint32_t ticket);

 private:
  ReadyWords(Device* device, std::unique_ptr<Device> owned_device, uint32_t num_words)
      : owned_device_(std::move(owned_device)), device_(device), num_words_(num_words) {}

  const std::unique_ptr<Device> owned_device_;  // a CudaDevice over the IoStream, or null
  Device* const device_;
  const uint32_t num_words_;
  std::unique_ptr<IpcMapping> mapping_;  // null for WrapLocal
  uint32_t* words_ = nullptr;
};

// Engine side: words allocated on the engine's GPU, zeroed.
class ReadyWordArray {
 public:
  // Allocates `num_words` zeroed words on `device` (cudaMalloc, so an IPC handle can be taken).
  // UNAVAILABLE without a GPU; RESOURCE_EXHAUSTED when memory is short.
  static absl::StatusOr<std::unique_ptr<ReadyWordArray>> Create(int device, uint32_t num_words);
  ReadyWordArray(const ReadyWordArray&) = delete;
  ReadyWordArray& operator=(const ReadyWordArray&) = delete;
  // Frees the words. Precondition: no stream still waits on them and the daemon closed them.
  ~ReadyWordArray();

  uint32_t num_words() const { return num_words_; }
  uint32_t* word(uint32_t index) const { return words_ + index; }
  // The handle, size and GPU UUID to send at Attach (offset 0).
  absl::StatusOr<IpcRegion> ExportIpc() const;

  // Writes `ticket` into every word, releasing every stream that waits for a ticket <= `ticket`;
  // returns once written (DEADLINE_EXCEEDED after 20 s). For when the daemon is gone.
  // Two writers at once. The release helper (gpu/release_helper_main.cc, at $TUTTI_RELEASE_HELPER
  // or /usr/libexec/tutti/tutti-release) opens the words' IPC handle and writes them from a
  // context of its own, as the daemon would have: this context can be stalled as a whole while a
  // stream waits on the words (a kernel launched behind the wait for the first time, under CUDA's
  // lazy loading, holds it until that stream is idle; seen on the H200 with torch), and then no
  // write of its own lands. And this context writes them on one new stream per hardware work
  // queue (WorkQueues()): a stream sharing a queue with a blocked engine stream waits behind it.
  // Returns once all of this context's writes have landed and the helper has exited, so no late
  // write of `ticket` can land on a later Retrieve's words. Without the helper (logged) a stalled
  // context is not released: run such engines with CUDA_MODULE_LOADING=EAGER.
  [[nodiscard]] absl::Status ForceRelease(uint32_t ticket);

 private:
  ReadyWordArray(int device, uint32_t num_words) : device_(device), num_words_(num_words) {}

  absl::Status ReleaseFromThisContext(uint32_t ticket, absl::Time deadline);

  const int device_;
  const uint32_t num_words_;
  uint32_t* words_ = nullptr;
  std::string handle_;  // cudaIpcMemHandle_t bytes, taken at Create
};

// Hardware work queues per context: CUDA_DEVICE_MAX_CONNECTIONS (default 8), clamped to [1, 32].
int WorkQueues();

// Engine side: makes `stream` wait (on the GPU) until *word >= ticket, wrap-around safe. Returns
// at once. `word` must be device memory of this process's GPU that lives until the wait is over.
[[nodiscard]] absl::Status WaitLayer(cudaStream_t stream, const uint32_t* word, uint32_t ticket);

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_READY_WORDS_H_

#include "gpu/ready_words.h"

#include <cuda.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/cuda_device.h"
#include "gpu/cuda_status.h"
#include "gpu/driver_api.h"
#include "gpu/probe.h"

extern char** environ;

namespace tutti::gpu {
namespace {

constexpr size_t kMinIpcAllocation = 2 << 20;
constexpr char kDefaultReleaseHelper[] = "/usr/libexec/tutti/tutti-release";

CUstream Cu(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }
CUdeviceptr Cu(const uint32_t* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

absl::StatusOr<std::unique_ptr<ReadyWords>> ReadyWords::Open(const IpcRegion& region,
                                                             uint64_t offset, uint32_t num_words,
                                                             IoStream* stream) {
  if (offset % sizeof(uint32_t) != 0 || num_words == 0 || offset > region.size_bytes ||
      (region.size_bytes - offset) / sizeof(uint32_t) < num_words) {
    return absl::InvalidArgumentError(absl::StrCat("ready words: ", num_words, " words at offset ",
                                                   offset, " do not fit ", region.size_bytes,
                                                   " bytes, or are unaligned"));
  }
  ASSIGN_OR_RETURN(DeviceInfo device, Probe(stream->device()));
  ASSIGN_OR_RETURN(std::unique_ptr<IpcMapping> mapping,
                   IpcMapping::Open(region, device, "ready words"));
  auto cuda = std::make_unique<CudaDevice>(stream);
  Device* const d = cuda.get();
  std::unique_ptr<ReadyWords> words(new ReadyWords(d, std::move(cuda), num_words));
  words->words_ = reinterpret_cast<uint32_t*>(mapping->base() + offset);
  words->mapping_ = std::move(mapping);
  return words;
}

absl::StatusOr<std::unique_ptr<ReadyWords>> ReadyWords::WrapLocal(uint32_t* device_words,
                                                                  uint32_t num_words,
                                                                  IoStream* stream) {
  if (device_words == nullptr || num_words == 0) {
    return absl::InvalidArgumentError("ready words: null or empty");
  }
  auto cuda = std::make_unique<CudaDevice>(stream);
  Device* const d = cuda.get();
  std::unique_ptr<ReadyWords> words(new ReadyWords(d, std::move(cuda), num_words));
  words->words_ = device_words;
  return words;
}

absl::StatusOr<std::unique_ptr<ReadyWords>> ReadyWords::WrapLocal(uint32_t* device_words,
                                                                  uint32_t num_words,
                                                                  Device* device) {
  if (device_words == nullptr || num_words == 0) {
    return absl::InvalidArgumentError("ready words: null or empty");
  }
  std::unique_ptr<ReadyWords> words(new ReadyWords(device, nullptr, num_words));
  words->words_ = device_words;
  return words;
}

ReadyWords::~ReadyWords() {
  absl::Status s = device_->SyncStream(device_->io_stream(), "I/O stream synchronize");
  if (!s.ok())
    log::Get("gpu")->error("gpu{}: closing ready words: {}", device_->ordinal(), s.ToString());
}

absl::Status ReadyWords::Signal(uint32_t index, uint32_t ticket) {
  if (index >= num_words_) {
    return absl::InvalidArgumentError(
        absl::StrCat("ready word ", index, " out of range (", num_words_, " words)"));
  }
  absl::MutexLock lock(&device_->io_mutex());
  return device_->WriteValue32(device_->io_stream(), words_ + index, ticket,
                               "cuStreamWriteValue32(ready word)");
}

absl::StatusOr<std::unique_ptr<ReadyWordArray>> ReadyWordArray::Create(int device,
                                                                       uint32_t num_words) {
  if (num_words == 0) return absl::InvalidArgumentError("ready words: num_words must be > 0");
  RETURN_IF_ERROR(Probe(device).status());
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  std::unique_ptr<ReadyWordArray> array(new ReadyWordArray(device, num_words));
  // A whole 2 MiB allocation of its own: a small cudaMalloc may share an allocation with other
  // memory, and an IPC handle exports the whole allocation it lies in.
  const size_t bytes = std::max<size_t>(sizeof(uint32_t) * num_words, kMinIpcAllocation);
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&array->words_), bytes),
                             "cudaMalloc(ready words)"));
  RETURN_IF_ERROR(CudaStatus(cudaMemset(array->words_, 0, bytes), "cudaMemset(ready words)"));
  RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  // Taken now: ForceRelease's helper needs it when this context may be stalled.
  cudaIpcMemHandle_t handle;
  RETURN_IF_ERROR(CudaStatus(cudaIpcGetMemHandle(&handle, array->words_), "cudaIpcGetMemHandle"));
  array->handle_.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  return array;
}

ReadyWordArray::~ReadyWordArray() {
  if (words_ == nullptr) return;
  absl::Status s = CudaStatus(cudaFree(words_), "cudaFree(ready words)");
  if (!s.ok()) log::Get("gpu")->error("gpu{}: {}", device_, s.ToString());
}

absl::StatusOr<IpcRegion> ReadyWordArray::ExportIpc() const {
  ASSIGN_OR_RETURN(DeviceInfo info, Probe(device_));
  IpcRegion region;
  region.handle = handle_;
  region.size_bytes = sizeof(uint32_t) * num_words_;
  region.gpu_uuid = info.uuid_text;
  return region;
}

namespace {

std::string ReleaseHelperPath() {
  const char* env = std::getenv("TUTTI_RELEASE_HELPER");
  return env != nullptr && env[0] != '\0' ? env : kDefaultReleaseHelper;
}

// Starts the helper (a process of its own, so no CUDA call of this process is involved); -1 with
// the reason in *why when it cannot be started.
pid_t StartReleaseHelper(int device, const std::string& handle, uint32_t count, uint32_t ticket,
                         std::string* why) {
  const std::string path = ReleaseHelperPath();
  if (access(path.c_str(), X_OK) != 0) {
    *why = absl::StrCat("no release helper at ", path, " (set TUTTI_RELEASE_HELPER)");
    return -1;
  }
  std::vector<std::string> args = {path, absl::StrCat(device), absl::BytesToHexString(handle),
                                   absl::StrCat(count), absl::StrCat(ticket)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, path.c_str(), nullptr, nullptr, argv.data(), environ);
  if (rc != 0) {
    *why = absl::StrCat("starting ", path, ": ", strerror(rc));
    return -1;
  }
  return pid;
}

// Waits for the helper until `deadline` (then kills it); how it ended.
std::string ReapReleaseHelper(pid_t pid, absl::Time deadline) {
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return absl::StrCat("waitpid: ", strerror(errno));
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return "the release helper was killed (too slow)";
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  if (WIFEXITED(status)) return absl::StrCat("release helper exit ", WEXITSTATUS(status));
  return absl::StrCat("release helper status ", status);
}

}  // namespace

absl::Status ReadyWordArray::ForceRelease(uint32_t ticket) {
  // The helper first: if this context is stalled, even the calls below may block until it has
  // written the words.
  std::string helper_note;
  const pid_t helper = handle_.empty()
                           ? -1
                           : StartReleaseHelper(device_, handle_, num_words_, ticket, &helper_note);
  if (helper < 0) log::Get("gpu")->warn("gpu{}: releasing ready words: {}", device_, helper_note);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  absl::Status s = ReleaseFromThisContext(ticket, deadline);
  if (helper >= 0) helper_note = ReapReleaseHelper(helper, deadline);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(s.message(), "; ", helper_note));
  return absl::OkStatus();
}

absl::Status ReadyWordArray::ReleaseFromThisContext(uint32_t ticket, absl::Time deadline) {
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  // One new stream per hardware work queue, plus one: a stream sharing a queue with an engine
  // stream blocked on these words would wait behind it until another one's write has landed.
  std::vector<cudaStream_t> streams;
  absl::Status s;
  for (int i = 0; i <= WorkQueues() && s.ok(); ++i) {
    cudaStream_t side = nullptr;
    s = CudaStatus(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags");
    if (!s.ok()) break;
    streams.push_back(side);
    for (uint32_t w = 0; w < num_words_ && s.ok(); ++w) {
      s = CuStatus(
          api->StreamWriteValue32(Cu(side), Cu(words_ + w), ticket, CU_STREAM_WRITE_VALUE_DEFAULT),
          "cuStreamWriteValue32(release)");
    }
  }
  // All of them: once the engine's waits have passed every queue drains, and a write of this
  // ticket still queued could otherwise land on a later Retrieve's words.
  size_t done = 0;
  while (s.ok() && done < streams.size()) {
    const cudaError_t q = cudaStreamQuery(streams[done]);
    if (q == cudaSuccess) {
      ++done;
    } else if (q != cudaErrorNotReady) {
      s = CudaStatus(q, "cudaStreamQuery(release)");
    } else if (absl::Now() > deadline) {
      s = absl::DeadlineExceededError(
          "releasing the ready words: the writes did not land within 20 s");
    } else {
      absl::SleepFor(absl::Microseconds(200));
    }
  }
  // Streams with writes still pending are freed by the driver once those have run.
  for (cudaStream_t side : streams) cudaStreamDestroy(side);
  return s;
}

int WorkQueues() {
  const char* env = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  int n = 8;
  if (env != nullptr && !absl::SimpleAtoi(env, &n)) n = 8;
  return std::clamp(n, 1, 32);
}

absl::Status WaitLayer(cudaStream_t stream, const uint32_t* word, uint32_t ticket) {
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  return CuStatus(api->StreamWaitValue32(Cu(stream), Cu(word), ticket, CU_STREAM_WAIT_VALUE_GEQ),
                  "cuStreamWaitValue32(ready word)");
}

}  // namespace tutti::gpu

#include "gpu/ready_words.h"

#include <cuda.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"
#include "gpu/cuda_status.h"
#include "gpu/driver_api.h"
#include "gpu/probe.h"

namespace tutti::gpu {
namespace {

constexpr size_t kMinIpcAllocation = 2 << 20;

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
  std::unique_ptr<ReadyWords> words(new ReadyWords(stream, num_words));
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
  std::unique_ptr<ReadyWords> words(new ReadyWords(stream, num_words));
  words->words_ = device_words;
  return words;
}

ReadyWords::~ReadyWords() {
  absl::Status s = stream_->Synchronize();
  if (!s.ok())
    log::Get("gpu")->error("gpu{}: closing ready words: {}", stream_->device(), s.ToString());
}

absl::Status ReadyWords::Signal(uint32_t index, uint32_t ticket) {
  if (index >= num_words_) {
    return absl::InvalidArgumentError(
        absl::StrCat("ready word ", index, " out of range (", num_words_, " words)"));
  }
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  absl::MutexLock lock(&stream_->mutex());
  return CuStatus(api->StreamWriteValue32(Cu(stream_->stream()), Cu(words_ + index), ticket,
                                          CU_STREAM_WRITE_VALUE_DEFAULT),
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
  return array;
}

ReadyWordArray::~ReadyWordArray() {
  if (words_ == nullptr) return;
  absl::Status s = CudaStatus(cudaFree(words_), "cudaFree(ready words)");
  if (!s.ok()) log::Get("gpu")->error("gpu{}: {}", device_, s.ToString());
}

absl::StatusOr<IpcRegion> ReadyWordArray::ExportIpc() const {
  ASSIGN_OR_RETURN(DeviceInfo info, Probe(device_));
  cudaIpcMemHandle_t handle;
  RETURN_IF_ERROR(CudaStatus(cudaIpcGetMemHandle(&handle, words_), "cudaIpcGetMemHandle"));
  IpcRegion region;
  region.handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  region.size_bytes = sizeof(uint32_t) * num_words_;
  region.gpu_uuid = info.uuid_text;
  return region;
}

absl::Status ReadyWordArray::ForceRelease(uint32_t ticket) {
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  // One new stream per hardware work queue, plus one: a stream sharing a queue with an engine
  // stream blocked on these words would wait behind it forever (see the header).
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
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool landed = false;
  while (s.ok() && !landed) {
    for (cudaStream_t side : streams) {
      const cudaError_t q = cudaStreamQuery(side);
      if (q == cudaSuccess) {
        landed = true;
        break;
      }
      if (q != cudaErrorNotReady) {
        s = CudaStatus(q, "cudaStreamQuery(release)");
        break;
      }
    }
    if (s.ok() && !landed) {
      if (absl::Now() > deadline) {
        s = absl::DeadlineExceededError(
            "releasing the ready words: no write landed within 10 s (every hardware work queue "
            "blocked?)");
      } else {
        absl::SleepFor(absl::Microseconds(200));
      }
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

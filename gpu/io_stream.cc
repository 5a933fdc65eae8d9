#include "gpu/io_stream.h"

#include <cuda.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/copy_kernel.h"
#include "gpu/cuda_status.h"
#include "gpu/driver_api.h"
#include "gpu/probe.h"

namespace tutti::gpu {
namespace {

constexpr uint32_t kSmGranularity = 8;

// A green context with one stream, owned by the caller until moved into an IoStream.
struct GreenStream {
  CUgreenCtx ctx = nullptr;
  cudaStream_t stream = nullptr;
  uint32_t sms = 0;
};

void DestroyGreen(const GreenStream& g) {
  auto api = GetDriverApi();
  if (!api.ok()) return;
  if (g.stream != nullptr) (*api)->StreamDestroy(reinterpret_cast<CUstream>(g.stream));
  if (g.ctx != nullptr) (*api)->GreenCtxDestroy(g.ctx);
}

// Splits a group of at least `want_sms` SMs of `device` into a green context and makes a stream
// in it; releases what it made on failure.
absl::StatusOr<GreenStream> CreateGreen(int device, uint32_t want_sms) {
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  if (!api->has_green_contexts()) return absl::UnimplementedError("driver lacks green contexts");
  CUdevice dev;
  CU_RETURN_IF_ERROR(api->DeviceGet(&dev, device));
  CUdevResource all;
  CU_RETURN_IF_ERROR(api->DeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  CUdevResource part;
  unsigned int groups = 1;
  CU_RETURN_IF_ERROR(api->DevSmResourceSplitByCount(&part, &groups, &all, nullptr, 0, want_sms));
  if (groups < 1) {
    return absl::UnavailableError(
        absl::StrCat("cannot split a group of ", want_sms, " SMs off ", all.sm.smCount));
  }
  CUdevResourceDesc desc;
  CU_RETURN_IF_ERROR(api->DevResourceGenerateDesc(&desc, &part, 1));
  GreenStream g;
  g.sms = part.sm.smCount;
  CU_RETURN_IF_ERROR(api->GreenCtxCreate(&g.ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUstream stream = nullptr;
  absl::Status s = CuStatus(api->GreenCtxStreamCreate(&stream, g.ctx, CU_STREAM_NON_BLOCKING, 0),
                            "cuGreenCtxStreamCreate");
  if (!s.ok()) {
    DestroyGreen(g);
    return s;
  }
  g.stream = reinterpret_cast<cudaStream_t>(stream);
  return g;
}

// Runs the copy kernel and a stream memory write on `stream` and checks both landed: proves the
// stream can do what the I/O path needs before we commit to it.
absl::Status SelfTest(cudaStream_t stream) {
  ASSIGN_OR_RETURN(const DriverApi* api, GetDriverApi());
  uint8_t* buf = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(reinterpret_cast<void**>(&buf), 64), "cudaMalloc(self-test)"));
  uint8_t host[64];
  for (int i = 0; i < 32; ++i) host[i] = static_cast<uint8_t>(i * 7 + 1);
  std::memset(host + 32, 0, 32);
  absl::Status s = CudaStatus(cudaMemcpy(buf, host, 64, cudaMemcpyHostToDevice), "cudaMemcpy");
  CopyDesc desc{buf, buf + 32};
  if (s.ok()) s = CudaStatus(LaunchCopyObjects(&desc, 1, 16, 1, stream), "copy kernel launch");
  if (s.ok()) {
    s = CuStatus(api->StreamWriteValue32(reinterpret_cast<CUstream>(stream),
                                         reinterpret_cast<CUdeviceptr>(buf + 48), 0x5eed, 0),
                 "cuStreamWriteValue32");
  }
  if (s.ok()) s = CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize(self-test)");
  uint8_t back[64];
  if (s.ok()) s = CudaStatus(cudaMemcpy(back, buf, 64, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(buf);
  RETURN_IF_ERROR(s);
  uint32_t word;
  std::memcpy(&word, back + 48, 4);
  if (std::memcmp(back + 32, host, 16) != 0 || word != 0x5eed) {
    return absl::InternalError("I/O stream self-test: copy or ready word did not land");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status IoStream::ValidateOptions(const Options& options, int device_sms) {
  if (options.device < 0) return absl::InvalidArgumentError("gpu device must be >= 0");
  if (options.sm_count % kSmGranularity != 0) {
    return absl::InvalidArgumentError(absl::StrCat("gpu sm_count = ", options.sm_count,
                                                   ": must be a multiple of ", kSmGranularity));
  }
  if (options.sm_count > static_cast<uint32_t>(device_sms)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu sm_count = ", options.sm_count, ": the device has ", device_sms, " SMs"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<IoStream>> IoStream::Create(const Options& options) {
  RETURN_IF_ERROR(ValidateOptions(options, 1 << 30));
  ASSIGN_OR_RETURN(DeviceInfo info, Probe(options.device));
  RETURN_IF_ERROR(ValidateOptions(options, info.sm_count));
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.device), "cudaSetDevice"));
  RETURN_IF_ERROR(CudaStatus(cudaFree(nullptr), "primary context init"));

  std::unique_ptr<IoStream> io(new IoStream());
  io->device_ = options.device;
  std::string why_not_green = "sm_count = 0 asks for an ordinary stream";
  if (options.sm_count > 0) {
    absl::StatusOr<GreenStream> green = CreateGreen(options.device, options.sm_count);
    absl::Status s = green.status();
    if (s.ok()) {
      s = SelfTest(green->stream);
      if (!s.ok()) DestroyGreen(*green);
    }
    if (s.ok()) {
      io->stream_ = green->stream;
      io->green_ctx_ = green->ctx;
      io->sm_count_ = green->sms;
      io->description_ = absl::StrCat("green context: ", green->sms, " of ", info.sm_count, " SMs");
    } else {
      why_not_green = s.ToString();
    }
  }
  if (io->stream_ == nullptr) {
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&io->stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags"));
    RETURN_IF_ERROR(SelfTest(io->stream_));
    io->sm_count_ = info.sm_count;
    io->description_ = absl::StrCat("ordinary stream: ", why_not_green);
    if (options.sm_count > 0) {
      log::Get("gpu")->warn("gpu{}: no green context, kernels may use all {} SMs ({})",
                            options.device, info.sm_count, why_not_green);
    }
  }
  // CTAs: 2 per SM of the domain; on fallback, of the SMs that were asked for.
  const uint32_t domain_sms =
      io->is_green() || options.sm_count == 0 ? io->sm_count_ : options.sm_count;
  io->ctas_ = options.ctas > 0 ? options.ctas : 2 * domain_sms;
  log::Get("gpu")->info("gpu{}: I/O stream: {}, {} CTAs per copy", options.device, io->description_,
                        io->ctas_);
  return io;
}

absl::Status IoStream::Synchronize() {
  return CudaStatus(cudaStreamSynchronize(stream_), "I/O stream synchronize");
}

IoStream::~IoStream() {
  if (stream_ == nullptr) return;
  absl::Status s = Synchronize();
  if (!s.ok()) log::Get("gpu")->error("gpu{}: closing I/O stream: {}", device_, s.ToString());
  if (green_ctx_ != nullptr) {
    DestroyGreen(GreenStream{static_cast<CUgreenCtx>(green_ctx_), stream_, sm_count_});
  } else {
    cudaStreamDestroy(stream_);
  }
}

}  // namespace tutti::gpu

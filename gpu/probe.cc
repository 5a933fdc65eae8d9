#include "gpu/probe.h"

#include <cuda_runtime_api.h>
#include <sys/stat.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "gpu/cuda_status.h"
#include "gpu/driver_api.h"

namespace tutti::gpu {

absl::StatusOr<DeviceInfo> Probe(int ordinal) {
  RETURN_IF_ERROR(GetDriverApi().status());
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || (err == cudaSuccess && count == 0)) {
    return absl::UnavailableError("no CUDA device");
  }
  RETURN_IF_ERROR(CudaStatus(err, "cudaGetDeviceCount"));
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU ordinal ", ordinal, " out of range: ", count, " device(s)"));
  }
  cudaDeviceProp prop;
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties"));
  DeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  std::memcpy(info.uuid.data(), prop.uuid.bytes, info.uuid.size());
  info.uuid_text = FormatUuid(info.uuid);
  info.sm_count = prop.multiProcessorCount;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.total_memory = prop.totalGlobalMem;
  info.host_pointer_for_registered_mem = prop.canUseHostPointerForRegisteredMem != 0;
  if (prop.major < kMinComputeMajor) {
    return absl::UnavailableError(absl::StrFormat(
        "%s (GPU %d) has compute capability %d.%d; tutti's kernels need %d.0 or later", info.name,
        ordinal, prop.major, prop.minor, kMinComputeMajor));
  }
  if (!prop.unifiedAddressing) {
    return absl::UnavailableError(absl::StrCat(info.name, " lacks unified addressing"));
  }
  return info;
}

MpsHint FindMps() {
  MpsHint hint;
  const char* dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  hint.pipe_directory = dir != nullptr && *dir != '\0' ? dir : "/tmp/nvidia-mps";
  struct stat st;
  hint.control_pipe_found = stat((hint.pipe_directory + "/control").c_str(), &st) == 0;
  return hint;
}

std::string FormatUuid(const Uuid& u) {
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                         u[12], u[13], u[14], u[15]);
}

absl::StatusOr<Uuid> ParseUuid(absl::string_view text) {
  absl::string_view rest = text;
  if (absl::StartsWithIgnoreCase(rest, "GPU-")) rest.remove_prefix(4);
  Uuid out{};
  int digits = 0;
  for (char c : rest) {
    if (c == '-') continue;
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) || digits >= 32) {
      return absl::InvalidArgumentError(absl::StrCat("bad GPU UUID: \"", text, "\""));
    }
    int v = absl::ascii_isdigit(static_cast<unsigned char>(c))
                ? c - '0'
                : absl::ascii_tolower(static_cast<unsigned char>(c)) - 'a' + 10;
    out[digits / 2] = static_cast<uint8_t>(out[digits / 2] << 4 | v);
    ++digits;
  }
  if (digits != 32) {
    return absl::InvalidArgumentError(absl::StrCat("bad GPU UUID: \"", text, "\""));
  }
  return out;
}

}  // namespace tutti::gpu

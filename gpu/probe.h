// Finding out whether this process can use a CUDA device, and naming devices by UUID.
//
// Probe() never crashes and never needs libcuda at link time: on a machine without a driver or
// without a GPU (CI, the build machine) it returns UNAVAILABLE, and callers take the host path.
//
// Thread-safety: all functions are safe to call from any thread.
#ifndef TUTTI_GPU_PROBE_H_
#define TUTTI_GPU_PROBE_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tutti::gpu {

using Uuid = std::array<uint8_t, 16>;

struct DeviceInfo {
  int ordinal = 0;
  std::string name;  // "NVIDIA H200"
  Uuid uuid{};
  std::string uuid_text;  // as nvidia-smi prints it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
  uint64_t total_memory = 0;
  // Registered host memory is reachable from kernels at its host address.
  bool host_pointer_for_registered_mem = false;
};

// The compute capability tutti's kernels are built for (tools/cuda.bzl: sm_90 + compute_90 PTX).
inline constexpr int kMinComputeMajor = 9;

// Describes device `ordinal` if tutti can use it. UNAVAILABLE when there is no driver, no device,
// or the device cannot run tutti's kernels (compute capability below 9.0, no unified addressing);
// INVALID_ARGUMENT when `ordinal` is negative or not below the device count. The message says
// which, for logs and `tuttictl status`.
absl::StatusOr<DeviceInfo> Probe(int ordinal = 0);

// Whether an MPS control daemon seems to run for this process: its pipe directory
// ($CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps) holds the "control" pipe. A hint for logs and
// status, not a guarantee (a stale pipe, or a daemon that refuses this user, also count): without
// MPS the GPU time-slices between tuttid and the engines, and an engine that keeps every SM busy
// loses time to tuttid's kernels (docs/gpu.md).
struct MpsHint {
  std::string pipe_directory;
  bool control_pipe_found = false;
};
MpsHint FindMps();

// "GPU-" followed by the 16 bytes in hex, grouped 8-4-4-4-12, lower case.
std::string FormatUuid(const Uuid& uuid);

// Parses a UUID with or without the "GPU-" prefix and the hyphens, in either case. INVALID_ARGUMENT
// when `text` does not hold exactly 32 hex digits.
absl::StatusOr<Uuid> ParseUuid(absl::string_view text);

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_PROBE_H_

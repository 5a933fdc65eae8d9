// Whether a GPU may ring an NVMe controller's BAR0 doorbells on this host, decided without CUDA
// (so it is testable anywhere): the doorbell page must be registered with
// cuMemHostRegister(CU_MEMHOSTREGISTER_IOMEMORY) / cudaHostRegisterIoMemory, which needs root and
// NVIDIA's open kernel module from 570.133.07 on (the proprietary module refuses I/O memory). The
// GPU then only writes BAR0, never reads it.
//
// Thread-safety: stateless.
#ifndef TUTTI_BENCH_NVME_GPU_DOORBELL_REQUIREMENTS_H_
#define TUTTI_BENCH_NVME_GPU_DOORBELL_REQUIREMENTS_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tutti::io::nvme::gpu {

struct NvidiaDriverVersion {
  bool open_module = false;  // "Open Kernel Module" in /proc/driver/nvidia/version
  uint32_t major = 0, minor = 0, patch = 0;
};

// Parses the text of /proc/driver/nvidia/version (its "NVRM version:" line); nullopt when there
// is no such line or no version number in it.
std::optional<NvidiaDriverVersion> ParseNvidiaDriverVersion(absl::string_view text);

// OK when a process with effective uid `euid` may register BAR0 as I/O memory under the driver
// described by `version_text` (the contents of /proc/driver/nvidia/version; empty when the file
// could not be read). Otherwise FAILED_PRECONDITION saying what is missing: root, a readable
// driver version, the open kernel module, or version 570.133.07.
absl::Status CheckIoMemoryRequirements(uint32_t euid, absl::string_view version_text);

}  // namespace tutti::io::nvme::gpu

#endif  // TUTTI_BENCH_NVME_GPU_DOORBELL_REQUIREMENTS_H_

// gpu_setup.h in a build without the CUDA toolkit (tools/cuda_configure.bzl): host mode only.
#include "absl/strings/str_cat.h"
#include "daemon/gpu_setup.h"

namespace tutti::gpu_setup {

bool BuiltWithCuda() { return false; }

uint64_t GpuStagingBytes(const v1::Config&) { return 0; }

absl::StatusOr<std::optional<ChosenGpu>> ChooseDevice(const v1::Config& config,
                                                      std::vector<std::string>* notes) {
  if (config.gpu().mode() == "cuda") {
    return absl::FailedPreconditionError(
        "gpu.mode = cuda, but this tuttid was built without CUDA (no CUDA toolkit at build "
        "time): set gpu.mode to \"auto\" or \"host\", or rebuild with the toolkit (README, GPU)");
  }
  notes->push_back(absl::StrCat("host mode: built without CUDA (gpu.mode = ", config.gpu().mode(),
                                "); engines attach host shared memory"));
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<GpuRuntime>> StartGpu(const v1::Config&, const ChosenGpu&,
                                                     store::BlockStore*,
                                                     std::vector<std::string>*) {
  return absl::FailedPreconditionError("tuttid was built without CUDA: there is no GPU data path");
}

}  // namespace tutti::gpu_setup

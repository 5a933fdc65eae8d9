// device.h in a build without the CUDA toolkit (tools/cuda_configure.bzl): cuda memory mode is
// not there; host memory mode works as always.
#include "client/cpp/device.h"

namespace tutti::client::internal {

absl::StatusOr<std::unique_ptr<Device>> OpenCudaDevice(int ordinal) {
  return absl::UnavailableError(
      "cuda memory mode: this tutti client library was built without CUDA (no CUDA toolkit at "
      "build time); use host memory mode or rebuild with the toolkit");
}

}  // namespace tutti::client::internal

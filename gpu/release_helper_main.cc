// tutti-release: writes a ticket into an engine's ready words from a CUDA context of its own.
//
//   tutti-release DEVICE IPC_HANDLE_HEX COUNT TICKET
//
// gpu::ReadyWordArray::ForceRelease runs it when tuttid is gone: the engine's own context can be
// stalled as a whole while one of its streams waits on the words (a kernel launched behind the
// wait for the first time, under CUDA's lazy loading, holds the context until that stream is
// idle), and then only a write from another context, as tuttid's would have been, releases it.
// Opens the words' legacy IPC handle (the 64 bytes of cudaIpcMemHandle_t, hex), copies COUNT
// copies of TICKET over them, closes the handle. Exit 0 once written; 2 for bad arguments; 1 for
// a CUDA error (printed).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"

namespace {

int Fail(const char* what, cudaError_t e) {
  std::fprintf(stderr, "tutti-release: %s: %s\n", what, cudaGetErrorString(e));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  uint32_t count = 0, ticket = 0;
  std::string handle_bytes;
  const std::string hex = argc == 5 ? argv[2] : "";
  const bool hex_ok = hex.size() == 2 * sizeof(cudaIpcMemHandle_t) &&
                      hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
  if (hex_ok) handle_bytes = absl::HexStringToBytes(hex);
  if (argc != 5 || !absl::SimpleAtoi(argv[1], &device) || !hex_ok ||
      !absl::SimpleAtoi(argv[3], &count) || count == 0 || count > (1u << 20) ||
      !absl::SimpleAtoi(argv[4], &ticket)) {
    std::fprintf(stderr, "usage: tutti-release DEVICE IPC_HANDLE_HEX(128 digits) COUNT TICKET\n");
    return 2;
  }
  cudaIpcMemHandle_t handle;
  std::copy(handle_bytes.begin(), handle_bytes.end(), reinterpret_cast<char*>(&handle));
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return Fail("cudaSetDevice", e);
  void* words = nullptr;
  e = cudaIpcOpenMemHandle(&words, handle, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) return Fail("cudaIpcOpenMemHandle(ready words)", e);
  const std::vector<uint32_t> values(count, ticket);
  e = cudaMemcpy(words, values.data(), sizeof(uint32_t) * count, cudaMemcpyHostToDevice);
  const cudaError_t closed = cudaIpcCloseMemHandle(words);
  if (e != cudaSuccess) return Fail("cudaMemcpy(ready words)", e);
  if (closed != cudaSuccess) return Fail("cudaIpcCloseMemHandle", closed);
  return 0;
}

// Helpers for GPU tests and benchmarks: skipping without a GPU, and deterministic object content.
// The engine KV formats as placements are the daemon's: daemon/gpu/testing/kv_layout.h.
#ifndef TUTTI_GPU_TESTING_TEST_UTIL_H_
#define TUTTI_GPU_TESTING_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu/probe.h"
#include "gtest/gtest.h"

// Skips the current test (it then counts as passed) when no usable GPU is present: CI machines.
#define TUTTI_SKIP_WITHOUT_GPU()                                  \
  do {                                                            \
    auto tutti_probe_ = ::tutti::gpu::Probe();                    \
    if (!tutti_probe_.ok()) {                                     \
      GTEST_SKIP() << "no usable GPU: " << tutti_probe_.status(); \
    }                                                             \
  } while (0)

namespace tutti::gpu::testing {

// Fills `len` bytes (a multiple of 8) with content derived from (seed, block, object).
void FillObject(uint64_t seed, uint32_t block, uint32_t object, uint8_t* out, uint32_t len);

// `count` distinct block indices in [0, num_blocks), in random order.
std::vector<uint32_t> RandomBlocks(uint64_t seed, uint32_t count, uint32_t num_blocks);

std::string ToHex(absl::string_view bytes);
absl::StatusOr<std::string> FromHex(absl::string_view hex);

}  // namespace tutti::gpu::testing

#endif  // TUTTI_GPU_TESTING_TEST_UTIL_H_

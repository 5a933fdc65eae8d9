// Helpers for gpu/ tests and benchmarks: skipping without a GPU, the engine KV formats as
// placements, and deterministic object content.
#ifndef TUTTI_GPU_TESTING_TEST_UTIL_H_
#define TUTTI_GPU_TESTING_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpu/placement.h"
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

enum class KvFormat {
  kFusedKv,       // vLLM: per layer one tensor [2, blocks, tokens, heads, dim]
  kSeparateKv,    // per layer a K tensor and a V tensor [blocks, tokens, heads, dim]
  kMla,           // per layer one latent tensor [blocks, tokens, latent_dim]
  kBlockMajorKv,  // FlashInfer: per layer one tensor [blocks, 2, tokens, heads, dim]
};
inline constexpr KvFormat kAllFormats[] = {KvFormat::kFusedKv, KvFormat::kSeparateKv,
                                           KvFormat::kMla, KvFormat::kBlockMajorKv};

const char* FormatName(KvFormat format);

struct KvLayout {
  EngineLayout layout;
  std::vector<uint64_t> region_sizes;
  uint32_t parts = 0;  // objects per layer
};

// The placements of `format` for `layers` layers of `num_blocks` blocks, objects of `object_len`.
KvLayout MakeKvLayout(KvFormat format, uint32_t layers, uint32_t num_blocks, uint32_t object_len);

// Fills `len` bytes (a multiple of 8) with content derived from (seed, block, object).
void FillObject(uint64_t seed, uint32_t block, uint32_t object, uint8_t* out, uint32_t len);

// `count` distinct block indices in [0, num_blocks), in random order.
std::vector<uint32_t> RandomBlocks(uint64_t seed, uint32_t count, uint32_t num_blocks);

std::string ToHex(absl::string_view bytes);
absl::StatusOr<std::string> FromHex(absl::string_view hex);

}  // namespace tutti::gpu::testing

#endif  // TUTTI_GPU_TESTING_TEST_UTIL_H_

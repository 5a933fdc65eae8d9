// The engine KV formats as placements (daemon/gpu/placement.h EngineLayout), for tests and
// benchmarks of the daemon's GPU engine memory.
#ifndef TUTTI_DAEMON_GPU_TESTING_KV_LAYOUT_H_
#define TUTTI_DAEMON_GPU_TESTING_KV_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "daemon/gpu/placement.h"

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

}  // namespace tutti::gpu::testing

#endif  // TUTTI_DAEMON_GPU_TESTING_KV_LAYOUT_H_

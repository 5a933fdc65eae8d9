#include "daemon/gpu/testing/kv_layout.h"

namespace tutti::gpu::testing {

const char* FormatName(KvFormat format) {
  switch (format) {
    case KvFormat::kFusedKv:
      return "fused_kv";
    case KvFormat::kSeparateKv:
      return "separate_kv";
    case KvFormat::kMla:
      return "mla";
    case KvFormat::kBlockMajorKv:
      return "block_major_kv";
  }
  return "?";
}

KvLayout MakeKvLayout(KvFormat format, uint32_t layers, uint32_t num_blocks, uint32_t object_len) {
  KvLayout kv;
  kv.layout.num_blocks = num_blocks;
  kv.layout.object_len = object_len;
  const uint64_t obj = object_len;
  const uint64_t nb = num_blocks;
  for (uint32_t l = 0; l < layers; ++l) {
    switch (format) {
      case KvFormat::kFusedKv:
        kv.parts = 2;
        kv.region_sizes.push_back(2 * nb * obj);
        kv.layout.placements.push_back({l, 0, obj});
        kv.layout.placements.push_back({l, nb * obj, obj});
        break;
      case KvFormat::kSeparateKv:
        kv.parts = 2;
        kv.region_sizes.push_back(nb * obj);
        kv.region_sizes.push_back(nb * obj);
        kv.layout.placements.push_back({2 * l, 0, obj});
        kv.layout.placements.push_back({2 * l + 1, 0, obj});
        break;
      case KvFormat::kMla:
        kv.parts = 1;
        kv.region_sizes.push_back(nb * obj);
        kv.layout.placements.push_back({l, 0, obj});
        break;
      case KvFormat::kBlockMajorKv:
        kv.parts = 2;
        kv.region_sizes.push_back(2 * nb * obj);
        kv.layout.placements.push_back({l, 0, 2 * obj});
        kv.layout.placements.push_back({l, obj, 2 * obj});
        break;
    }
  }
  return kv;
}

}  // namespace tutti::gpu::testing

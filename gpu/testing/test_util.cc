#include "gpu/testing/test_util.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/escaping.h"

namespace tutti::gpu::testing {
namespace {

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

void FillObject(uint64_t seed, uint32_t block, uint32_t object, uint8_t* out, uint32_t len) {
  uint64_t state = seed * 0x100000001b3ull ^ (uint64_t{block} << 32 | object);
  for (uint32_t i = 0; i + 8 <= len; i += 8) {
    const uint64_t v = SplitMix(&state);
    std::memcpy(out + i, &v, 8);
  }
}

std::vector<uint32_t> RandomBlocks(uint64_t seed, uint32_t count, uint32_t num_blocks) {
  std::vector<uint32_t> all(num_blocks);
  std::iota(all.begin(), all.end(), 0u);
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(std::min(count, num_blocks));
  return all;
}

std::string ToHex(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

absl::StatusOr<std::string> FromHex(absl::string_view hex) {
  if (hex.size() % 2 != 0) return absl::InvalidArgumentError("odd hex length");
  for (char c : hex) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError("not hex");
    }
  }
  return absl::HexStringToBytes(hex);
}

}  // namespace tutti::gpu::testing

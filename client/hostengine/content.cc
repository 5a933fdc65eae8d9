#include "client/hostengine/content.h"

#include <cstring>

#include "xxhash.h"

namespace tutti::hostengine {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// The splitmix64 finalizer: a bijective mix, so consecutive inputs give unrelated words.
inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t ObjectBase(const Key& key, uint32_t layer, uint32_t part) {
  uint8_t buf[Key::kSize + 8];
  std::memcpy(buf, key.bytes.data(), Key::kSize);
  std::memcpy(buf + Key::kSize, &layer, 4);
  std::memcpy(buf + Key::kSize + 4, &part, 4);
  return XXH3_64bits(buf, sizeof(buf));
}

Key FromHash(XXH128_hash_t h) {
  Key k;
  std::memcpy(k.bytes.data(), &h.low64, 8);
  std::memcpy(k.bytes.data() + 8, &h.high64, 8);
  return k;
}

// Number of nonzero bytes of `x`.
inline int NonzeroBytes(uint64_t x) {
  int n = 0;
  for (; x != 0; x >>= 8) n += (x & 0xff) != 0;
  return n;
}

}  // namespace

std::vector<Key> MakeKeyChain(uint64_t seed, uint64_t count) {
  std::vector<Key> keys;
  keys.reserve(count);
  uint8_t buf[Key::kSize + 8] = {};
  for (uint64_t i = 0; i < count; ++i) {
    if (i > 0) std::memcpy(buf, keys.back().bytes.data(), Key::kSize);
    std::memcpy(buf + Key::kSize, &i, 8);
    keys.push_back(FromHash(XXH3_128bits_withSeed(buf, sizeof(buf), seed)));
  }
  return keys;
}

void FillObject(const Key& key, uint32_t layer, uint32_t part, absl::Span<uint8_t> dst) {
  const uint64_t base = ObjectBase(key, layer, part);
  const size_t words = dst.size() / 8;
  uint8_t* p = dst.data();
  for (size_t w = 0; w < words; ++w) {
    const uint64_t v = Mix(base + w * kGolden);
    std::memcpy(p + 8 * w, &v, 8);
  }
  if (const size_t tail = dst.size() % 8; tail != 0) {
    const uint64_t v = Mix(base + words * kGolden);
    std::memcpy(p + 8 * words, &v, tail);
  }
}

uint64_t CountObjectMismatches(const Key& key, uint32_t layer, uint32_t part,
                               absl::Span<const uint8_t> data) {
  const uint64_t base = ObjectBase(key, layer, part);
  const size_t words = data.size() / 8;
  const uint8_t* p = data.data();
  uint64_t bad = 0;
  for (size_t w = 0; w < words; ++w) {
    uint64_t got;
    std::memcpy(&got, p + 8 * w, 8);
    const uint64_t diff = got ^ Mix(base + w * kGolden);
    if (diff != 0) bad += NonzeroBytes(diff);
  }
  if (const size_t tail = data.size() % 8; tail != 0) {
    uint64_t got = 0, want = 0;
    const uint64_t v = Mix(base + words * kGolden);
    std::memcpy(&got, p + 8 * words, tail);
    std::memcpy(&want, &v, tail);
    bad += NonzeroBytes(got ^ want);
  }
  return bad;
}

}  // namespace tutti::hostengine

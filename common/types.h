// Basic value types shared by the daemon's packages.
#ifndef TUTTI_COMMON_TYPES_H_
#define TUTTI_COMMON_TYPES_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tutti {

// A block key: the engine's chained prefix hash of the block's tokens, 16 bytes.
struct Key {
  std::array<uint8_t, 16> bytes{};

  static constexpr size_t kSize = 16;
  // Returns false when `raw` is not exactly 16 bytes.
  static bool FromBytes(std::string_view raw, Key* out) {
    if (raw.size() != kSize) return false;
    std::memcpy(out->bytes.data(), raw.data(), kSize);
    return true;
  }
  std::string_view view() const { return {reinterpret_cast<const char*>(bytes.data()), kSize}; }
  std::string Hex() const;  // for logs; defined in types.cc
  uint64_t lo() const {
    uint64_t v;
    std::memcpy(&v, bytes.data(), 8);
    return v;
  }
  uint64_t hi() const {
    uint64_t v;
    std::memcpy(&v, bytes.data() + 8, 8);
    return v;
  }
  // Two 64-bit compares (std::array's == is a memcmp call: a visible share of a 2048-key
  // Lookup's index probes).
  friend bool operator==(const Key& a, const Key& b) {
    return a.lo() == b.lo() && a.hi() == b.hi();
  }
  friend bool operator!=(const Key& a, const Key& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const Key& k) {
    return H::combine(std::move(h), k.lo(), k.hi());
  }
};

// Identifies a namespace (model, layout, TP rank and size, hash scheme); see
// BlockStore::RegisterNamespace (daemon/store/block_store.h).
using NamespaceId = uint64_t;

}  // namespace tutti

#endif  // TUTTI_COMMON_TYPES_H_

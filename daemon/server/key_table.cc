#include "daemon/server/key_table.h"

#include <cassert>

#include "absl/hash/hash.h"

namespace tutti::server {
namespace {

uint64_t Seed() {
  static const uint64_t seed = absl::Hash<uint64_t>{}(0x7475747469ULL) | 1;
  return seed;
}

}  // namespace

KeyTable::KeyTable(absl::Span<const Key> chain, size_t capacity) : chain_(chain) {
  size_t slots = 16;
  shift_ = 60;
  while (slots < 2 * capacity) {
    slots *= 2;
    --shift_;
  }
  slots_.assign(slots, 0);
  mask_ = slots - 1;
}

size_t KeyTable::Home(const Key& key) const {
  // Both words, multiplied and folded: the top bits of the product depend on every key bit.
  uint64_t h = (key.lo() ^ Seed()) * 0x9E3779B97F4A7C15ULL;
  h = (h ^ key.hi()) * 0xC2B2AE3D27D4EB4FULL;
  return static_cast<size_t>(h >> shift_);
}

size_t KeyTable::Insert(size_t i) {
  assert(i < chain_.size() && size_ < (slots_.size() / 2));
  const Key& key = chain_[i];
  const uint64_t lo = key.lo(), hi = key.hi();
  for (size_t s = Home(key);; s = (s + 1) & mask_) {
    const uint32_t v = slots_[s];
    if (v == 0) {
      slots_[s] = static_cast<uint32_t>(i + 1);
      ++size_;
      return i;
    }
    const Key& other = chain_[v - 1];
    if (other.lo() == lo && other.hi() == hi) return v - 1;
  }
}

std::optional<size_t> KeyTable::Find(const Key& key) const {
  const uint64_t lo = key.lo(), hi = key.hi();
  for (size_t s = Home(key);; s = (s + 1) & mask_) {
    const uint32_t v = slots_[s];
    if (v == 0) return std::nullopt;
    const Key& other = chain_[v - 1];
    if (other.lo() == lo && other.hi() == hi) return v - 1;
  }
}

std::optional<Duplicate> FindDuplicate(absl::Span<const Key> keys) {
  if (keys.size() < 2) return std::nullopt;
  KeyTable table(keys, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t at = table.Insert(i);
    if (at != i) return Duplicate{i, at};
  }
  return std::nullopt;
}

}  // namespace tutti::server

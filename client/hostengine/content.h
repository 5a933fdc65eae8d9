// Deterministic block keys and block content, so a store by one process (or one daemon lifetime)
// can be verified byte for byte by another.
//
// Keys form one chain per seed, like an engine's chained prefix hash:
//   key[0] = XXH3-128(seed, index 0), key[i] = XXH3-128(key[i-1] || i, seed).
// Content of object (layer, part) of the block with key K: 8-byte words, word w =
//   mix(XXH3-64(K || layer || part) + w * golden), so every byte depends on the key, the layer, the
//   part and its position, and a block copied to the wrong place, layer or part does not verify.
//
// Thread-safety: pure functions.
#ifndef TUTTI_CLIENT_HOSTENGINE_CONTENT_H_
#define TUTTI_CLIENT_HOSTENGINE_CONTENT_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/types.h"

namespace tutti::hostengine {

// The first `count` keys of the chain of `seed`. The same (seed, count) gives the same keys, and
// a longer count extends the same chain.
std::vector<Key> MakeKeyChain(uint64_t seed, uint64_t count);

// Writes the content of object (layer, part) of block `key` into `dst` (any length; a tail shorter
// than 8 bytes takes the leading bytes of its word).
void FillObject(const Key& key, uint32_t layer, uint32_t part, absl::Span<uint8_t> dst);

// Returns how many bytes of `data` differ from what FillObject would write (0: it verifies).
uint64_t CountObjectMismatches(const Key& key, uint32_t layer, uint32_t part,
                               absl::Span<const uint8_t> data);

}  // namespace tutti::hostengine

#endif  // TUTTI_CLIENT_HOSTENGINE_CONTENT_H_

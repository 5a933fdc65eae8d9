// The "tutti-sha256-v1" chained block hash (see tutti/client.h).
#include <cstring>

#include "client/cpp/sha256.h"
#include "tutti/client.h"

namespace tutti::client {
namespace {

void PutLe32(uint32_t v, uint8_t* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

std::vector<BlockKey> ChainKeys(const int32_t* tokens, size_t count, uint32_t block_tokens,
                                const BlockKey& parent) {
  std::vector<BlockKey> keys;
  if (block_tokens == 0) return keys;
  const size_t blocks = count / block_tokens;
  keys.reserve(blocks);
  std::vector<uint8_t> message(BlockKey().size() + 4 + 4 * size_t{block_tokens});
  BlockKey prev = parent;
  for (size_t b = 0; b < blocks; ++b) {
    uint8_t* p = message.data();
    std::memcpy(p, prev.data(), prev.size());
    p += prev.size();
    PutLe32(block_tokens, p);
    p += 4;
    for (uint32_t t = 0; t < block_tokens; ++t, p += 4) {
      PutLe32(static_cast<uint32_t>(tokens[b * block_tokens + t]), p);
    }
    Sha256 sha;
    sha.Update(message.data(), message.size());
    const Sha256::Digest digest = sha.Finish();
    std::memcpy(prev.data(), digest.data(), prev.size());
    keys.push_back(prev);
  }
  return keys;
}

std::string KeyHex(const BlockKey& key) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * key.size());
  for (uint8_t b : key) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

}  // namespace tutti::client

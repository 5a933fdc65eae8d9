// Internal: SHA-256 (FIPS 180-4), for the "tutti-sha256-v1" chained block hash. Small and
// dependency-free so the client library adds no crypto library to an engine's process.
//
// Thread-safety: a Sha256 object is used by one thread; the free function is pure.
#ifndef TUTTI_CLIENT_CPP_SHA256_H_
#define TUTTI_CLIENT_CPP_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>

namespace tutti::client {

class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;

  Sha256();
  void Update(const void* data, size_t len);
  // Pads and returns the digest. The object must not be updated afterwards.
  Digest Finish();

 private:
  void Compress(const uint8_t* block);

  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace tutti::client

#endif  // TUTTI_CLIENT_CPP_SHA256_H_

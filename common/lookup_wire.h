// The lookup socket's wire format: Lookups outside gRPC, for vLLM's scheduler (issue 21 section 4).
//
// A SOCK_STREAM unix socket beside tuttid's, LookupSocketPath(socket_path) = socket_path +
// ".lookup" (config listen.lookup_socket, on by default). A client keeps its connection and sends
// one request at a time, each answered before the next is read:
//   request:  u32 length n, u32 kind (kLookupKind), then n bytes: a serialized
//             tutti.v1.LookupRequest, exactly what KvCache.Lookup takes;
//   response: u32 length m, u32 code (an absl::StatusCode, the same numbers as gRPC's), then m
//             bytes: code 0, a serialized tutti.v1.LookupResponse; else tuttid's message in words.
// Integers are little-endian. tuttid answers a request exactly as KvCache.Lookup (the same code),
// and also refuses, as an unknown session, a session of a user other than the peer's (SO_PEERCRED).
// A request longer than the server's limit is answered INVALID_ARGUMENT and the connection
// closed; so is a request left unfinished for a second. Format and threat model: docs/security.md.
//
// Header-only and dependency-free: the Python client's extension (client/python/native/lookup.cc)
// includes it too.
#ifndef TUTTI_COMMON_LOOKUP_WIRE_H_
#define TUTTI_COMMON_LOOKUP_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace tutti {

inline constexpr char kLookupSocketSuffix[] = ".lookup";
inline constexpr size_t kLookupHeaderBytes = 8;
inline constexpr uint32_t kLookupKind = 1;  // the only kind; others are answered UNIMPLEMENTED
// The longest response tuttid sends (a LookupResponse is well under 1 KiB; messages are cut).
inline constexpr uint32_t kMaxLookupResponse = 1 << 16;

// The lookup socket of the tuttid serving `socket_path`.
inline std::string LookupSocketPath(const std::string& socket_path) {
  return socket_path + kLookupSocketSuffix;
}

// The longest request tuttid reads when a Lookup may carry `max_blocks_per_call` keys: each key is
// 18 bytes on the wire (tag, length, 16 bytes), plus room for the other fields.
inline constexpr uint32_t MaxLookupRequest(uint32_t max_blocks_per_call) {
  return 4096 + 24 * max_blocks_per_call;
}

inline void PutLookupU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

inline uint32_t GetLookupU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

}  // namespace tutti

#endif  // TUTTI_COMMON_LOOKUP_WIRE_H_

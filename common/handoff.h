// The handoff: how an engine proves who it is to tuttid and hands over its memory.
//
// gRPC cannot carry file descriptors or tell a server who its peer is, so before Attach an engine
// makes one exchange on a second unix socket beside tuttid's, HandoffPath(socket_path), of type
// SOCK_SEQPACKET (one message each way, boundaries kept):
//   engine -> tuttid: "TUTTIHO1" (8 bytes) then n, a little-endian uint32 (0 <= n <=
//   kMaxHandoffFds),
//                     with exactly n descriptors attached as SCM_RIGHTS (the engine's host-mode KV
//                     regions: shm or memfd descriptors it opened read-write; none in GPU mode);
//   tuttid -> engine: "OK" then a 16-byte credential, or "ER", one byte of absl::StatusCode, and
//                     a message in words.
// tuttid reads the peer's pid, uid and gid from the kernel (SO_PEERCRED) and files them with the
// descriptors under the credential: random, single use, valid for a short time (the daemon's
// config). AttachRequest.credential redeems it; host_shm regions name a descriptor by fd_index.
// The daemon therefore maps only memory the engine itself could open, with the rights the engine
// opened it with, and knows which user every session belongs to (per-user limits). Format and
// threat model: docs/security.md.
//
// Thread-safety: free functions, safe to call from any thread.
#ifndef TUTTI_COMMON_HANDOFF_H_
#define TUTTI_COMMON_HANDOFF_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tutti {

inline constexpr char kHandoffMagic[] = "TUTTIHO1";  // 8 bytes on the wire, no NUL
inline constexpr size_t kHandoffMagicBytes = 8;
inline constexpr uint32_t kMaxHandoffFds = 16;
inline constexpr size_t kCredentialBytes = 16;
// The longest message either side sends.
inline constexpr size_t kMaxHandoffMessage = 512;

// The handoff socket of the tuttid serving `socket_path`: the same path with ".handoff" appended.
std::string HandoffPath(const std::string& socket_path);

// Hands `fds` (not closed; the caller keeps them) and this process's credentials to the tuttid
// serving `socket_path` and returns the credential to put in AttachRequest.credential. Errors:
// INVALID_ARGUMENT for more than kMaxHandoffFds descriptors; UNAVAILABLE when the handoff socket
// cannot be reached, does not accept within `timeout` or does not answer within it (the message
// names the path, errno, and what it likely means: no tuttid, not in the socket's group, a full
// backlog); the daemon's refusal, "tuttid refused the handoff: ...", with its code
// (INVALID_ARGUMENT; RESOURCE_EXHAUSTED: too many credentials outstanding, or too many handoff
// connections open, naming the limit, e.g. "user 1001 has 16 handoff connections open
// (limits.max_handoff_connections_per_user)").
absl::StatusOr<std::string> HandOff(const std::string& socket_path, absl::Span<const int> fds,
                                    absl::Duration timeout = absl::Seconds(10));

}  // namespace tutti

#endif  // TUTTI_COMMON_HANDOFF_H_

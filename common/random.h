// Random bytes from the kernel's CSPRNG, for tokens that must not be guessed (handoff
// credentials, session tokens).
//
// Thread-safety: thread-safe.
#ifndef TUTTI_COMMON_RANDOM_H_
#define TUTTI_COMMON_RANDOM_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace tutti {

// `n` random bytes (getrandom(2), retried on EINTR and short reads). INTERNAL, naming errno, if
// the kernel gives none.
[[nodiscard]] absl::StatusOr<std::string> RandomBytes(size_t n);

}  // namespace tutti

#endif  // TUTTI_COMMON_RANDOM_H_

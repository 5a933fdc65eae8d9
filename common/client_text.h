// Text that comes from clients (engine ids, model ids, names): checked before it is kept, and
// escaped before it is logged, so that no client can forge log lines or flood the journal.
//
// Thread-safety: pure functions.
#ifndef TUTTI_COMMON_CLIENT_TEXT_H_
#define TUTTI_COMMON_CLIENT_TEXT_H_

#include <cstddef>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace tutti {

// OK when `value` is at most `max_bytes` long and holds no control characters (bytes below 0x20,
// and 0x7f); else INVALID_ARGUMENT "<field>: ..." saying which rule it broke (and where).
absl::Status CheckClientText(absl::string_view field, absl::string_view value, size_t max_bytes);

// `value` fit to log: control characters and non-ASCII bytes as C escapes (\n, \x1b), cut to
// `max_bytes` with "..." after.
std::string Escaped(absl::string_view value, size_t max_bytes = 256);

}  // namespace tutti

#endif  // TUTTI_COMMON_CLIENT_TEXT_H_

// Internal to daemon/io: the request checks every backend applies before touching a file.
#ifndef TUTTI_DAEMON_IO_REQUEST_CHECK_H_
#define TUTTI_DAEMON_IO_REQUEST_CHECK_H_

#include <cstdint>

#include "absl/types/span.h"
#include "daemon/io/io_backend.h"

namespace tutti::io::internal {

// The largest single transfer a backend accepts (the kernel caps one O_DIRECT transfer near 2 GiB).
inline constexpr uint32_t kMaxRequestBytes = 1u << 30;

// True when `r` names an existing file, is non-empty, at most kMaxRequestBytes, has its offset,
// length and buffer aligned to kAlignment, and lies within the file. Backends complete any other
// request with -EINVAL.
inline bool IsValidRequest(const IoRequest& r, absl::Span<const uint64_t> file_sizes) {
  if (r.file >= file_sizes.size()) return false;
  if (r.len == 0 || r.len > kMaxRequestBytes || r.buf == nullptr) return false;
  if (r.offset % kAlignment != 0 || r.len % kAlignment != 0) return false;
  if (reinterpret_cast<uintptr_t>(r.buf) % kAlignment != 0) return false;
  const uint64_t size = file_sizes[r.file];
  return r.offset <= size && r.len <= size - r.offset;
}

}  // namespace tutti::io::internal

#endif  // TUTTI_DAEMON_IO_REQUEST_CHECK_H_

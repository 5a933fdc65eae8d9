#include "common/random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tutti {

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string bytes(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(bytes.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    got += static_cast<size_t>(r);
  }
  return bytes;
}

}  // namespace tutti

// Creating the daemon's directories.
#ifndef TUTTI_COMMON_DIRS_H_
#define TUTTI_COMMON_DIRS_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace tutti {

// mkdir -p: creates `dir` and its missing parents with `mode` (before the umask). OK when `dir`
// is empty or already a directory; FAILED_PRECONDITION, naming the path, when it or a parent
// exists as something else or cannot be created.
absl::Status MakeDirs(const std::string& dir, mode_t mode);

}  // namespace tutti

#endif  // TUTTI_COMMON_DIRS_H_

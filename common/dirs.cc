#include "common/dirs.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tutti {

absl::Status MakeDirs(const std::string& dir, mode_t mode) {
  if (dir.empty()) return absl::OkStatus();
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  }
  const size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    RETURN_IF_ERROR(MakeDirs(dir.substr(0, slash), mode));
  }
  if (mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", dir, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace tutti

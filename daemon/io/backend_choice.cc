#include "daemon/io/backend_choice.h"

#include "absl/strings/str_cat.h"

namespace tutti::io {

BackendChoice Chosen(const std::string& requested) { return {requested, requested, ""}; }

absl::StatusOr<BackendChoice> ChooseFallback(const std::string& requested,
                                             const std::string& fallback,
                                             const absl::Status& why) {
  if (why.code() == absl::StatusCode::kInvalidArgument) return why;
  if (fallback == "fail") {
    return absl::Status(why.code(),
                        absl::StrCat("io.backend \"", requested, "\" cannot run (io.fallback is "
                                     "\"fail\"): ", why.message()));
  }
  return BackendChoice{"uring", requested,
                       absl::StrCat(requested, " cannot run: ", why.message())};
}

}  // namespace tutti::io

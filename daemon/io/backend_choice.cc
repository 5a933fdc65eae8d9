#include "daemon/io/backend_choice.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/io/backend_registry.h"

namespace tutti::io {

BackendChoice Chosen(std::string_view requested) {
  return {std::string(requested), std::string(requested), ""};
}

absl::Status CheckFallbackSetting(std::string_view fallback) {
  for (std::string_view v : kFallbackValues) {
    if (v == fallback) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "io.fallback: \"", std::string(fallback), "\" is not one of \"",
      std::string(kFallbackBackend), "\", \"fail\""));
}

bool CannotRunHere(std::string_view requested, const absl::Status& why) {
  return absl::IsUnavailable(why) && requested != kFallbackBackend;
}

absl::StatusOr<BackendChoice> ChooseFallback(std::string_view requested, std::string_view fallback,
                                             const absl::Status& why) {
  if (absl::Status s = CheckFallbackSetting(fallback); !s.ok()) return s;
  if (!CannotRunHere(requested, why)) return why;
  const std::string name(requested);
  if (fallback == "fail") {
    return absl::FailedPreconditionError(
        absl::StrCat("io.backend \"", name,
                     "\" cannot run on this host and io.fallback is \"fail\": ", why.message()));
  }
  std::string reason = absl::StartsWith(why.message(), absl::StrCat(name, ": "))
                           ? std::string(why.message())
                           : absl::StrCat(name, " cannot run: ", why.message());
  return BackendChoice{std::string(kFallbackBackend), name, std::move(reason)};
}

}  // namespace tutti::io

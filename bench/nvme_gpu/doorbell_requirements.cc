#include "bench/nvme_gpu/doorbell_requirements.h"

#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tutti::io::nvme::gpu {
namespace {

constexpr NvidiaDriverVersion kMinimum{true, 570, 133, 7};

// "570.133.07" -> {570, 133, 7}; false if `word` is not three dotted numbers.
bool ParseDotted(absl::string_view word, NvidiaDriverVersion* v) {
  std::vector<std::string> parts = absl::StrSplit(word, '.');
  if (parts.size() != 3) return false;
  uint32_t n[3];
  for (int i = 0; i < 3; ++i) {
    if (parts[i].empty() || parts[i].size() > 6) return false;
    n[i] = 0;
    for (char c : parts[i]) {
      if (c < '0' || c > '9') return false;
      n[i] = n[i] * 10 + (c - '0');
    }
  }
  v->major = n[0];
  v->minor = n[1];
  v->patch = n[2];
  return true;
}

}  // namespace

std::optional<NvidiaDriverVersion> ParseNvidiaDriverVersion(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, "NVRM version:")) continue;
    NvidiaDriverVersion v;
    v.open_module = absl::StrContains(line, "Open Kernel Module");
    for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      if (ParseDotted(word, &v)) return v;
    }
    return std::nullopt;
  }
  return std::nullopt;
}

absl::Status CheckIoMemoryRequirements(uint32_t euid, absl::string_view version_text) {
  if (euid != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU doorbells: registering BAR0 as I/O memory needs root (euid is ", euid, ")"));
  }
  std::optional<NvidiaDriverVersion> v = ParseNvidiaDriverVersion(version_text);
  if (!v.has_value()) {
    return absl::FailedPreconditionError(
        "GPU doorbells: no NVIDIA driver version in /proc/driver/nvidia/version");
  }
  const std::string have = absl::StrCat(v->major, ".", v->minor, ".", v->patch);
  if (!v->open_module) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU doorbells: the NVIDIA driver ", have,
        " is the proprietary kernel module; I/O memory registration needs the open module"));
  }
  if (std::tie(v->major, v->minor, v->patch) <
      std::tie(kMinimum.major, kMinimum.minor, kMinimum.patch)) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU doorbells: the open NVIDIA module ", have, " is older than 570.133.07"));
  }
  return absl::OkStatus();
}

}  // namespace tutti::io::nvme::gpu

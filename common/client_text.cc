#include "common/client_text.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tutti {

absl::Status CheckClientText(absl::string_view field, absl::string_view value, size_t max_bytes) {
  if (value.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value.size(), " bytes; at most ", max_bytes));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": control character 0x", absl::Hex(c, absl::kZeroPad2), " at byte ", i,
          "; only printable text is accepted"));
    }
  }
  return absl::OkStatus();
}

std::string Escaped(absl::string_view value, size_t max_bytes) {
  if (value.size() <= max_bytes) return absl::CHexEscape(value);
  return absl::StrCat(absl::CHexEscape(value.substr(0, max_bytes)), "...");
}

}  // namespace tutti

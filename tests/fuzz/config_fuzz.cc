// Fuzz target: the config text (config::LoadConfig). Any text either loads or is refused with
// INVALID_ARGUMENT; a loaded config renders to text that loads to the same config.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tutti::v1::Config> config = tutti::config::LoadConfig(text);
  if (!config.ok()) {
    if (config.status().code() != absl::StatusCode::kInvalidArgument) {
      std::fprintf(stderr, "refused with the wrong code: %s\n", config.status().ToString().c_str());
      abort();
    }
    return 0;
  }
  const std::string rendered = tutti::config::RenderConfig(*config);
  absl::StatusOr<tutti::v1::Config> again = tutti::config::LoadConfig(rendered);
  if (!again.ok() || again->SerializeAsString() != config->SerializeAsString()) {
    std::fprintf(stderr, "rendering does not reload: %s\n%s\n", again.status().ToString().c_str(),
                 rendered.c_str());
    abort();
  }
  return 0;
}

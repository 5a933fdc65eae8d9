#include "daemon/metrics/exporter.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace tutti::metrics {
namespace {

// A user name and password for HTTP basic auth.
struct BasicAuth {
  std::string user;
  std::string password;
};

absl::Status BadAuthFile(const std::string& path, const std::string& why) {
  return absl::FailedPreconditionError(
      absl::StrCat("metrics.basic_auth_file = \"", path, "\": ", why));
}

// The one "user:password" line of `path` (a trailing newline allowed), which only its owner may
// read or write.
absl::StatusOr<BasicAuth> ReadBasicAuth(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return BadAuthFile(path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return BadAuthFile(path, "not a regular file");
  if ((st.st_mode & 077) != 0) {
    return BadAuthFile(path, "open to its group or others (chmod 0600 it, owned by tuttid's user)");
  }
  std::ifstream in(path);
  if (!in) return BadAuthFile(path, "cannot be read by tuttid's user");
  std::stringstream text;
  text << in.rdbuf();
  std::string line = text.str();
  if (!line.empty() && line.back() == '\n') line.pop_back();
  if (!line.empty() && line.back() == '\r') line.pop_back();
  const size_t colon = line.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == line.size() ||
      line.find('\n') != std::string::npos) {
    return BadAuthFile(path, "must hold one line \"user:password\" (both non-empty)");
  }
  return BasicAuth{line.substr(0, colon), line.substr(colon + 1)};
}

// Compares in time that depends on the lengths only, not on where the bytes differ.
bool SameSecret(const std::string& given, const std::string& want) {
  unsigned char diff = given.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < given.size() && i < want.size(); ++i) diff |= given[i] ^ want[i];
  return diff == 0;
}

}  // namespace

bool MetricsEnabled(const std::string& listen) { return !listen.empty() && listen != "off"; }

// Renders one collection of the registry per scrape; called on the exposer's threads.
class MetricsExporter::Collector final : public prometheus::Collectable {
 public:
  Collector(const stats::Registry* registry, bool namespace_labels)
      : registry_(registry), namespace_labels_(namespace_labels) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return ToPrometheus(registry_->Collect(/*per_tenant=*/namespace_labels_));
  }

 private:
  const stats::Registry* const registry_;
  const bool namespace_labels_;
};

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(
    const ExporterOptions& options, const stats::Registry* registry) {
  const std::string& listen = options.listen;
  if (!MetricsEnabled(listen)) return std::unique_ptr<MetricsExporter>();
  if (registry == nullptr) {
    return absl::InvalidArgumentError("MetricsExporter::Start needs a stats registry");
  }
  std::optional<BasicAuth> auth;
  if (!options.basic_auth_file.empty()) {
    absl::StatusOr<BasicAuth> read = ReadBasicAuth(options.basic_auth_file);
    if (!read.ok()) return read.status();
    auth = std::move(*read);
  }
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->collector_ = std::make_shared<Collector>(registry, options.namespace_labels);
  // civetweb's options: keep-alive stays off (its default), so every connection ends after one
  // reply and a thread serves the next in arrival order. prometheus-cpp (civetweb's C++ wrapper)
  // reports a failure to listen by an exception: this is the one place it is caught.
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", listen,                                //
                                 "num_threads", std::to_string(kServingThreads),           //
                                 "request_timeout_ms", std::to_string(kRequestTimeoutMs),  //
                                 "enable_keep_alive", "no"});
  } catch (const std::exception& ex) {
    return absl::UnavailableError(
        absl::StrCat("metrics.listen = \"", listen, "\": cannot listen: ", ex.what()));
  }
  if (auth.has_value()) {
    e->exposer_->RegisterAuth(
        [a = std::move(*auth)](const std::string& user, const std::string& password) {
          return SameSecret(user, a.user) & SameSecret(password, a.password);
        },
        "tuttid");
  }
  e->exposer_->RegisterCollectable(e->collector_);
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  e->port_ = ports.empty() ? 0 : ports.front();
  e->url_ = absl::StrCat("http://", listen.substr(0, listen.rfind(':')), ":", e->port_, "/metrics");
  return e;
}

MetricsExporter::~MetricsExporter() { exposer_.reset(); }

}  // namespace tutti::metrics

// tuttid's Prometheus endpoint: http://HOST:PORT/metrics (config metrics.listen), served by
// prometheus-cpp's pull exposer. Each scrape collects the daemon's stats registry (common/stats.h)
// and renders it (families.h); nothing is counted on the I/O path for it.
//
// Who learns what (docs/metrics.md, docs/security.md "Metrics endpoint"): any local user can
// connect to a loopback port, so by default the page has no per-namespace series (no model names,
// namespace ids or per-namespace counts), only the daemon's totals; the operator turns them on
// (metrics.namespace_labels) and may require HTTP basic auth (metrics.basic_auth_file). A client
// that connects and sends nothing, or half a request, holds one of kServingThreads threads for at
// most kRequestTimeout; connections wait for a thread in arrival order, so such clients delay a
// scrape behind them by about kRequestTimeout per kServingThreads of them, and cannot stop it.
#ifndef TUTTI_DAEMON_METRICS_EXPORTER_H_
#define TUTTI_DAEMON_METRICS_EXPORTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/stats.h"
#include "daemon/metrics/families.h"

namespace prometheus {
class Exposer;
}

namespace tutti::metrics {

// How the endpoint is served (config MetricsConfig).
struct ExporterOptions {
  std::string listen;             // metrics.listen: HOST:PORT, "" or "off"
  bool namespace_labels = false;  // metrics.namespace_labels: per-namespace series
  // metrics.basic_auth_file: "" (no auth) or a file holding one line "user:password", readable by
  // the daemon and by no group or other user (mode 0600 or 0400). Read once, at Start.
  std::string basic_auth_file;
};

// True unless `listen` is "" or "off".
bool MetricsEnabled(const std::string& listen);

class MetricsExporter {
 public:
  // Threads serving HTTP connections, one connection each; a client that sends nothing (or half
  // a request) is dropped after kRequestTimeoutMs, as is a reply the client does not read.
  static constexpr int kServingThreads = 16;
  static constexpr int kRequestTimeoutMs = 2000;

  // Serves /metrics on options.listen (HOST:PORT, as config::ValidateConfig admits; port 0: any
  // free port, see port()). Returns null (nothing served) when !MetricsEnabled(options.listen).
  // Each scrape collects `registry` (which must outlive the exporter); without namespace_labels
  // the per-tenant families have no samples (the totals are unchanged).
  // INVALID_ARGUMENT for a null registry; FAILED_PRECONDITION, naming
  // metrics.basic_auth_file, when that file cannot be read, is not one "user:password" line, or
  // is open to its group or others; UNAVAILABLE, naming the address and the server's reason,
  // when it cannot listen there (in use, no such address).
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const ExporterOptions& options,
                                                                const stats::Registry* registry);
  // Stops listening; returns once no scrape is running.
  ~MetricsExporter();

  int port() const { return port_; }               // the port listened on
  const std::string& url() const { return url_; }  // http://HOST:PORT/metrics

 private:
  class Collector;
  MetricsExporter() = default;

  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // destroyed first: no scrape outlives it
  int port_ = 0;
  std::string url_;
};

}  // namespace tutti::metrics

#endif  // TUTTI_DAEMON_METRICS_EXPORTER_H_

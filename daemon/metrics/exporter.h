// tuttid's Prometheus endpoint: http://HOST:PORT/metrics (config metrics.listen), served by
// prometheus-cpp's pull exposer. Each scrape takes one snapshot of the daemon's stats (sources
// below) and renders it (families.h); nothing is counted on the I/O path for it.
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

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/metrics/families.h"
#include "daemon/server/sessions.h"
#include "daemon/store/block_store.h"

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

// Where a scrape reads its figures. Pointers and callables must stay valid until the exporter
// is destroyed; every one but `store` may be empty (null), its figures then read 0.
struct MetricsSources {
  const store::BlockStore* store = nullptr;
  const server::SessionManager* sessions = nullptr;
  std::function<uint32_t()> handoffs_outstanding;
  std::function<decision::AdvisorStats()> decisions;
  std::function<server::GpuLayerCounts()> gpu_layers;
  std::vector<std::string> pool_dirs;                              // device i's directory
  std::function<std::vector<server::DeviceHealth>()> nvme_health;  // reported NVMe health
  io::BackendChoice io_backend;  // what start-up chose (tutti_io_backend_info)
};

// One snapshot of `sources` (store must be non-null); without `namespace_labels` its store stats
// carry no namespaces (the totals are unchanged). Thread-safe as the sources are.
MetricsSnapshot TakeSnapshot(const MetricsSources& sources, bool namespace_labels);

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
  // INVALID_ARGUMENT for a null sources.store; FAILED_PRECONDITION, naming
  // metrics.basic_auth_file, when that file cannot be read, is not one "user:password" line, or
  // is open to its group or others; UNAVAILABLE, naming the address and the server's reason,
  // when it cannot listen there (in use, no such address).
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const ExporterOptions& options,
                                                                MetricsSources sources);
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

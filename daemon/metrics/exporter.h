// tuttid's Prometheus endpoint: http://HOST:PORT/metrics (config metrics.listen), served by
// prometheus-cpp's pull exposer. Each scrape takes one snapshot of the daemon's stats (sources
// below) and renders it (families.h); nothing is counted on the I/O path for it.
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

// Where a scrape reads its figures. Pointers and callables must stay valid until the exporter
// is destroyed; every one but `store` may be empty (null), its figures then read 0.
struct MetricsSources {
  const store::BlockStore* store = nullptr;
  const server::SessionManager* sessions = nullptr;
  std::function<uint32_t()> handoffs_outstanding;
  std::function<decision::AdvisorStats()> decisions;
  std::function<server::GpuLayerCounts()> gpu_layers;
  std::vector<std::string> pool_dirs;  // device i's directory
  std::function<std::vector<server::DeviceHealth>()> nvme_health;  // reported NVMe health
  io::BackendChoice io_backend;  // what start-up chose (tutti_io_backend_info)
};

// One snapshot of `sources` (store must be non-null). Thread-safe as the sources are.
MetricsSnapshot TakeSnapshot(const MetricsSources& sources);

// True unless `listen` is "" or "off".
bool MetricsEnabled(const std::string& listen);

class MetricsExporter {
 public:
  // Serves /metrics on `listen` (HOST:PORT, as config::ValidateConfig admits; port 0: any free
  // port, see port()). Returns null (nothing served) when !MetricsEnabled(listen).
  // INVALID_ARGUMENT for a null sources.store; UNAVAILABLE, naming the address and the
  // server's reason, when it cannot listen there (in use, no such address).
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const std::string& listen,
                                                                MetricsSources sources);
  // Stops listening; returns once no scrape is running.
  ~MetricsExporter();

  int port() const { return port_; }  // the port listened on
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

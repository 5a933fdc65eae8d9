#include "daemon/metrics/exporter.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace tutti::metrics {

MetricsSnapshot TakeSnapshot(const MetricsSources& src) {
  MetricsSnapshot s;
  s.store = src.store->Stats();
  for (datapath::Tier t : {datapath::Tier::kDram, datapath::Tier::kSsd}) {
    s.read_bandwidth[static_cast<int>(t)] = src.store->read_bandwidth().Get(t);
  }
  if (src.sessions != nullptr) s.sessions = src.sessions->num_sessions();
  if (src.handoffs_outstanding) s.handoffs_outstanding = src.handoffs_outstanding();
  if (src.decisions) s.decisions = src.decisions();
  if (src.gpu_layers) s.gpu_layers = src.gpu_layers();
  if (src.nvme_health) s.nvme_health = src.nvme_health();
  s.pool_dirs = src.pool_dirs;
  s.io_backend = src.io_backend;
  return s;
}

bool MetricsEnabled(const std::string& listen) { return !listen.empty() && listen != "off"; }

// Renders one snapshot per scrape; called on the exposer's threads.
class MetricsExporter::Collector final : public prometheus::Collectable {
 public:
  explicit Collector(MetricsSources sources) : sources_(std::move(sources)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return BuildFamilies(TakeSnapshot(sources_));
  }

 private:
  const MetricsSources sources_;
};

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(const std::string& listen,
                                                                        MetricsSources sources) {
  if (!MetricsEnabled(listen)) return std::unique_ptr<MetricsExporter>();
  if (sources.store == nullptr) {
    return absl::InvalidArgumentError("MetricsExporter::Start needs a block store");
  }
  std::unique_ptr<MetricsExporter> e(new MetricsExporter());
  e->collector_ = std::make_shared<Collector>(std::move(sources));
  // prometheus-cpp (civetweb's C++ wrapper) reports a failure to listen by an exception: this
  // is the one place it is caught.
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& ex) {
    return absl::UnavailableError(
        absl::StrCat("metrics.listen = \"", listen, "\": cannot listen: ", ex.what()));
  }
  e->exposer_->RegisterCollectable(e->collector_);
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  e->port_ = ports.empty() ? 0 : ports.front();
  e->url_ = absl::StrCat("http://", listen.substr(0, listen.rfind(':')), ":", e->port_, "/metrics");
  return e;
}

MetricsExporter::~MetricsExporter() { exposer_.reset(); }

}  // namespace tutti::metrics

// The daemon's figures as Prometheus metric families (names tutti_*, each with HELP), built from
// one snapshot of the existing stats at scrape time: nothing on the I/O path is counted twice.
// docs/operations.md lists the names; daemon/metrics/families.cc is where each one comes from.
#ifndef TUTTI_DAEMON_METRICS_FAMILIES_H_
#define TUTTI_DAEMON_METRICS_FAMILIES_H_

#include <optional>
#include <string>
#include <vector>

#include "daemon/datapath/bandwidth.h"
#include "daemon/decision/advisor.h"
#include "daemon/io/backend_choice.h"
#include "daemon/server/admin_service.h"
#include "daemon/server/device_health.h"
#include "daemon/store/block_store.h"
#include "prometheus/metric_family.h"

namespace tutti::metrics {

// Everything one scrape shows, copied out of the daemon's parts (MetricsSources, exporter.h).
struct MetricsSnapshot {
  store::StoreStats store;
  datapath::TierBandwidth read_bandwidth[datapath::kNumTiers];  // by datapath::Tier
  uint32_t sessions = 0;
  uint32_t handoffs_outstanding = 0;
  std::optional<decision::AdvisorStats> decisions;  // absent: no advisor
  std::optional<server::GpuLayerCounts> gpu_layers;  // absent: host mode
  std::vector<std::string> pool_dirs;                // device i: pool file i's directory
  std::vector<server::DeviceHealth> nvme_health;     // as `tuttictl devices --report` sent it
  io::BackendChoice io_backend;                      // the I/O backend start-up chose
};

// The families of `s`, always the same ones in the same order. A family labelled by namespace or
// device has one sample per namespace or device (none when there are none); every other family
// has its samples always. Label values are as given (the serializer escapes them). Pure: safe
// from any thread.
std::vector<prometheus::MetricFamily> BuildFamilies(const MetricsSnapshot& s);

}  // namespace tutti::metrics

#endif  // TUTTI_DAEMON_METRICS_FAMILIES_H_

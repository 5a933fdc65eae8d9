// The daemon's figures as Prometheus metric families (names tutti_*, each with HELP): the stats
// registry's families (common/stats.h), collected at scrape time, where each component registers
// what it counts; nothing on the I/O path is counted twice. docs/metrics.md lists the names.
#ifndef TUTTI_DAEMON_METRICS_FAMILIES_H_
#define TUTTI_DAEMON_METRICS_FAMILIES_H_

#include <string>
#include <vector>

#include "common/stats.h"
#include "daemon/io/backend_choice.h"
#include "prometheus/metric_family.h"

namespace tutti::metrics {

// `families` as Prometheus families, in the same order: label names paired with each sample's
// values (the serializer escapes them), a histogram's buckets as they are. Pure: safe from any
// thread.
std::vector<prometheus::MetricFamily> ToPrometheus(const std::vector<stats::Family>& families);

// The facts start-up chose, as info families (value 1): tutti_pool_device_info, one sample per
// pool device (its index and `pool_dirs[i]`), and tutti_io_backend_info (the backend running,
// the one configured, and the reason they differ: "" when they do not).
void RegisterStartupInfo(std::vector<std::string> pool_dirs, io::BackendChoice io_backend,
                         stats::Registry* registry);

}  // namespace tutti::metrics

#endif  // TUTTI_DAEMON_METRICS_FAMILIES_H_

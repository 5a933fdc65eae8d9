#include "daemon/metrics/families.h"

#include <utility>

namespace tutti::metrics {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricType TypeOf(stats::Type t) {
  switch (t) {
    case stats::Type::kCounter:
      return MetricType::Counter;
    case stats::Type::kHistogram:
      return MetricType::Histogram;
    case stats::Type::kGauge:
      break;
  }
  return MetricType::Gauge;
}

ClientMetric ToMetric(const stats::Spec& spec, const stats::Sample& s) {
  ClientMetric m;
  for (size_t i = 0; i < spec.labels.size() && i < s.labels.size(); ++i) {
    m.label.push_back({spec.labels[i], s.labels[i]});
  }
  switch (spec.type) {
    case stats::Type::kCounter:
      m.counter.value = s.value;
      break;
    case stats::Type::kGauge:
      m.gauge.value = s.value;
      break;
    case stats::Type::kHistogram:
      for (size_t i = 0; i < s.histogram.upper_bounds.size(); ++i) {
        m.histogram.bucket.push_back({s.histogram.cumulative[i], s.histogram.upper_bounds[i]});
      }
      m.histogram.sample_count = s.histogram.count;  // the +Inf bucket, added by the serializer
      m.histogram.sample_sum = s.histogram.sum;
      break;
  }
  return m;
}

}  // namespace

std::vector<MetricFamily> ToPrometheus(const std::vector<stats::Family>& families) {
  std::vector<MetricFamily> out;
  out.reserve(families.size());
  for (const stats::Family& f : families) {
    MetricFamily mf{f.spec.name, f.spec.help, TypeOf(f.spec.type), {}};
    for (const stats::Sample& s : f.samples) mf.metric.push_back(ToMetric(f.spec, s));
    out.push_back(std::move(mf));
  }
  return out;
}

void RegisterStartupInfo(std::vector<std::string> pool_dirs, io::BackendChoice io_backend,
                         stats::Registry* registry) {
  registry->AddGroup<int>([] { return 0; })
      .Add({"tutti_pool_device_info", "1 per pool device: its index and directory.",
            stats::Type::kGauge, {"device", "dir"}},
           [dirs = std::move(pool_dirs)](int, stats::Samples* out) {
             for (size_t d = 0; d < dirs.size(); ++d) out->Add({std::to_string(d), dirs[d]}, 1);
           })
      .Add({"tutti_io_backend_info", "1, labelled with the I/O backend running, the one "
            "io.backend asked for, and why they differ (empty when they do not: no fallback).",
            stats::Type::kGauge, {"backend", "requested", "reason"}},
           [c = std::move(io_backend)](int, stats::Samples* out) {
             out->Add({c.backend, c.requested, c.reason}, 1);
           });
}

}  // namespace tutti::metrics

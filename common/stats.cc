#include "common/stats.h"

namespace tutti::stats {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string UnitOf(const std::string& name) {
  std::string base = name;
  if (EndsWith(base, "_total")) base.resize(base.size() - 6);
  for (const char* unit : {"bytes_per_second", "seconds", "bytes", "ratio", "celsius"}) {
    if (EndsWith(base, std::string("_") + unit)) return unit;
  }
  return "";
}

void Samples::Add(std::vector<std::string> labels, double value, std::string field) {
  Sample s;
  s.labels = std::move(labels);
  s.value = value;
  s.field = std::move(field);
  f_->samples.push_back(std::move(s));
}

void Samples::AddHistogram(std::vector<std::string> labels, Histogram h) {
  Sample s;
  s.labels = std::move(labels);
  s.histogram = std::move(h);
  f_->samples.push_back(std::move(s));
}

std::vector<Family> Registry::Collect(bool per_tenant) const {
  std::vector<Family> out;
  absl::ReaderMutexLock lock(&mu_);
  for (const Collector& c : collectors_) c(per_tenant, &out);
  return out;
}

}  // namespace tutti::stats

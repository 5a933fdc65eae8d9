// The stats registry: one list of the daemon's figures. A component registers its typed counters,
// gauges and histograms once (name, help, labels; the unit is the name's suffix, as Prometheus
// names carry it), with how to read them from one snapshot of its own; the Prometheus endpoint
// (daemon/metrics), Admin.Stats and so `tuttictl stats` read every figure from here. Adding a
// figure is one registration in the component that counts it.
//
//   stats::Group<StoreStats>& g = registry->AddGroup<StoreStats>([store] { return store->Stats(); });
//   g.Counter("tutti_evictions_total", "Blocks evicted.", [](const StoreStats& s) {
//     return s.evictions; }, "evictions");
//   g.Add({"tutti_errors_total", "Failures by kind.", stats::Type::kCounter, {"kind"}},
//         [](const StoreStats& s, stats::Samples* out) {
//           out->Add({"verify"}, s.verify_errors, "verify_errors");
//           out->Add({"io"}, s.io_errors, "io_errors");
//         });
//
// A collection takes each group's snapshot once and reads all its families from it, so the
// figures of one group agree with each other; nothing is counted on any I/O path for it.
//
// Fields: a family or one of its samples may name the field of Admin.Stats (tutti.v1
// StatsResponse, StatusResponse) that carries it, for the operator API's named fields; a family's
// field carries the sum of its samples (times Spec::field_scale). Figures without a field still
// reach Admin.Stats, in its list of every figure.
//
// Thread-safety: every method is thread-safe. Collect calls the snapshot functions with the
// registry's lock held (as reader): they must not register anything.
#ifndef TUTTI_COMMON_STATS_H_
#define TUTTI_COMMON_STATS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tutti::stats {

enum class Type { kCounter, kGauge, kHistogram };

// What a family is, fixed at registration.
struct Spec {
  std::string name;  // tutti_*; a counter's ends in _total, no other type's does
  std::string help;  // one sentence or more, never empty
  Type type = Type::kGauge;
  std::vector<std::string> labels;  // label names, in the order samples give their values
  // The Admin.Stats field carrying the sum of the family's samples times field_scale ("": none).
  std::string field;
  double field_scale = 1;
  // The labels name tenants (namespaces, models): samples shown only where the operator allows
  // it (metrics.namespace_labels on /metrics; always to the admin socket's users).
  bool per_tenant = false;
};

// A histogram's sample: counts of observations at most each upper bound, cumulative; `count`
// is every observation (the +Inf bucket), `sum` their sum.
struct Histogram {
  std::vector<double> upper_bounds;
  std::vector<uint64_t> cumulative;
  uint64_t count = 0;
  double sum = 0;
};

struct Sample {
  std::vector<std::string> labels;  // values, one per Spec::labels
  double value = 0;                 // a counter's or gauge's
  Histogram histogram;              // a histogram's
  std::string field;                // the Admin.Stats field carrying this sample's value alone
};

struct Family {
  Spec spec;
  std::vector<Sample> samples;
};

// The unit a family's name ends in ("seconds", "bytes", "ratio", "celsius", before a counter's
// "_total"; "bytes_per_second" as one), or "" for counts.
std::string UnitOf(const std::string& name);

// Where a family's reader puts its samples.
class Samples {
 public:
  explicit Samples(Family* f) : f_(f) {}
  void Add(std::vector<std::string> labels, double value, std::string field = "");
  void Add(double value, std::string field = "") { Add({}, value, std::move(field)); }
  void AddHistogram(std::vector<std::string> labels, Histogram h);

 private:
  Family* f_;
};

class Registry;

// Families read from one snapshot of type T (see the header comment). Owned by its registry.
template <typename T>
class Group {
 public:
  using Read = std::function<void(const T&, Samples*)>;
  using Value = std::function<double(const T&)>;

  // A family whose samples `read` adds from each snapshot. A per-entity family (one sample per
  // namespace, device, ...) may add none.
  Group& Add(Spec spec, Read read);
  // One unlabelled counter or gauge, and its Admin.Stats field ("": none).
  Group& Counter(std::string name, std::string help, Value value, std::string field = "") {
    return Single(Type::kCounter, std::move(name), std::move(help), std::move(value),
                  std::move(field));
  }
  Group& Gauge(std::string name, std::string help, Value value, std::string field = "") {
    return Single(Type::kGauge, std::move(name), std::move(help), std::move(value),
                  std::move(field));
  }

 private:
  friend class Registry;
  struct Entry {
    Spec spec;
    Read read;
  };
  Group(absl::Mutex* mu, std::function<T()> snapshot) : mu_(mu), snapshot_(std::move(snapshot)) {}
  Group& Single(Type type, std::string name, std::string help, Value value, std::string field) {
    return Add(Spec{std::move(name), std::move(help), type, {}, std::move(field)},
               [value = std::move(value)](const T& s, Samples* out) { out->Add(value(s)); });
  }
  // With the registry's lock held.
  void CollectInto(bool per_tenant, std::vector<Family>* out) const;

  absl::Mutex* const mu_;  // the registry's: guards entries_
  const std::function<T()> snapshot_;
  std::vector<Entry> entries_;
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // A group reading `snapshot` once per collection; stable for the registry's life.
  template <typename T>
  Group<T>& AddGroup(std::function<T()> snapshot) ABSL_LOCKS_EXCLUDED(mu_);

  // Every family in registration order (groups in the order added, families within one likewise),
  // each with the samples its reader gave; without `per_tenant`, per-tenant families have none.
  std::vector<Family> Collect(bool per_tenant = true) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Collector = std::function<void(bool, std::vector<Family>*)>;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<void>> groups_ ABSL_GUARDED_BY(mu_);  // owns the Group<T>s
  std::vector<Collector> collectors_ ABSL_GUARDED_BY(mu_);
};

// --- Implementation ---

template <typename T>
Group<T>& Group<T>::Add(Spec spec, Read read) {
  absl::MutexLock lock(mu_);
  entries_.push_back(Entry{std::move(spec), std::move(read)});
  return *this;
}

template <typename T>
void Group<T>::CollectInto(bool per_tenant, std::vector<Family>* out) const {
  if (entries_.empty()) return;
  const T snapshot = snapshot_();
  for (const Entry& e : entries_) {
    out->push_back(Family{e.spec, {}});
    if (e.spec.per_tenant && !per_tenant) continue;
    Samples samples(&out->back());
    e.read(snapshot, &samples);
  }
}

template <typename T>
Group<T>& Registry::AddGroup(std::function<T()> snapshot) {
  std::shared_ptr<Group<T>> g(new Group<T>(&mu_, std::move(snapshot)));
  Group<T>* raw = g.get();
  absl::MutexLock lock(&mu_);
  groups_.push_back(std::move(g));
  collectors_.push_back([raw](bool per_tenant, std::vector<Family>* out) {
    raw->CollectInto(per_tenant, out);
  });
  return *raw;
}

}  // namespace tutti::stats

#endif  // TUTTI_COMMON_STATS_H_

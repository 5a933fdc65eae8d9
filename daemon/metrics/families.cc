#include "daemon/metrics/families.h"

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <utility>

#include "daemon/datapath/scheduler.h"

namespace tutti::metrics {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::initializer_list<std::pair<const char*, std::string>>;

// Appends families and their samples; a counter's or gauge's value goes where its type reads it.
class Builder {
 public:
  Builder& Family(const char* name, const char* help, MetricType type) {
    out_.push_back(MetricFamily{name, help, type, {}});
    return *this;
  }
  Builder& Sample(double value, Labels labels = {}) {
    ClientMetric m;
    for (const auto& [k, v] : labels) m.label.push_back({k, v});
    if (out_.back().type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
    out_.back().metric.push_back(std::move(m));
    return *this;
  }
  Builder& Counter(const char* name, const char* help, double value) {
    return Family(name, help, MetricType::Counter).Sample(value);
  }
  Builder& Gauge(const char* name, const char* help, double value) {
    return Family(name, help, MetricType::Gauge).Sample(value);
  }
  void AddHistogram(const datapath::LatencyHistogram& h, Labels labels) {
    ClientMetric m;
    for (const auto& [k, v] : labels) m.label.push_back({k, v});
    uint64_t cumulative = 0;
    for (size_t i = 0; i < datapath::kLatencyBoundsUs.size(); ++i) {
      cumulative += h.counts[i];
      m.histogram.bucket.push_back({cumulative, datapath::kLatencyBoundsUs[i] * 1e-6});
    }
    m.histogram.sample_count = h.count;  // the +Inf bucket, added by the serializer
    m.histogram.sample_sum = static_cast<double>(h.sum_us) * 1e-6;
    out_.back().metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> Take() { return std::move(out_); }

 private:
  std::vector<MetricFamily> out_;
};

constexpr MetricType kCounter = MetricType::Counter;
constexpr MetricType kGauge = MetricType::Gauge;

// "%016x" of a namespace id, as tuttictl prints it.
std::string NamespaceLabel(NamespaceId id) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(id));
  return hex;
}

// tutti_lookup_hits_total and the others split by namespace (sums equal the totals).
void AddNamespaceCounters(const store::StoreStats& st, Builder* b) {
  b->Family("tutti_namespace_lookup_hits_total", "Blocks found by Lookups, by namespace.",
            kCounter);
  for (const store::NamespaceInfo& ns : st.namespaces) {
    b->Sample(ns.lookup_hits,
              {{"namespace", NamespaceLabel(ns.id)}, {"model", ns.descriptor.model_id()}});
  }
  b->Family("tutti_namespace_lookup_misses_total", "Lookups whose chain stopped short, by "
            "namespace.", kCounter);
  for (const store::NamespaceInfo& ns : st.namespaces) {
    b->Sample(ns.lookup_misses,
              {{"namespace", NamespaceLabel(ns.id)}, {"model", ns.descriptor.model_id()}});
  }
  b->Family("tutti_namespace_retrieved_blocks_total", "Blocks retrieved into engine memory, by "
            "namespace and the tier they were read from.", kCounter);
  for (const store::NamespaceInfo& ns : st.namespaces) {
    const std::string id = NamespaceLabel(ns.id);
    const std::string& model = ns.descriptor.model_id();
    b->Sample(ns.dram_hits, {{"namespace", id}, {"model", model}, {"tier", "dram"}});
    b->Sample(ns.blocks_retrieved - std::min(ns.dram_hits, ns.blocks_retrieved),
              {{"namespace", id}, {"model", model}, {"tier", "ssd"}});
  }
}

void AddLookupsAndHits(const store::StoreStats& st, Builder* b) {
  b->Counter("tutti_lookups_total", "Lookups answered.", st.lookups);
  b->Counter("tutti_lookup_blocks_total", "Blocks Lookups asked for (every key of each chain).",
             st.lookup_blocks);
  b->Counter("tutti_lookup_hits_total", "Blocks found by Lookups (leading hits of each chain).",
             st.lookup_hits);
  b->Counter("tutti_lookup_misses_total", "Lookups whose chain stopped short of its last key.",
             st.lookup_misses);
  b->Family("tutti_retrieved_blocks_total", "Blocks retrieved into engine memory, by the tier "
            "they were read from.", kCounter)
      .Sample(st.dram_hits, {{"tier", "dram"}})
      .Sample(st.blocks_retrieved - std::min(st.dram_hits, st.blocks_retrieved),
              {{"tier", "ssd"}});
  b->Family("tutti_namespace_blocks", "Blocks held now, by namespace (id, model) and tier (ssd: "
            "durable in the pool; dram: also in the DRAM tier).", kGauge);
  for (const store::NamespaceInfo& ns : st.namespaces) {
    const std::string id = NamespaceLabel(ns.id);
    const std::string& model = ns.descriptor.model_id();
    b->Sample(ns.blocks, {{"namespace", id}, {"model", model}, {"tier", "ssd"}});
    b->Sample(ns.blocks_dram, {{"namespace", id}, {"model", model}, {"tier", "dram"}});
  }
  AddNamespaceCounters(st, b);
}

void AddTraffic(const store::StoreStats& st, Builder* b) {
  b->Family("tutti_bytes_total", "Block bytes moved: read (into engine memory, every tier) and "
            "written (to the pool).", kCounter)
      .Sample(st.bytes_read, {{"direction", "read"}})
      .Sample(st.bytes_written, {{"direction", "write"}});
  b->Counter("tutti_stored_blocks_total", "Blocks made durable in the pool.", st.blocks_stored);
  const datapath::IoSchedulerStats& io = st.io;
  b->Family("tutti_io_requests_total", "Pool I/O requests handed to the backend, by op.", kCounter)
      .Sample(io.reads_emitted, {{"op", "read"}})
      .Sample(io.writes_emitted, {{"op", "write"}});
  b->Family("tutti_io_bytes_total", "Bytes of the pool I/O requests handed to the backend, by op.",
            kCounter)
      .Sample(io.read_bytes, {{"op", "read"}})
      .Sample(io.write_bytes, {{"op", "write"}});
  b->Counter("tutti_read_objects_total", "Objects carried by pool reads (divided by "
             "tutti_io_requests_total{op=\"read\"}: objects merged per read).", st.read_objects);
  b->Counter("tutti_read_merged_ios_total", "Pool reads that carried more than one object.",
             st.read_merged_ios);
  b->Counter("tutti_read_staging_waits_total", "Reads that waited for retrieve staging.",
             st.read_staging_waits);
  b->Family("tutti_read_lead_seconds_total",
            "Time the threads leading Retrieves' SSD-tier reads spent per layer, by phase: "
            "planning and posting its reads, waiting for its reads and checks, or handing it "
            "to the engine.", kCounter)
      .Sample(st.read_lead_wait_seconds, {{"phase", "wait"}})
      .Sample(st.read_lead_sink_seconds, {{"phase", "sink"}})
      .Sample(st.read_lead_post_seconds, {{"phase", "post"}});
  b->Counter("tutti_read_layers_total", "SSD-tier layers handed to engines.", st.read_layers);
}

void AddQueues(const store::StoreStats& st, const MetricsSnapshot& s, Builder* b) {
  const datapath::IoSchedulerStats& io = st.io;
  b->Gauge("tutti_io_writes_queued", "Pool writes waiting in the I/O scheduler now.",
           io.writes_queued);
  b->Gauge("tutti_io_write_bytes_queued", "Bytes of the pool writes waiting now.",
           io.write_bytes_queued);
  b->Counter("tutti_io_write_wait_seconds_total", "Time pool writes waited in the scheduler "
             "before emission, summed.", io.write_wait_ms * 1e-3);
  b->Family("tutti_io_reads_in_flight", "Pool reads emitted and not completed, by device (pool "
            "file index; see tutti_pool_device_info).", kGauge);
  for (size_t d = 0; d < io.devices.size(); ++d) {
    b->Sample(io.devices[d].reads_in_flight, {{"device", std::to_string(d)}});
  }
  b->Family("tutti_io_write_bytes_in_flight", "Bytes of pool writes emitted and not completed, "
            "by device.", kGauge);
  for (size_t d = 0; d < io.devices.size(); ++d) {
    b->Sample(io.devices[d].write_bytes_in_flight, {{"device", std::to_string(d)}});
  }
  b->Family("tutti_io_write_window_bytes", "The cap on pool writes in flight while the device "
            "reads nothing, adapted to datapath.write_latency_target_ms, by device.", kGauge);
  for (size_t d = 0; d < io.devices.size(); ++d) {
    b->Sample(io.devices[d].write_window, {{"device", std::to_string(d)}});
  }
  b->Family("tutti_io_write_window_cuts_total", "Times writes completing later than "
            "datapath.write_latency_target_ms halved a device's write window, by device.",
            kCounter);
  for (size_t d = 0; d < io.devices.size(); ++d) {
    b->Sample(io.devices[d].write_window_cuts, {{"device", std::to_string(d)}});
  }
  b->Family("tutti_io_latency_seconds", "Completion latency of pool I/O requests, from their "
            "emission to the backend until it completed them, by device and op.",
            MetricType::Histogram);
  for (size_t d = 0; d < io.devices.size(); ++d) {
    b->AddHistogram(io.devices[d].read_latency, {{"device", std::to_string(d)}, {"op", "read"}});
    b->AddHistogram(io.devices[d].write_latency,
                    {{"device", std::to_string(d)}, {"op", "write"}});
  }
  b->Family("tutti_pool_device_info", "1 per pool device: its index and directory.", kGauge);
  for (size_t d = 0; d < s.pool_dirs.size(); ++d) {
    b->Sample(1, {{"device", std::to_string(d)}, {"dir", s.pool_dirs[d]}});
  }
}

// tutti_io_backend_info: one sample, 1, naming the backend running, the one configured, and the
// reason they differ ("" when they do not).
void AddIoBackend(const io::BackendChoice& c, Builder* b) {
  b->Family("tutti_io_backend_info", "1, labelled with the I/O backend running, the one io.backend "
            "asked for, and why they differ (empty when they do not: no fallback).", kGauge)
      .Sample(1, {{"backend", c.backend}, {"requested", c.requested}, {"reason", c.reason}});
}

void AddErrors(const store::StoreStats& st, Builder* b) {
  b->Family("tutti_errors_total", "Failures by kind: verify (checksum or header mismatch, served "
            "as a miss), io (failed or short pool I/O), store_failed (blocks that could not be made "
            "durable), checkpoint (failed checkpoint attempts).", kCounter)
      .Sample(st.verify_errors, {{"kind", "verify"}})
      .Sample(st.io_errors, {{"kind", "io"}})
      .Sample(st.store_failed, {{"kind", "store_failed"}})
      .Sample(st.checkpoint_failures, {{"kind", "checkpoint"}});
  const uint64_t capped = st.store_rejected_owner_limit + st.store_rejected_backlog;
  b->Family("tutti_store_rejected_total", "Blocks a Store refused, by reason: staging_full, "
            "owner_limit (the session's share of staging), backlog (the write backlog's bounds).",
            kCounter)
      .Sample(st.store_rejected - std::min(capped, st.store_rejected),
              {{"reason", "staging_full"}})
      .Sample(st.store_rejected_owner_limit, {{"reason", "owner_limit"}})
      .Sample(st.store_rejected_backlog, {{"reason", "backlog"}});
  b->Family("tutti_admission_blocks_total", "New blocks of Stores judged by the admission "
            "policy (pool.admission), by decision: admitted (written to the pool) or declined "
            "(dropped, STORE_DECLINED).", kCounter)
      .Sample(st.blocks_admitted, {{"decision", "admitted"}})
      .Sample(st.blocks_declined, {{"decision", "declined"}});
  b->Family("tutti_dram_front_blocks_total", "pool.admission \"dram_front\": blocks kept in the "
            "DRAM front at their first sight (kept), written to the pool at their second sight "
            "(promoted), dropped from DRAM before one (dropped), and Lookup hits whose promotion "
            "waited for store staging (deferred).", kCounter)
      .Sample(st.front_kept, {{"event", "kept"}})
      .Sample(st.front_promoted, {{"event", "promoted"}})
      .Sample(st.front_dropped, {{"event", "dropped"}})
      .Sample(st.front_promotions_deferred, {{"event", "deferred"}});
  b->Gauge("tutti_dram_front_blocks", "pool.admission \"dram_front\": blocks in the DRAM front "
           "now (kept, or being written to the pool).", static_cast<double>(st.front_blocks));
  b->Family("tutti_partial_blocks_dropped_total", "Partially captured blocks dropped: expired "
            "(limits.partial_store_ttl_ms) or abandoned (owner gone or its copy failed).", kCounter)
      .Sample(st.pending_expired, {{"reason", "expired"}})
      .Sample(st.pending_dropped, {{"reason", "abandoned"}});
  b->Gauge("tutti_durability_lost", "1 once the journal or state directory was removed or "
           "replaced: nothing is durable until restart.", st.durability_lost ? 1 : 0);
  b->Gauge("tutti_unindexed_slot_headers", "Used slot headers found at start that the index "
           "cannot find (state directory lost).", st.unindexed_slot_headers);
}

void AddCapacity(const store::StoreStats& st, Builder* b) {
  b->Gauge("tutti_pool_slots", "Slots in the pool (one block each).", st.slots_total);
  b->Gauge("tutti_pool_slots_used", "Slots holding a block or being written.", st.slots_used);
  b->Gauge("tutti_pool_capacity_bytes", "Bytes of all slots.", st.slots_total * st.slot_bytes);
  b->Gauge("tutti_pool_used_bytes", "Bytes of the used slots.", st.slots_used * st.slot_bytes);
  b->Gauge("tutti_dram_capacity_bytes", "Bytes of the DRAM tier (0: off).", st.dram_capacity);
  b->Gauge("tutti_dram_used_bytes", "Bytes of the DRAM tier in use.", st.dram_used);
  b->Gauge("tutti_store_staging_bytes", "Bytes of store staging.", st.store_staging_bytes);
  b->Gauge("tutti_store_staging_used_bytes", "Bytes of store staging in use.",
           st.store_staging_used);
  b->Counter("tutti_evictions_total", "Blocks evicted from the pool to make room.", st.evictions);
  b->Gauge("tutti_write_backlog_bytes", "Staging bytes of blocks captured and not yet durable.",
           st.write_backlog_bytes);
  b->Gauge("tutti_write_backlog_blocks", "Blocks captured and not yet durable.",
           st.write_backlog_blocks);
  b->Gauge("tutti_write_backlog_age_seconds", "How long the oldest block of the write backlog "
           "has waited (0: empty).", st.write_backlog_age_ms * 1e-3);
}

void AddServing(const MetricsSnapshot& s, Builder* b) {
  b->Gauge("tutti_sessions", "Engine sessions attached.", s.sessions);
  b->Gauge("tutti_handoffs_outstanding", "Credentials handed out and not yet attached.",
           s.handoffs_outstanding);
  using datapath::Tier;
  b->Family("tutti_read_bandwidth_bytes_per_second", "Read bandwidth estimate per tier (the "
            "configured prior until reads have measured it).", kGauge);
  for (Tier t : {Tier::kDram, Tier::kSsd}) {
    b->Sample(s.read_bandwidth[static_cast<int>(t)].bytes_per_sec, {{"tier", TierName(t)}});
  }
  b->Family("tutti_read_bandwidth_samples_total", "Reads measured into the bandwidth estimate, "
            "per tier.", kCounter);
  for (Tier t : {Tier::kDram, Tier::kSsd}) {
    b->Sample(s.read_bandwidth[static_cast<int>(t)].samples, {{"tier", TierName(t)}});
  }
}

// The load-or-recompute advisor (docs/decision.md); absent without one: zeros.
void AddDecisions(const MetricsSnapshot& s, Builder* b) {
  const decision::AdvisorStats d = s.decisions.value_or(decision::AdvisorStats{});
  b->Counter("tutti_decisions_total", "Load-or-recompute advice given with a prediction.",
             d.decisions);
  b->Counter("tutti_decision_predictions_checked_total", "Measured TTFTs compared with their "
             "prediction.", d.prediction_errors);
  b->Gauge("tutti_decision_prediction_error_mean", "Mean relative error of the predicted TTFT.",
           d.prediction_error_mean);
  b->Gauge("tutti_decision_prediction_error_last", "Relative error of the last predicted TTFT "
           "checked.", d.prediction_error_last);
  b->Counter("tutti_decision_corrections_total", "Measured TTFTs far enough off their prediction "
             "to correct the model at once.", d.corrections);
  b->Family("tutti_decision_refused_loads_total", "Advice where loading won centrally but not "
            "beyond the prediction's uncertainty: recomputed, or loaded anyway to explore.",
            kCounter)
      .Sample(d.refused_loads, {{"advised", "recompute"}})
      .Sample(d.explorations, {{"advised", "explore"}});
}

// cuda mode's layer copier; zeros in host mode.
void AddGpu(const MetricsSnapshot& s, Builder* b) {
  const server::GpuLayerCounts g = s.gpu_layers.value_or(server::GpuLayerCounts{});
  b->Family("tutti_gpu_layers_total", "Layers placed into engines' GPU blocks (retrieves), by "
            "how: copy_engine (the copy engines alone) or kernel (a scatter kernel).", kCounter)
      .Sample(g.by_copy_engine, {{"path", "copy_engine"}})
      .Sample(g.layers - std::min(g.by_copy_engine, g.layers), {{"path", "kernel"}});
  b->Family("tutti_gpu_gathers_total", "Layers gathered from engines' GPU blocks (stores), by "
            "how.", kCounter)
      .Sample(g.gathers_by_copy_engine, {{"path", "copy_engine"}})
      .Sample(g.gathers - std::min(g.gathers_by_copy_engine, g.gathers), {{"path", "kernel"}});
}

// NVMe health as last reported by `tuttictl devices --report` (tuttid cannot read SMART logs
// unprivileged); no samples until a report came.
void AddNvmeHealth(const MetricsSnapshot& s, Builder* b) {
  struct Field {
    const char* name;
    const char* help;
    double (*value)(const server::DeviceHealth&);
  };
  static const Field kFields[] = {
      {"tutti_nvme_critical_warning", "The SMART critical-warning bit field of a pool device "
       "(0: none), as last reported by tuttictl devices --report.",
       [](const server::DeviceHealth& d) { return double(d.critical_warning); }},
      {"tutti_nvme_temperature_celsius", "Composite temperature of a pool device.",
       [](const server::DeviceHealth& d) { return double(d.temperature_c); }},
      {"tutti_nvme_available_spare_ratio", "Available spare capacity of a pool device (0..1).",
       [](const server::DeviceHealth& d) { return d.available_spare_pct / 100.0; }},
      {"tutti_nvme_endurance_used_ratio", "Share of its rated endurance a pool device has used "
       "(may pass 1).", [](const server::DeviceHealth& d) { return d.percentage_used / 100.0; }},
      {"tutti_nvme_media_errors", "Media and data integrity errors a pool device has counted.",
       [](const server::DeviceHealth& d) { return double(d.media_errors); }},
  };
  for (const Field& f : kFields) {
    b->Family(f.name, f.help, MetricType::Gauge);
    for (const server::DeviceHealth& d : s.nvme_health) {
      b->Sample(f.value(d), {{"device", d.device}, {"serial", d.serial}, {"model", d.model}});
    }
  }
}

}  // namespace

std::vector<MetricFamily> BuildFamilies(const MetricsSnapshot& s) {
  Builder b;
  AddLookupsAndHits(s.store, &b);
  AddTraffic(s.store, &b);
  AddQueues(s.store, s, &b);
  AddIoBackend(s.io_backend, &b);
  AddErrors(s.store, &b);
  AddCapacity(s.store, &b);
  AddServing(s, &b);
  AddDecisions(s, &b);
  AddGpu(s, &b);
  AddNvmeHealth(s, &b);
  return b.Take();
}

}  // namespace tutti::metrics

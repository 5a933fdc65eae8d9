#include "daemon/store/store_stats.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "daemon/datapath/scheduler.h"

namespace tutti::store {
namespace {

using stats::Samples;
using stats::Spec;
using stats::Type;
using Group = stats::Group<StoreStats>;

constexpr Type kCounter = Type::kCounter;
constexpr Type kGauge = Type::kGauge;

// "%016x" of a namespace id, as tuttictl prints it.
std::string NamespaceLabel(NamespaceId id) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(id));
  return hex;
}

// A per-namespace family: labels namespace, model, then `more`.
Spec PerNamespace(const char* name, const char* help, Type type,
                  std::vector<std::string> more = {}) {
  Spec s{name, help, type, {"namespace", "model"}};
  s.labels.insert(s.labels.end(), more.begin(), more.end());
  s.per_tenant = true;
  return s;
}

// tutti_lookup_hits_total and the others split by namespace (sums equal the totals).
void AddNamespaceCounters(Group* g) {
  g->Add(PerNamespace("tutti_namespace_lookup_hits_total",
                      "Blocks found by Lookups, by namespace.", kCounter),
         [](const StoreStats& st, Samples* out) {
           for (const NamespaceInfo& ns : st.namespaces) {
             out->Add({NamespaceLabel(ns.id), ns.descriptor.model_id()}, ns.lookup_hits);
           }
         });
  g->Add(PerNamespace("tutti_namespace_lookup_misses_total",
                      "Lookups whose chain stopped short, by namespace.", kCounter),
         [](const StoreStats& st, Samples* out) {
           for (const NamespaceInfo& ns : st.namespaces) {
             out->Add({NamespaceLabel(ns.id), ns.descriptor.model_id()}, ns.lookup_misses);
           }
         });
  g->Add(PerNamespace("tutti_namespace_retrieved_blocks_total", "Blocks retrieved into engine "
                      "memory, by namespace and the tier they were read from.", kCounter, {"tier"}),
         [](const StoreStats& st, Samples* out) {
           for (const NamespaceInfo& ns : st.namespaces) {
             const std::string id = NamespaceLabel(ns.id);
             const std::string& model = ns.descriptor.model_id();
             out->Add({id, model, "dram"}, ns.dram_hits);
             out->Add({id, model, "ssd"},
                      ns.blocks_retrieved - std::min(ns.dram_hits, ns.blocks_retrieved));
           }
         });
}

void AddLookupsAndHits(Group* g) {
  g->Counter("tutti_lookups_total", "Lookups answered.",
             [](const StoreStats& st) { return st.lookups; }, "lookups");
  g->Counter("tutti_lookup_blocks_total", "Blocks Lookups asked for (every key of each chain).",
             [](const StoreStats& st) { return st.lookup_blocks; });
  g->Counter("tutti_lookup_hits_total", "Blocks found by Lookups (leading hits of each chain).",
             [](const StoreStats& st) { return st.lookup_hits; }, "lookup_hits");
  g->Counter("tutti_lookup_misses_total", "Lookups whose chain stopped short of its last key.",
             [](const StoreStats& st) { return st.lookup_misses; }, "lookup_misses");
  g->Add({"tutti_retrieved_blocks_total", "Blocks retrieved into engine memory, by the tier "
          "they were read from.", kCounter, {"tier"}, "blocks_retrieved"},
         [](const StoreStats& st, Samples* out) {
           out->Add({"dram"}, st.dram_hits, "dram_hits");
           out->Add({"ssd"}, st.blocks_retrieved - std::min(st.dram_hits, st.blocks_retrieved));
         });
  g->Add(PerNamespace("tutti_namespace_blocks", "Blocks held now, by namespace (id, model) and "
                      "tier (ssd: durable in the pool; dram: also in the DRAM tier).", kGauge,
                      {"tier"}),
         [](const StoreStats& st, Samples* out) {
           for (const NamespaceInfo& ns : st.namespaces) {
             const std::string id = NamespaceLabel(ns.id);
             const std::string& model = ns.descriptor.model_id();
             out->Add({id, model, "ssd"}, ns.blocks);
             out->Add({id, model, "dram"}, ns.blocks_dram);
           }
         });
  AddNamespaceCounters(g);
}

void AddTraffic(Group* g) {
  g->Add({"tutti_bytes_total", "Block bytes moved: read (into engine memory, every tier) and "
          "written (to the pool).", kCounter, {"direction"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"read"}, st.bytes_read, "bytes_read");
           out->Add({"write"}, st.bytes_written, "bytes_written");
         });
  g->Counter("tutti_stored_blocks_total", "Blocks made durable in the pool.",
             [](const StoreStats& st) { return st.blocks_stored; }, "blocks_stored");
  g->Add({"tutti_io_requests_total", "Pool I/O requests handed to the backend, by op.", kCounter,
          {"op"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"read"}, st.io.reads_emitted);
           out->Add({"write"}, st.io.writes_emitted);
         });
  g->Add({"tutti_io_bytes_total", "Bytes of the pool I/O requests handed to the backend, by op.",
          kCounter, {"op"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"read"}, st.io.read_bytes);
           out->Add({"write"}, st.io.write_bytes);
         });
  g->Add({"tutti_io_device_bytes_total", "Bytes of the pool I/O requests handed to the backend, "
          "by device (pool file index; see tutti_pool_device_info) and op: an array's balance, "
          "and a device that falls behind the others.", kCounter, {"device", "op"}},
         [](const StoreStats& st, Samples* out) {
           for (size_t d = 0; d < st.io.devices.size(); ++d) {
             out->Add({std::to_string(d), "read"}, st.io.devices[d].read_bytes);
             out->Add({std::to_string(d), "write"}, st.io.devices[d].write_bytes);
           }
         });
  g->Counter("tutti_read_objects_total", "Objects carried by pool reads (divided by "
             "tutti_io_requests_total{op=\"read\"}: objects merged per read).",
             [](const StoreStats& st) { return st.read_objects; });
  g->Counter("tutti_read_merged_ios_total", "Pool reads that carried more than one object.",
             [](const StoreStats& st) { return st.read_merged_ios; });
  g->Counter("tutti_read_staging_waits_total", "Reads that waited for retrieve staging.",
             [](const StoreStats& st) { return st.read_staging_waits; });
  g->Counter("tutti_read_staging_yields_total",
             "Retrieve staging leases a read gave back "
             "before its end, another read waiting for staging.",
             [](const StoreStats& st) { return st.read_staging_yields; });
  g->Add({"tutti_read_lead_seconds_total",
          "Time the threads leading Retrieves' SSD-tier reads spent per layer, by phase: "
          "planning and posting its reads, waiting for its reads and checks, or handing it "
          "to the engine.", kCounter, {"phase"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"wait"}, st.read_lead_wait_seconds, "read_lead_wait_seconds");
           out->Add({"sink"}, st.read_lead_sink_seconds, "read_lead_sink_seconds");
           out->Add({"post"}, st.read_lead_post_seconds, "read_lead_post_seconds");
         });
  g->Counter("tutti_read_layers_total", "SSD-tier layers handed to engines.",
             [](const StoreStats& st) { return st.read_layers; }, "read_layers");
  g->Counter("tutti_read_calls_total", "Retrieves' layer-wise reads of the SSD tier.",
             [](const StoreStats& st) { return st.read_calls; }, "read_calls");
  g->Counter("tutti_read_call_seconds_total", "Time Retrieves' layer-wise reads took, from "
             "staging taken to their end, summed.",
             [](const StoreStats& st) { return st.read_call_seconds; }, "read_call_seconds");
  g->Counter(
      "tutti_read_batches_total",
      "Batches of Retrieves' SSD-tier reads (one device "
      "each, up to datapath.read_post_bytes).",
      [](const StoreStats& st) { return st.read_batches; }, "read_batches");
  g->Add({"tutti_read_batch_seconds_total",
          "Time batches of Retrieves' SSD-tier reads spent, "
          "summed, by phase: slot (waiting for a host bounce slot; GPU staging only), io (from "
          "the per-device scheduler to the reads' completion), check (until the verifier "
          "answered).",
          kCounter,
          {"phase"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"slot"}, st.read_batch_slot_seconds, "read_batch_slot_seconds");
           out->Add({"io"}, st.read_batch_io_seconds, "read_batch_io_seconds");
           out->Add({"check"}, st.read_batch_check_seconds, "read_batch_check_seconds");
         });
  g->Counter(
      "tutti_read_batch_release_seconds_total",
      "Of the check phase of batches of Retrieves' SSD-tier reads, summed: from the reads' "
      "completion until the batch's host bounce slot went back (its copy to the GPU landed).",
      [](const StoreStats& st) { return st.read_batch_release_seconds; },
      "read_batch_release_seconds");
  g->Counter(
      "tutti_captures_total",
      "Store calls answered (not failed), each with its gather from the engine.",
      [](const StoreStats& st) { return st.captures; }, "captures");
  g->Add({"tutti_capture_seconds_total",
          "Time Store calls took until their blocks were "
          "captured (a wait_durable wait not included), summed: all of it, and of it waiting for "
          "store staging room and the gather from the engine.",
          kCounter,
          {"part"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"all"}, st.capture_seconds, "capture_seconds");
           out->Add({"staging_wait"}, st.capture_wait_seconds, "capture_wait_seconds");
           out->Add({"gather"}, st.capture_gather_seconds, "capture_gather_seconds");
         });
  g->Counter("tutti_write_batches_total", "Batches of the store's write pipeline.",
             [](const StoreStats& st) { return st.write_batches; }, "write_batches");
  g->Counter(
      "tutti_write_commits_total",
      "Commits of the store's write pipeline, each of the batches written by then.",
      [](const StoreStats& st) { return st.write_commits; }, "write_commits");
  g->Counter(
      "tutti_write_commit_sync_seconds_total",
      "Of the commits' time, the pool files' syncs (the rest: the journal).",
      [](const StoreStats& st) { return st.write_commit_sync_seconds; },
      "write_commit_sync_seconds");
  g->Add({"tutti_write_seconds_total", "Time the write pipeline's batches spent, summed, by "
          "phase: prepare (slots and checksums), io (posted until the committer took them), "
          "commit (the pool syncs and journal of their commits).", kCounter, {"phase"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"prepare"}, st.write_prepare_seconds, "write_prepare_seconds");
           out->Add({"io"}, st.write_io_seconds, "write_io_seconds");
           out->Add({"commit"}, st.write_commit_seconds, "write_commit_seconds");
         });
  g->Add({"tutti_write_prepare_seconds_total", "Of the write pipeline's prepare phase, summed "
          "over batches: slots (evicted blocks' Deletes made durable included) and checksums "
          "(promoted blocks' copies included, on the checksum pool); the rest is headers and "
          "planning.", kCounter, {"part"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"slots"}, st.write_slot_seconds, "write_slot_seconds");
           out->Add({"checksums"}, st.write_checksum_seconds, "write_checksum_seconds");
         });
  g->Add(
      {"tutti_write_checksummed_objects_total",
       "Objects of written blocks by where their "
       "checksum was computed: with the gather that captured them (on the GPU, "
       "datapath.store_checksums) or by the writer (on the checksum pool).",
       kCounter,
       {"by"}},
      [](const StoreStats& st, Samples* out) {
        out->Add({"gather"}, st.write_objects_summed_at_gather, "write_objects_summed_at_gather");
        out->Add({"writer"}, st.write_objects_summed_by_writer, "write_objects_summed_by_writer");
      });
}

stats::Histogram Seconds(const datapath::LatencyHistogram& h) {
  stats::Histogram out;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < datapath::kLatencyBoundsUs.size(); ++i) {
    cumulative += h.counts[i];
    out.upper_bounds.push_back(datapath::kLatencyBoundsUs[i] * 1e-6);
    out.cumulative.push_back(cumulative);
  }
  out.count = h.count;  // the +Inf bucket
  out.sum = static_cast<double>(h.sum_us) * 1e-6;
  return out;
}

// One sample per device of `value`, labelled with the device's index.
template <typename F>
void PerDevice(const StoreStats& st, Samples* out, F value) {
  for (size_t d = 0; d < st.io.devices.size(); ++d) {
    out->Add({std::to_string(d)}, value(st.io.devices[d]));
  }
}

void AddQueues(Group* g) {
  using datapath::DeviceIoStats;
  g->Gauge("tutti_io_writes_queued", "Pool writes waiting in the I/O scheduler now.",
           [](const StoreStats& st) { return st.io.writes_queued; });
  g->Gauge("tutti_io_write_bytes_queued", "Bytes of the pool writes waiting now.",
           [](const StoreStats& st) { return st.io.write_bytes_queued; });
  g->Counter("tutti_io_write_wait_seconds_total", "Time pool writes waited in the scheduler "
             "before emission, summed.",
             [](const StoreStats& st) { return st.io.write_wait_ms * 1e-3; });
  g->Add({"tutti_io_reads_in_flight", "Pool reads emitted and not completed, by device (pool "
          "file index; see tutti_pool_device_info).", kGauge, {"device"}},
         [](const StoreStats& st, Samples* out) {
           PerDevice(st, out, [](const DeviceIoStats& d) { return d.reads_in_flight; });
         });
  g->Add({"tutti_io_reads_queued", "Pool reads waiting for their Retrieve's turn past "
          "datapath.max_read_bytes_in_flight, by device.", kGauge, {"device"}},
         [](const StoreStats& st, Samples* out) {
           PerDevice(st, out, [](const DeviceIoStats& d) { return d.reads_queued; });
         });
  g->Add({"tutti_io_write_bytes_in_flight", "Bytes of pool writes emitted and not completed, "
          "by device.", kGauge, {"device"}},
         [](const StoreStats& st, Samples* out) {
           PerDevice(st, out, [](const DeviceIoStats& d) { return d.write_bytes_in_flight; });
         });
  g->Add({"tutti_io_write_window_bytes", "The cap on pool writes in flight while the device "
          "reads nothing, adapted to datapath.write_latency_target_ms, by device.", kGauge,
          {"device"}},
         [](const StoreStats& st, Samples* out) {
           PerDevice(st, out, [](const DeviceIoStats& d) { return d.write_window; });
         });
  g->Add({"tutti_io_write_window_cuts_total", "Times writes completing later than "
          "datapath.write_latency_target_ms halved a device's write window, by device.",
          kCounter, {"device"}},
         [](const StoreStats& st, Samples* out) {
           PerDevice(st, out, [](const DeviceIoStats& d) { return d.write_window_cuts; });
         });
  g->Add({"tutti_io_latency_seconds", "Completion latency of pool I/O requests, from their "
          "emission to the backend until it completed them, by device and op.", Type::kHistogram,
          {"device", "op"}},
         [](const StoreStats& st, Samples* out) {
           for (size_t d = 0; d < st.io.devices.size(); ++d) {
             out->AddHistogram({std::to_string(d), "read"}, Seconds(st.io.devices[d].read_latency));
             out->AddHistogram({std::to_string(d), "write"},
                               Seconds(st.io.devices[d].write_latency));
           }
         });
}

void AddErrors(Group* g) {
  g->Add({"tutti_errors_total", "Failures by kind: verify (checksum or header mismatch, served "
          "as a miss), io (failed or short pool I/O), store_failed (blocks that could not be made "
          "durable), checkpoint (failed checkpoint attempts).", kCounter, {"kind"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"verify"}, st.verify_errors, "verify_errors");
           out->Add({"io"}, st.io_errors, "io_errors");
           out->Add({"store_failed"}, st.store_failed, "store_failed");
           out->Add({"checkpoint"}, st.checkpoint_failures, "checkpoint_failures");
         });
  g->Add({"tutti_store_rejected_total", "Blocks a Store refused, by reason: staging_full, "
          "owner_limit (the session's share of staging), backlog (the write backlog's bounds).",
          kCounter, {"reason"}, "store_rejected"},
         [](const StoreStats& st, Samples* out) {
           const uint64_t capped = st.store_rejected_owner_limit + st.store_rejected_backlog;
           out->Add({"staging_full"}, st.store_rejected - std::min(capped, st.store_rejected));
           out->Add({"owner_limit"}, st.store_rejected_owner_limit,
                    "store_rejected_session_limit");
           out->Add({"backlog"}, st.store_rejected_backlog, "store_rejected_backlog");
         });
  g->Add({"tutti_admission_blocks_total", "New blocks of Stores judged by the admission "
          "policy (pool.admission), by decision: admitted (written to the pool) or declined "
          "(dropped, STORE_DECLINED).", kCounter, {"decision"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"admitted"}, st.blocks_admitted, "blocks_admitted");
           out->Add({"declined"}, st.blocks_declined, "blocks_declined");
         });
  g->Add({"tutti_dram_front_blocks_total", "pool.admission \"dram_front\": blocks kept in the "
          "DRAM front at their first sight (kept), written to the pool at their second sight "
          "(promoted), dropped from DRAM before one (dropped), and Lookup hits whose promotion "
          "waited for store staging (deferred).", kCounter, {"event"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"kept"}, st.front_kept, "front_kept");
           out->Add({"promoted"}, st.front_promoted, "front_promoted");
           out->Add({"dropped"}, st.front_dropped, "front_dropped");
           out->Add({"deferred"}, st.front_promotions_deferred, "front_promotions_deferred");
         });
  g->Gauge("tutti_dram_front_blocks", "pool.admission \"dram_front\": blocks in the DRAM front "
           "now (kept, or being written to the pool).",
           [](const StoreStats& st) { return st.front_blocks; }, "front_blocks");
  g->Add({"tutti_partial_blocks_dropped_total", "Partially captured blocks dropped: expired "
          "(limits.partial_store_ttl_ms) or abandoned (owner gone or its copy failed).", kCounter,
          {"reason"}},
         [](const StoreStats& st, Samples* out) {
           out->Add({"expired"}, st.pending_expired, "partial_stores_expired");
           out->Add({"abandoned"}, st.pending_dropped, "partial_stores_dropped");
         });
  g->Gauge("tutti_durability_lost", "1 once the journal or state directory was removed or "
           "replaced: nothing is durable until restart.",
           [](const StoreStats& st) { return st.durability_lost ? 1 : 0; }, "durability_lost");
  g->Gauge("tutti_unindexed_slot_headers", "Used slot headers found at start that the index "
           "cannot find (state directory lost).",
           [](const StoreStats& st) { return st.unindexed_slot_headers; },
           "unindexed_slot_headers");
}

void AddCapacity(Group* g) {
  g->Gauge("tutti_pool_slots", "Slots in the pool (one block each).",
           [](const StoreStats& st) { return st.slots_total; }, "slots_total");
  g->Gauge("tutti_pool_slots_used", "Slots holding a block or being written.",
           [](const StoreStats& st) { return st.slots_used; }, "slots_used");
  g->Gauge("tutti_pool_capacity_bytes", "Bytes of all slots.",
           [](const StoreStats& st) { return st.slots_total * st.slot_bytes; }, "capacity_bytes");
  g->Gauge("tutti_pool_used_bytes", "Bytes of the used slots.",
           [](const StoreStats& st) { return st.slots_used * st.slot_bytes; }, "used_bytes");
  g->Gauge("tutti_dram_capacity_bytes", "Bytes of the DRAM tier (0: off).",
           [](const StoreStats& st) { return st.dram_capacity; }, "dram_capacity_bytes");
  g->Gauge("tutti_dram_used_bytes", "Bytes of the DRAM tier in use.",
           [](const StoreStats& st) { return st.dram_used; }, "dram_used_bytes");
  g->Gauge("tutti_store_staging_bytes", "Bytes of store staging.",
           [](const StoreStats& st) { return st.store_staging_bytes; }, "store_staging_bytes");
  g->Gauge("tutti_store_staging_used_bytes", "Bytes of store staging in use.",
           [](const StoreStats& st) { return st.store_staging_used; }, "store_staging_used_bytes");
  g->Counter("tutti_evictions_total", "Blocks evicted from the pool to make room.",
             [](const StoreStats& st) { return st.evictions; }, "evictions");
  g->Gauge("tutti_write_backlog_bytes", "Staging bytes of blocks captured and not yet durable.",
           [](const StoreStats& st) { return st.write_backlog_bytes; }, "write_backlog_bytes");
  g->Gauge("tutti_write_backlog_blocks", "Blocks captured and not yet durable.",
           [](const StoreStats& st) { return st.write_backlog_blocks; }, "write_backlog_blocks");
  Spec age{"tutti_write_backlog_age_seconds", "How long the oldest block of the write backlog "
           "has waited (0: empty).", kGauge, {}, "write_backlog_age_ms"};
  age.field_scale = 1e3;
  g->Add(age, [](const StoreStats& st, Samples* out) { out->Add(st.write_backlog_age_ms * 1e-3); });
}

void AddBandwidth(stats::Group<TierBandwidths>* g) {
  using datapath::Tier;
  g->Add({"tutti_read_bandwidth_bytes_per_second", "Read bandwidth estimate per tier (the "
          "configured prior until reads have measured it).", kGauge, {"tier"}},
         [](const TierBandwidths& b, Samples* out) {
           for (Tier t : {Tier::kDram, Tier::kSsd}) {
             out->Add({TierName(t)}, b[static_cast<int>(t)].bytes_per_sec);
           }
         });
  g->Add({"tutti_read_bandwidth_samples_total", "Reads measured into the bandwidth estimate, "
          "per tier.", kCounter, {"tier"}},
         [](const TierBandwidths& b, Samples* out) {
           for (Tier t : {Tier::kDram, Tier::kSsd}) {
             out->Add({TierName(t)}, b[static_cast<int>(t)].samples);
           }
         });
}

}  // namespace

void RegisterStoreStats(std::function<StoreStats()> stats,
                        std::function<TierBandwidths()> bandwidth, stats::Registry* registry) {
  Group& g = registry->AddGroup<StoreStats>(std::move(stats));
  AddLookupsAndHits(&g);
  AddTraffic(&g);
  AddQueues(&g);
  AddErrors(&g);
  AddCapacity(&g);
  AddBandwidth(&registry->AddGroup<TierBandwidths>(std::move(bandwidth)));
}

void RegisterStoreStats(const BlockStore* store, stats::Registry* registry) {
  RegisterStoreStats([store] { return store->Stats(); },
                     [store] {
                       TierBandwidths b;
                       for (datapath::Tier t : {datapath::Tier::kDram, datapath::Tier::kSsd}) {
                         b[static_cast<int>(t)] = store->read_bandwidth().Get(t);
                       }
                       return b;
                     },
                     registry);
}

}  // namespace tutti::store

// tuttictl status, sessions, stats and evict: the Admin service, as tables or JSON.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/tuttictl/admin_call.h"
#include "client/tuttictl/command.h"
#include "client/tuttictl/output.h"
#include "common/connect.h"
#include "common/status_macros.h"
#include "grpcpp/client_context.h"
#include "tutti/v1/admin.grpc.pb.h"

namespace tutti::tuttictl {
namespace {

namespace v1 = tutti::v1;

// A command that fetches one Admin report and prints it as text or, with --json, as JSON.
template <typename Request, typename Response>
class ReportCommand : public Command {
 public:
  using Method = grpc::Status (v1::Admin::Stub::*)(grpc::ClientContext*, const Request&,
                                                   Response*);
  explicit ReportCommand(Method method) : method_(method) {}
  absl::Status Run(const GlobalOptions& options, std::ostream& out) override {
    Response r;
    RETURN_IF_ERROR(CallAdmin(options, method_, Request(), &r));
    if (options.json) {
      out << Json(r) << "\n";
    } else {
      out << Human(r);
    }
    return absl::OkStatus();
  }

 protected:
  virtual std::string Human(const Response& r) const = 0;
  virtual std::string Json(const Response& r) const = 0;

 private:
  const Method method_;
};

// The pool's "capacity" and "used" lines (status and stats).
template <typename Response>
void AddCapacity(const Response& r, KeyValues* kv) {
  kv->Add("capacity",
          absl::StrCat(HumanBytes(r.capacity_bytes()), " in ", r.slots_total(), " slots"));
  kv->Add("used", absl::StrCat(HumanBytes(r.used_bytes()), " (",
                               Percent(r.used_bytes(), r.capacity_bytes()), ") in ",
                               r.slots_used(), " slots"));
}

std::string DramText(uint64_t capacity, uint64_t used) {
  if (capacity == 0) return "off";
  return absl::StrCat(HumanBytes(used), " of ", HumanBytes(capacity), " (", Percent(used, capacity),
                      ")");
}

class StatusCommand : public ReportCommand<v1::StatusRequest, v1::StatusResponse> {
 public:
  StatusCommand() : ReportCommand(&v1::Admin::Stub::Status) {}
  std::string name() const override { return "status"; }
  std::string usage() const override { return "status"; }
  std::string summary() const override {
    return "daemon version, I/O path taken, pool capacity and use";
  }

 protected:
  std::string Human(const v1::StatusResponse& r) const override {
    KeyValues kv;
    kv.Add("tuttid", absl::StrCat(r.version(), ", up ", HumanDurationMs(r.uptime_ms())));
    kv.Add("io backend", r.io_backend());
    if (!r.io_backend_reason().empty()) {
      kv.Add("io fallback", absl::StrCat("asked for \"", r.io_backend_requested(), "\": ",
                                         r.io_backend_reason()));
    }
    kv.Add("device mode", r.device_mode());
    if (r.device_mode() == "cuda") {
      kv.Add("gpu memory", absl::StrCat(r.gpu_memory_bytes() >> 20,
                                        " MiB taken at start (I/O context, retrieve staging)"));
    }
    kv.Add("pool dirs", absl::StrJoin(r.pool_dirs(), ", "));
    AddCapacity(r, &kv);
    kv.Add("dram tier", DramText(r.dram_capacity_bytes(), r.dram_used_bytes()));
    kv.Add("sessions", absl::StrCat(r.sessions()));
    if (!r.notes().empty()) kv.Add("notes", r.notes());
    if (r.durability_lost()) {
      kv.Add("DURABILITY LOST", absl::StrCat(r.durability_error(), " (stores fail; restart)"));
    }
    if (r.unindexed_slot_headers() > 0) {
      kv.Add("unindexed blocks",
             absl::StrCat(r.unindexed_slot_headers(),
                          " used slots the journal does not know (state directory lost?)"));
    }
    return kv.Render();
  }
  std::string Json(const v1::StatusResponse& r) const override {
    JsonWriter j;
    j.BeginObject();
    j.Key("version").String(r.version()).Key("uptime_ms").Uint(r.uptime_ms());
    j.Key("io_backend").String(r.io_backend()).Key("device_mode").String(r.device_mode());
    j.Key("io_backend_requested").String(r.io_backend_requested());
    j.Key("io_backend_reason").String(r.io_backend_reason());
    j.Key("pool_dirs").BeginArray();
    for (const auto& d : r.pool_dirs()) j.String(d);
    j.EndArray();
    j.Key("capacity_bytes").Uint(r.capacity_bytes()).Key("used_bytes").Uint(r.used_bytes());
    j.Key("slots_total").Uint(r.slots_total()).Key("slots_used").Uint(r.slots_used());
    j.Key("dram_capacity_bytes").Uint(r.dram_capacity_bytes());
    j.Key("dram_used_bytes").Uint(r.dram_used_bytes());
    j.Key("sessions").Uint(r.sessions()).Key("notes").String(r.notes());
    j.Key("durability_lost").Bool(r.durability_lost());
    j.Key("durability_error").String(r.durability_error());
    j.Key("unindexed_slot_headers").Uint(r.unindexed_slot_headers());
    j.Key("gpu_memory_bytes").Uint(r.gpu_memory_bytes());
    return j.EndObject().str();
  }
};

// "0-13 (apart)", "0-15 (16 shared)" (CPUs tuttid may run on too: a busy engine waits behind its
// I/O threads there), or "-" when tuttid could not read them.
std::string EngineCpus(const v1::SessionInfo& s) {
  if (s.engine_cpus().empty()) return "-";
  if (s.cpus_shared_with_tuttid() == 0) return absl::StrCat(s.engine_cpus(), " (apart)");
  return absl::StrCat(s.engine_cpus(), " (", s.cpus_shared_with_tuttid(), " shared)");
}

class SessionsCommand : public ReportCommand<v1::SessionsRequest, v1::SessionsResponse> {
 public:
  SessionsCommand() : ReportCommand(&v1::Admin::Stub::Sessions) {}
  std::string name() const override { return "sessions"; }
  std::string usage() const override { return "sessions"; }
  std::string summary() const override { return "attached engines, their leases and pins"; }

 protected:
  std::string Human(const v1::SessionsResponse& r) const override {
    if (r.sessions_size() == 0) return "no sessions\n";
    Table t({">SESSION", ">UID", "ENGINE", "NAMESPACE", "MODEL", ">BLOCKS", ">LEASES", ">PINNED",
             ">IDLE", "ENGINE CPUS"});
    for (const auto& s : r.sessions()) {
      t.AddRow({absl::StrCat(s.session_id()), absl::StrCat(s.uid()), s.engine_id(),
                NamespaceHex(s.namespace_id()), s.model_id(), absl::StrCat(s.num_blocks()),
                absl::StrCat(s.leases()), absl::StrCat(s.pinned_blocks()),
                HumanDurationMs(s.idle_ms()), EngineCpus(s)});
    }
    return t.Render();
  }
  std::string Json(const v1::SessionsResponse& r) const override {
    JsonWriter j;
    j.BeginObject().Key("sessions").BeginArray();
    for (const auto& s : r.sessions()) {
      j.BeginObject();
      j.Key("session_id").Uint(s.session_id()).Key("uid").Uint(s.uid());
      j.Key("engine_id").String(s.engine_id());
      j.Key("namespace_id").String(NamespaceHex(s.namespace_id()));
      j.Key("model_id").String(s.model_id()).Key("num_blocks").Uint(s.num_blocks());
      j.Key("leases").Uint(s.leases()).Key("pinned_blocks").Uint(s.pinned_blocks());
      j.Key("idle_ms").Uint(s.idle_ms());
      if (!s.engine_cpus().empty()) {
        j.Key("engine_cpus").String(s.engine_cpus());
        j.Key("cpus_shared_with_tuttid").Uint(s.cpus_shared_with_tuttid());
      }
      j.EndObject();
    }
    return j.EndArray().EndObject().str();
  }
};

// One sample of a registry family as /metrics names it: name{label="value",...}; a histogram's
// count and sum as name_count and name_sum.
std::string SampleName(const v1::MetricFamily& f, const v1::MetricSample& s,
                       const std::string& suffix = "") {
  std::string labels;
  for (int i = 0; i < f.label_names_size() && i < s.label_values_size(); ++i) {
    absl::StrAppend(&labels, labels.empty() ? "" : ",", f.label_names(i), "=\"",
                    s.label_values(i), "\"");
  }
  return absl::StrCat(f.name(), suffix, labels.empty() ? "" : absl::StrCat("{", labels, "}"));
}

// Every sample of `r.metrics()`, each as (name, value).
std::vector<std::pair<std::string, double>> MetricSamples(const v1::StatsResponse& r) {
  std::vector<std::pair<std::string, double>> out;
  for (const v1::MetricFamily& f : r.metrics()) {
    for (const v1::MetricSample& s : f.samples()) {
      if (f.type() == "histogram") {
        out.emplace_back(SampleName(f, s, "_count"), s.value());
        out.emplace_back(SampleName(f, s, "_sum"), s.sum());
      } else {
        out.emplace_back(SampleName(f, s), s.value());
      }
    }
  }
  return out;
}

class StatsCommand : public ReportCommand<v1::StatsRequest, v1::StatsResponse> {
 public:
  StatsCommand() : ReportCommand(&v1::Admin::Stub::Stats) {}
  std::string name() const override { return "stats"; }
  std::string usage() const override { return "stats [--metrics] [--json]"; }
  std::string summary() const override {
    return "capacity and use, blocks per namespace and tier, hits, misses, bytes, errors";
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.Bool("metrics", &metrics_,
               "also every figure of the daemon's stats registry, as /metrics names it (--json "
               "always has every family, under \"metrics\")");
  }

 protected:
  std::string Human(const v1::StatsResponse& r) const override {
    KeyValues kv;
    AddCapacity(r, &kv);
    kv.Add("sessions", absl::StrCat(r.sessions()));
    kv.Add("lookups",
           absl::StrCat(r.lookups(), " (blocks hit ", r.lookup_hits(), ", chains cut short ",
                        r.lookup_misses(), ", from dram ", r.dram_hits(), ")"));
    kv.Add("retrieved", absl::StrCat(r.blocks_retrieved(), " blocks, ", HumanBytes(r.bytes_read()),
                                     " into engines"));
    kv.Add("stored", absl::StrCat(r.blocks_stored(), " blocks durable, ",
                                  HumanBytes(r.bytes_written()), " written"));
    kv.Add("write backlog",
           absl::StrCat(r.write_backlog_blocks(), " blocks, ", HumanBytes(r.write_backlog_bytes()),
                        ", oldest waiting ", r.write_backlog_age_ms(), " ms"));
    kv.Add("evictions", absl::StrCat(r.evictions()));
    if (!r.admission().empty() && r.admission() != "all") {
      kv.Add("admission", absl::StrCat(r.admission(), ": ", r.blocks_admitted(), " blocks admitted, ",
                                       r.blocks_declined(), " declined"));
      if (r.admission() == "dram_front") {
        kv.Add("dram front",
               absl::StrCat(r.front_blocks(), " blocks now; ", r.front_kept(), " kept, ",
                            r.front_promoted(), " promoted, ", r.front_dropped(), " dropped, ",
                            r.front_promotions_deferred(), " promotions deferred"));
      }
    }
    kv.Add("errors",
           absl::StrCat("verify ", r.verify_errors(), ", io ", r.io_errors(),
                        ", store rejected (full) ", r.store_rejected(),
                        " (of them for the write backlog ", r.store_rejected_backlog(),
                        "), store failed ", r.store_failed()));
    if (r.gpu_layers() > 0 || r.gpu_gathers() > 0) {
      kv.Add("gpu layers", absl::StrCat(r.gpu_layers(), " placed, ", r.gpu_layers_copy_engine(),
                                        " by the copy engines alone"));
      kv.Add("gpu gathers", absl::StrCat(r.gpu_gathers(), " (stores), ",
                                         r.gpu_gathers_copy_engine(), " by the copy engines"));
    }
    kv.Add("decisions",
           r.prediction_errors() == 0
               ? absl::StrCat(r.decisions(), " (no measured TTFT reported)")
               : absl::StrFormat("%u, TTFT prediction error over %u: mean %.1f%%, last %.1f%%",
                                 r.decisions(), r.prediction_errors(),
                                 100 * r.prediction_error_mean(), 100 * r.prediction_error_last()));
    if (r.decision_refused_loads() + r.decision_explorations() + r.decision_corrections() > 0) {
      kv.Add("advice", absl::StrCat(r.decision_refused_loads(), " recomputed for uncertainty, ",
                                    r.decision_explorations(), " explored, ",
                                    r.decision_corrections(), " corrections from measured TTFTs"));
    }
    std::string out = kv.Render();
    if (r.namespaces_size() == 0) {
      out += "\nno namespaces\n";
    } else {
      Table t({"NAMESPACE", "MODEL", ">SSD BLOCKS", ">DRAM BLOCKS"});
      for (const auto& ns : r.namespaces()) {
        t.AddRow({NamespaceHex(ns.namespace_id()), ns.model_id(), absl::StrCat(ns.blocks_ssd()),
                  absl::StrCat(ns.blocks_dram())});
      }
      out += "\n" + t.Render();
    }
    if (!metrics_) return out;
    Table m({"METRIC", ">VALUE"});
    for (const auto& [name, value] : MetricSamples(r)) m.AddRow({name, absl::StrCat(value)});
    return out + "\n" + m.Render();
  }
  std::string Json(const v1::StatsResponse& r) const override {
    JsonWriter j;
    j.BeginObject();
    const std::pair<const char*, uint64_t> fields[] = {
        {"capacity_bytes", r.capacity_bytes()},
        {"used_bytes", r.used_bytes()},
        {"slots_total", r.slots_total()},
        {"slots_used", r.slots_used()},
        {"sessions", r.sessions()},
        {"lookups", r.lookups()},
        {"lookup_hits", r.lookup_hits()},
        {"lookup_misses", r.lookup_misses()},
        {"dram_hits", r.dram_hits()},
        {"blocks_retrieved", r.blocks_retrieved()},
        {"blocks_stored", r.blocks_stored()},
        {"bytes_read", r.bytes_read()},
        {"bytes_written", r.bytes_written()},
        {"evictions", r.evictions()},
        {"verify_errors", r.verify_errors()},
        {"io_errors", r.io_errors()},
        {"store_rejected", r.store_rejected()},
        {"store_failed", r.store_failed()},
        {"store_rejected_backlog", r.store_rejected_backlog()},
        {"blocks_admitted", r.blocks_admitted()},
        {"blocks_declined", r.blocks_declined()},
        {"front_kept", r.front_kept()},
        {"front_promoted", r.front_promoted()},
        {"front_dropped", r.front_dropped()},
        {"front_promotions_deferred", r.front_promotions_deferred()},
        {"front_blocks", r.front_blocks()},
        {"write_backlog_bytes", r.write_backlog_bytes()},
        {"write_backlog_blocks", r.write_backlog_blocks()},
        {"write_backlog_age_ms", r.write_backlog_age_ms()},
        {"gpu_layers", r.gpu_layers()},
        {"gpu_layers_copy_engine", r.gpu_layers_copy_engine()},
        {"gpu_gathers", r.gpu_gathers()},
        {"gpu_gathers_copy_engine", r.gpu_gathers_copy_engine()},
        {"decisions", r.decisions()},
        {"prediction_errors", r.prediction_errors()},
    };
    for (const auto& [key, value] : fields) j.Key(key).Uint(value);
    j.Key("prediction_error_mean").Double(r.prediction_error_mean());
    j.Key("prediction_error_last").Double(r.prediction_error_last());
    j.Key("decision_refused_loads").Uint(r.decision_refused_loads());
    j.Key("decision_explorations").Uint(r.decision_explorations());
    j.Key("decision_corrections").Uint(r.decision_corrections());
    j.Key("admission").String(r.admission());
    j.Key("namespaces").BeginArray();
    for (const auto& ns : r.namespaces()) {
      j.BeginObject().Key("namespace_id").String(NamespaceHex(ns.namespace_id()));
      j.Key("model_id").String(ns.model_id()).Key("blocks_ssd").Uint(ns.blocks_ssd());
      j.Key("blocks_dram").Uint(ns.blocks_dram()).Key("lookup_hits").Uint(ns.lookup_hits());
      j.Key("lookup_misses").Uint(ns.lookup_misses());
      j.Key("blocks_retrieved").Uint(ns.blocks_retrieved()).Key("dram_hits").Uint(ns.dram_hits());
      j.Key("owner_uid").Uint(ns.owner_uid()).Key("shared").Bool(ns.shared());
      j.Key("sessions").Uint(ns.sessions());
      j.EndObject();
    }
    j.EndArray().Key("metrics").BeginArray();
    for (const v1::MetricFamily& f : r.metrics()) {
      j.BeginObject().Key("name").String(f.name()).Key("type").String(f.type());
      j.Key("unit").String(f.unit()).Key("label_names").BeginArray();
      for (const std::string& l : f.label_names()) j.String(l);
      j.EndArray().Key("samples").BeginArray();
      for (const v1::MetricSample& s : f.samples()) {
        j.BeginObject().Key("labels").BeginObject();
        for (int i = 0; i < f.label_names_size() && i < s.label_values_size(); ++i) {
          j.Key(f.label_names(i)).String(s.label_values(i));
        }
        j.EndObject();
        if (f.type() == "histogram") {
          j.Key("count").Double(s.value()).Key("sum").Double(s.sum());
        } else {
          j.Key("value").Double(s.value());
        }
        j.EndObject();
      }
      j.EndArray().EndObject();
    }
    return j.EndArray().EndObject().str();
  }

 private:
  bool metrics_ = false;
};

class EvictCommand : public Command {
 public:
  std::string name() const override { return "evict"; }
  std::string usage() const override { return "evict --namespace ID|MODEL | --all"; }
  std::string summary() const override {
    return "drop every unpinned block of one namespace (id or model id), or of all";
  }
  void RegisterFlags(FlagSet& flags) override {
    flags.String("namespace", &namespace_, "namespace id (0x... or decimal) or model id");
    flags.Bool("all", &all_, "evict every namespace");
  }
  absl::Status CheckUsage(const FlagSet& flags, const std::vector<std::string>& args) override {
    RETURN_IF_ERROR(Command::CheckUsage(flags, args));
    if (all_ == !namespace_.empty()) {
      return absl::InvalidArgumentError("evict needs exactly one of --namespace or --all");
    }
    return absl::OkStatus();
  }
  absl::Status Run(const GlobalOptions& options, std::ostream& out) override {
    v1::EvictRequest request;
    request.set_all(all_);
    if (!all_) {
      ASSIGN_OR_RETURN(const uint64_t id, ResolveNamespace(options));
      request.set_namespace_id(id);
    }
    v1::EvictResponse r;
    RETURN_IF_ERROR(CallAdmin(options, &v1::Admin::Stub::Evict, request, &r));
    if (options.json) {
      JsonWriter j;
      j.BeginObject().Key("evicted").Uint(r.evicted());
      j.Key("skipped_pinned").Uint(r.skipped_pinned()).EndObject();
      out << j.str() << "\n";
    } else {
      out << "evicted " << r.evicted() << " blocks; " << r.skipped_pinned()
          << " pinned blocks kept\n";
    }
    return absl::OkStatus();
  }

 private:
  // A number (0x hex or decimal) is an id; anything else names a model, which must match exactly
  // one namespace.
  absl::StatusOr<uint64_t> ResolveNamespace(const GlobalOptions& options) const {
    uint64_t id = 0;
    const bool hex = namespace_.rfind("0x", 0) == 0 &&
                     absl::SimpleHexAtoi(absl::string_view(namespace_).substr(2), &id);
    if (hex || absl::SimpleAtoi(namespace_, &id)) {
      if (id == 0) return absl::InvalidArgumentError("namespace id 0 is not a namespace");
      return id;
    }
    v1::StatsResponse stats;
    RETURN_IF_ERROR(CallAdmin(options, &v1::Admin::Stub::Stats, v1::StatsRequest(), &stats));
    std::vector<std::string> matches;
    for (const auto& ns : stats.namespaces()) {
      if (ns.model_id() != namespace_) continue;
      id = ns.namespace_id();
      matches.push_back(NamespaceHex(id));
    }
    if (matches.empty()) {
      return absl::NotFoundError(absl::StrCat("no namespace has model id '", namespace_, "'"));
    }
    if (matches.size() > 1) {
      return absl::FailedPreconditionError(
          absl::StrCat("model id '", namespace_, "' names ", matches.size(),
                       " namespaces; pick one: ", absl::StrJoin(matches, ", ")));
    }
    return id;
  }

  std::string namespace_;
  bool all_ = false;
};

}  // namespace

std::unique_ptr<Command> NewStatusCommand() { return std::make_unique<StatusCommand>(); }
std::unique_ptr<Command> NewSessionsCommand() { return std::make_unique<SessionsCommand>(); }
std::unique_ptr<Command> NewStatsCommand() { return std::make_unique<StatsCommand>(); }
std::unique_ptr<Command> NewEvictCommand() { return std::make_unique<EvictCommand>(); }

}  // namespace tutti::tuttictl

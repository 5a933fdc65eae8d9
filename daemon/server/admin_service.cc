#include "daemon/server/admin_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/client_text.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/server/engine_cpus.h"
#include "daemon/server/stats_fields.h"

namespace tutti::server {

AdminService::AdminService(DaemonInfo info, store::BlockStore* store, SessionManager* sessions,
                           Clock* clock, CallGate* gate)
    : info_(std::move(info)),
      store_(store),
      sessions_(sessions),
      clock_(clock),
      start_ms_(clock->NowMs()),
      gate_(gate) {}

void AdminService::FillStatus(tutti::v1::StatusResponse* resp) const {
  const store::StoreStats st = store_->Stats();
  resp->set_version(info_.version);
  resp->set_uptime_ms(static_cast<uint64_t>(clock_->NowMs() - start_ms_));
  resp->set_io_backend(info_.io_backend);
  resp->set_io_backend_requested(info_.io_choice.requested.empty() ? info_.io_backend
                                                                   : info_.io_choice.requested);
  resp->set_io_backend_reason(info_.io_choice.reason);
  resp->set_device_mode(info_.device_mode);
  for (const std::string& d : info_.pool_dirs) resp->add_pool_dirs(d);
  resp->set_capacity_bytes(st.slots_total * st.slot_bytes);
  resp->set_used_bytes(st.slots_used * st.slot_bytes);
  resp->set_slots_total(st.slots_total);
  resp->set_slots_used(st.slots_used);
  resp->set_sessions(sessions_->num_sessions());
  resp->set_notes(info_.notes);
  resp->set_dram_capacity_bytes(st.dram_capacity);
  resp->set_dram_used_bytes(st.dram_used);
  resp->set_durability_lost(st.durability_lost);
  resp->set_durability_error(st.durability_error);
  resp->set_unindexed_slot_headers(st.unindexed_slot_headers);
  resp->set_gpu_memory_bytes(info_.gpu_memory_bytes);
}

grpc::Status AdminService::Status(grpc::ServerContext*, const tutti::v1::StatusRequest*,
                                  tutti::v1::StatusResponse* resp) {
  return ServeCall(gate_, [&] {
    FillStatus(resp);
    return absl::OkStatus();
  });
}

void AdminService::FillSessions(tutti::v1::SessionsResponse* resp) const {
  for (const SessionSummary& s : sessions_->List()) {
    tutti::v1::SessionInfo* row = resp->add_sessions();
    row->set_session_id(s.id);
    row->set_engine_id(s.engine_id);
    row->set_namespace_id(s.ns);
    row->set_model_id(s.model_id);
    row->set_leases(s.leases);
    row->set_pinned_blocks(s.pinned_blocks);
    row->set_idle_ms(s.idle_ms);
    row->set_num_blocks(s.num_blocks);
    row->set_uid(s.uid);
    if (s.memoryless || s.engine_process == nullptr) continue;
    // Read now, not at Attach: an operator may have moved the engine since. Not once it has
    // exited, when its pid may name another process.
    if (absl::StatusOr<CpuOverlap> o = s.engine_process->Cpus(); o.ok()) {
      row->set_engine_cpus(o->engine);
      row->set_cpus_shared_with_tuttid(static_cast<uint32_t>(o->shared));
    }
  }
}

grpc::Status AdminService::Sessions(grpc::ServerContext*, const tutti::v1::SessionsRequest*,
                                    tutti::v1::SessionsResponse* resp) {
  return ServeCall(gate_, [&] {
    FillSessions(resp);
    return absl::OkStatus();
  });
}

void AdminService::FillStats(tutti::v1::StatsResponse* resp) const {
  if (info_.stats != nullptr) {
    const std::vector<stats::Family> families = info_.stats->Collect();
    SetNamedFields(families, resp);
    AddMetricFamilies(families, resp->mutable_metrics());
  }
  // The namespaces' rows, with the sessions on each, and the admission policy's name.
  const store::StoreStats st = store_->Stats();
  resp->set_admission(st.admission);
  const absl::flat_hash_map<NamespaceId, uint32_t> sessions = sessions_->SessionsPerNamespace();
  for (const store::NamespaceInfo& ns : st.namespaces) {
    tutti::v1::NamespaceStats* row = resp->add_namespaces();
    row->set_owner_uid(ns.owner_uid);
    row->set_shared(ns.shared);
    if (auto it = sessions.find(ns.id); it != sessions.end()) row->set_sessions(it->second);
    row->set_namespace_id(ns.id);
    row->set_model_id(ns.descriptor.model_id());
    row->set_blocks_ssd(ns.blocks);
    row->set_blocks_dram(ns.blocks_dram);
    row->set_lookup_hits(ns.lookup_hits);
    row->set_lookup_misses(ns.lookup_misses);
    row->set_blocks_retrieved(ns.blocks_retrieved);
    row->set_dram_hits(ns.dram_hits);
  }
}

grpc::Status AdminService::Stats(grpc::ServerContext*, const tutti::v1::StatsRequest*,
                                 tutti::v1::StatsResponse* resp) {
  return ServeCall(gate_, [&] {
    FillStats(resp);
    return absl::OkStatus();
  });
}

absl::Status AdminService::DoEvict(const tutti::v1::EvictRequest& req,
                                   tutti::v1::EvictResponse* resp) {
  if (req.namespace_id() == 0 && !req.all()) {
    return absl::InvalidArgumentError(
        "namespace_id 0 evicts every namespace: set all = true to confirm");
  }
  if (req.namespace_id() != 0) RETURN_IF_ERROR(store_->GetNamespace(req.namespace_id()).status());
  const auto [evicted, skipped] = store_->Evict(req.namespace_id());
  resp->set_evicted(evicted);
  resp->set_skipped_pinned(skipped);
  log::Get("server")->info("evict namespace {:016x}: {} blocks evicted, {} pinned kept",
                           req.namespace_id(), evicted, skipped);
  return absl::OkStatus();
}

grpc::Status AdminService::Evict(grpc::ServerContext*, const tutti::v1::EvictRequest* req,
                                 tutti::v1::EvictResponse* resp) {
  return ServeCall(gate_, [&] { return DoEvict(*req, resp); });
}

absl::Status AdminService::DoRemoveNamespace(const tutti::v1::RemoveNamespaceRequest& req,
                                             tutti::v1::RemoveNamespaceResponse* resp) {
  const NamespaceId id = req.namespace_id();
  if (id == 0) return absl::InvalidArgumentError("namespace_id: 0 names no namespace");
  RETURN_IF_ERROR(store_->GetNamespace(id).status());
  auto count = [this] { return sessions_->SessionsPerNamespace(); };
  if (req.force()) {
    uint32_t closed = 0;
    for (const SessionSummary& s : sessions_->List()) {
      if (s.ns != id) continue;
      closed += sessions_->Close(s.id, "its namespace was removed by the operator").ok();
    }
    resp->set_sessions_closed(closed);
    // The closed sessions' blocks already queued are still written; wait for them.
    if (closed > 0) (void)store_->FlushFor(absl::Seconds(10));
  }
  ASSIGN_OR_RETURN(const store::RemovedNamespace removed, store_->RemoveNamespace(id, count));
  resp->set_evicted(removed.evicted);
  log::Get("server")->info("namespace {:016x} removed: {} blocks evicted, {} sessions closed", id,
                           removed.evicted, resp->sessions_closed());
  return absl::OkStatus();
}

grpc::Status AdminService::RemoveNamespace(grpc::ServerContext*,
                                           const tutti::v1::RemoveNamespaceRequest* req,
                                           tutti::v1::RemoveNamespaceResponse* resp) {
  return ServeCall(gate_, [&] { return DoRemoveNamespace(*req, resp); });
}

absl::Status AdminService::DoReportDevices(const tutti::v1::ReportDevicesRequest& req) {
  if (info_.device_health == nullptr) {
    return absl::UnimplementedError("this tuttid keeps no device health");
  }
  if (req.devices_size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("devices: ", req.devices_size(), " reported; at most 256"));
  }
  std::vector<DeviceHealth> devices;
  for (int i = 0; i < req.devices_size(); ++i) {
    const tutti::v1::NvmeDeviceHealth& d = req.devices(i);
    if (d.device().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("devices[", i, "].device is empty"));
    }
    RETURN_IF_ERROR(CheckClientText(absl::StrCat("devices[", i, "].device"), d.device(), 64));
    RETURN_IF_ERROR(CheckClientText(absl::StrCat("devices[", i, "].model"), d.model(), 128));
    RETURN_IF_ERROR(CheckClientText(absl::StrCat("devices[", i, "].serial"), d.serial(), 128));
    devices.push_back(DeviceHealth{d.device(), d.model(), d.serial(), d.critical_warning(),
                                   d.temperature_c(), d.available_spare_pct(), d.percentage_used(),
                                   d.media_errors(), clock_->NowMs()});
  }
  info_.device_health->Update(devices);
  return absl::OkStatus();
}

grpc::Status AdminService::ReportDevices(grpc::ServerContext*,
                                         const tutti::v1::ReportDevicesRequest* req,
                                         tutti::v1::ReportDevicesResponse*) {
  return ServeCall(gate_, [&] { return DoReportDevices(*req); });
}

absl::Status AdminService::DoEndSession(const tutti::v1::EndSessionRequest& req,
                                        tutti::v1::EndSessionResponse* resp) {
  if (req.session_id() == 0) return absl::InvalidArgumentError("session_id 0 names no session");
  ASSIGN_OR_RETURN(const SessionManager::EndResult ended,
                   sessions_->End(req.session_id(), req.leases_only()));
  resp->set_leases_ended(ended.leases_ended);
  resp->set_pins_released(ended.pins_released);
  resp->set_session_closed(ended.session_closed);
  return absl::OkStatus();
}

grpc::Status AdminService::EndSession(grpc::ServerContext*, const tutti::v1::EndSessionRequest* req,
                                      tutti::v1::EndSessionResponse* resp) {
  return ServeCall(gate_, [&] { return DoEndSession(*req, resp); });
}

}  // namespace tutti::server

namespace tutti::server {
namespace {

void FillProgress(const store::ScrubProgress& p, double seconds, tutti::v1::VerifyProgress* out) {
  out->set_blocks_total(p.blocks_total);
  out->set_blocks_checked(p.blocks_checked);
  out->set_blocks_bad(p.blocks_bad);
  out->set_bytes_read(p.bytes_read);
  out->set_elapsed_seconds(seconds);
  for (const store::ScrubBadBlock& b : p.bad) {
    tutti::v1::BadBlock* row = out->add_bad();
    row->set_namespace_id(b.ns);
    row->set_key_hex(b.key.Hex());
    row->set_slot(b.slot);
    row->set_reason(b.reason);
  }
}

}  // namespace

absl::Status AdminService::DoVerify(grpc::ServerContext* ctx, const tutti::v1::VerifyRequest& req,
                                    grpc::ServerWriter<tutti::v1::VerifyProgress>* writer) {
  if (verifying_.exchange(true)) {
    return absl::FailedPreconditionError("a verify is running already; wait for it to finish");
  }
  const int64_t start = clock_->NowMs();
  int64_t last_sent = start;
  auto seconds = [&] { return static_cast<double>(clock_->NowMs() - start) / 1000.0; };
  store::ScrubOptions options;
  if (req.batch_blocks() > 0) options.batch_blocks = req.batch_blocks();
  log::Get("server")->info("verify started ({} blocks per batch)", options.batch_blocks);
  auto result = store_->Scrub(options, [&](const store::ScrubProgress& p) {
    if (ctx->IsCancelled()) return false;
    const int64_t now = clock_->NowMs();
    if (now - last_sent < static_cast<int64_t>(req.progress_every_ms())) return true;
    last_sent = now;
    tutti::v1::VerifyProgress msg;
    FillProgress(p, seconds(), &msg);
    return writer->Write(msg);  // false: the client went away
  });
  verifying_ = false;
  if (!result.ok()) return result.status();
  tutti::v1::VerifyProgress last;
  FillProgress(*result, seconds(), &last);
  last.set_done(true);
  if (!writer->Write(last)) return absl::CancelledError("the client went away");
  return absl::OkStatus();
}

grpc::Status AdminService::Verify(grpc::ServerContext* ctx, const tutti::v1::VerifyRequest* req,
                                  grpc::ServerWriter<tutti::v1::VerifyProgress>* writer) {
  return ServeCall(gate_, [&] { return DoVerify(ctx, *req, writer); });
}

absl::Status AdminService::DoDrain(const tutti::v1::DrainRequest& req,
                                   tutti::v1::DrainResponse* resp) {
  const store::StoreStats before = store_->Stats();
  resp->set_backlog_blocks_before(before.write_backlog_blocks);
  resp->set_backlog_bytes_before(before.write_backlog_bytes);
  const uint64_t timeout_ms = req.timeout_ms() == 0 ? 60000 : req.timeout_ms();
  const int64_t start = clock_->NowMs();
  const bool drained = store_->FlushFor(absl::Milliseconds(timeout_ms));
  const store::StoreStats after = store_->Stats();
  resp->set_backlog_blocks_after(after.write_backlog_blocks);
  resp->set_backlog_bytes_after(after.write_backlog_bytes);
  resp->set_elapsed_ms(static_cast<uint64_t>(clock_->NowMs() - start));
  resp->set_drained(drained);
  log::Get("server")->info("drain: backlog {} blocks before, {} after{}",
                           before.write_backlog_blocks, after.write_backlog_blocks,
                           drained ? "" : " (timed out)");
  return absl::OkStatus();
}

grpc::Status AdminService::Drain(grpc::ServerContext*, const tutti::v1::DrainRequest* req,
                                 tutti::v1::DrainResponse* resp) {
  return ServeCall(gate_, [&] { return DoDrain(*req, resp); });
}

grpc::Status AdminService::Config(grpc::ServerContext*, const tutti::v1::ConfigRequest*,
                                  tutti::v1::ConfigResponse* resp) {
  return ServeCall(gate_, [&] {
    resp->set_text(info_.config_text);
    return absl::OkStatus();
  });
}

absl::Status AdminService::DoSetLogLevel(const tutti::v1::SetLogLevelRequest& req,
                                         tutti::v1::SetLogLevelResponse* resp) {
  if (req.subsystem() == "all") {
    if (!log::SetLevel(req.level())) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown log level '", req.level(),
                       "'; one of trace, debug, info, warn, error, critical, off"));
    }
  } else {
    ASSIGN_OR_RETURN(std::string previous, log::SetSubsystemLevel(req.subsystem(), req.level()));
    resp->set_previous_level(std::move(previous));
  }
  log::Get("server")->info("log level of {} set to {} by an operator", req.subsystem(),
                           req.level());
  return absl::OkStatus();
}

grpc::Status AdminService::SetLogLevel(grpc::ServerContext*,
                                       const tutti::v1::SetLogLevelRequest* req,
                                       tutti::v1::SetLogLevelResponse* resp) {
  return ServeCall(gate_, [&] { return DoSetLogLevel(*req, resp); });
}

}  // namespace tutti::server

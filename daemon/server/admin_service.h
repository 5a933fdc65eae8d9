// The operator API (tutti.v1.Admin), used by tuttictl: status, sessions, statistics, eviction,
// verify (the store's scrub), drain, the effective configuration, run-time log levels, and
// ending a session's leases or the session (EndSession).
//
// Thread-safety: handlers run on many gRPC threads; they only read the store's and the session
// manager's thread-safe views, and Evict, Verify and Drain go through the store.
#ifndef TUTTI_DAEMON_SERVER_ADMIN_SERVICE_H_
#define TUTTI_DAEMON_SERVER_ADMIN_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/clock.h"
#include "common/stats.h"
#include "daemon/io/backend_choice.h"
#include "daemon/server/call_gate.h"
#include "daemon/server/device_health.h"
#include "daemon/server/gpu_layer_stats.h"
#include "daemon/server/sessions.h"
#include "daemon/store/block_store.h"
#include "tutti/v1/admin.grpc.pb.h"

namespace tutti::server {

// Facts fixed at start-up that Status reports, and where Stats finds its figures.
struct DaemonInfo {
  std::string version;
  std::string io_backend;            // e.g. "uring"
  std::string device_mode = "host";  // "host" or "cuda"
  std::vector<std::string> pool_dirs;
  std::string notes;  // fallbacks taken at start, in words
  // The daemon's stats registry (common/stats.h), collected at each Stats: its named fields and
  // its list of every family (stats_fields.h). Null: Stats reports the namespaces only. Must
  // outlive the service.
  const stats::Registry* stats = nullptr;
  uint64_t gpu_memory_bytes = 0;  // GPU memory the set-up took (daemon/gpu_setup.h); 0 in host mode
  std::string config_text;  // the effective configuration, as logged at start (Config's answer)
  // Where ReportDevices puts what it is told (may be null: ReportDevices is then UNIMPLEMENTED).
  // Must outlive the service.
  DeviceHealthBoard* device_health = nullptr;
  // The backend asked for and why io_backend differs (Status io_backend_requested / _reason);
  // an empty `requested` reads as io_backend.
  io::BackendChoice io_choice;
};

class AdminService final : public tutti::v1::Admin::Service {
 public:
  // `store`, `sessions`, `clock` and `gate` must outlive the service. Uptime counts from
  // construction. Every call passes through `gate`.
  AdminService(DaemonInfo info, store::BlockStore* store, SessionManager* sessions, Clock* clock,
               CallGate* gate);

  grpc::Status Status(grpc::ServerContext* ctx, const tutti::v1::StatusRequest* req,
                      tutti::v1::StatusResponse* resp) override;
  grpc::Status Sessions(grpc::ServerContext* ctx, const tutti::v1::SessionsRequest* req,
                        tutti::v1::SessionsResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const tutti::v1::StatsRequest* req,
                     tutti::v1::StatsResponse* resp) override;
  // namespace_id 0 evicts every namespace and needs all = true (else INVALID_ARGUMENT); an unknown
  // namespace is NOT_FOUND. Pinned blocks stay and are counted as skipped.
  grpc::Status Evict(grpc::ServerContext* ctx, const tutti::v1::EvictRequest* req,
                     tutti::v1::EvictResponse* resp) override;
  // Streams progress of BlockStore::Scrub, then a last message with done = true and every bad
  // block. One verify at a time: a second is FAILED_PRECONDITION while one runs. A client that
  // goes away stops it (the blocks checked so far stay checked).
  // Removes a namespace (BlockStore::RemoveNamespace): with force, closes its sessions first and
  // waits (at most 10 s) for their queued blocks to be written. INVALID_ARGUMENT for id 0,
  // NOT_FOUND for an unknown one, FAILED_PRECONDITION while it has sessions (without force) or
  // pinned or unwritten blocks (retry).
  grpc::Status RemoveNamespace(grpc::ServerContext* ctx,
                               const tutti::v1::RemoveNamespaceRequest* req,
                               tutti::v1::RemoveNamespaceResponse* resp) override;
  grpc::Status Verify(grpc::ServerContext* ctx, const tutti::v1::VerifyRequest* req,
                      grpc::ServerWriter<tutti::v1::VerifyProgress>* writer) override;
  // Waits up to timeout_ms (0: 60 s) for the write backlog to empty (BlockStore::FlushFor).
  grpc::Status Drain(grpc::ServerContext* ctx, const tutti::v1::DrainRequest* req,
                     tutti::v1::DrainResponse* resp) override;
  grpc::Status Config(grpc::ServerContext* ctx, const tutti::v1::ConfigRequest* req,
                      tutti::v1::ConfigResponse* resp) override;
  // log::SetSubsystemLevel, or log::SetLevel for subsystem "all"; its errors.
  grpc::Status SetLogLevel(grpc::ServerContext* ctx, const tutti::v1::SetLogLevelRequest* req,
                           tutti::v1::SetLogLevelResponse* resp) override;
  // Keeps the reported NVMe health (device_health.h). INVALID_ARGUMENT for more than 256 devices
  // or a device name that is empty, longer than 64 bytes or not printable.
  grpc::Status ReportDevices(grpc::ServerContext* ctx, const tutti::v1::ReportDevicesRequest* req,
                             tutti::v1::ReportDevicesResponse* resp) override;
  // SessionManager::End: ends the session's leases (their pins go at once) and, unless
  // leases_only, the session. NOT_FOUND for an unknown id; INVALID_ARGUMENT for id 0.
  grpc::Status EndSession(grpc::ServerContext* ctx, const tutti::v1::EndSessionRequest* req,
                          tutti::v1::EndSessionResponse* resp) override;

 private:
  void FillStatus(tutti::v1::StatusResponse* resp) const;
  void FillSessions(tutti::v1::SessionsResponse* resp) const;
  void FillStats(tutti::v1::StatsResponse* resp) const;
  absl::Status DoEvict(const tutti::v1::EvictRequest& req, tutti::v1::EvictResponse* resp);
  absl::Status DoRemoveNamespace(const tutti::v1::RemoveNamespaceRequest& req,
                                 tutti::v1::RemoveNamespaceResponse* resp);
  absl::Status DoVerify(grpc::ServerContext* ctx, const tutti::v1::VerifyRequest& req,
                        grpc::ServerWriter<tutti::v1::VerifyProgress>* writer);
  absl::Status DoDrain(const tutti::v1::DrainRequest& req, tutti::v1::DrainResponse* resp);
  absl::Status DoSetLogLevel(const tutti::v1::SetLogLevelRequest& req,
                             tutti::v1::SetLogLevelResponse* resp);
  absl::Status DoReportDevices(const tutti::v1::ReportDevicesRequest& req);
  absl::Status DoEndSession(const tutti::v1::EndSessionRequest& req,
                            tutti::v1::EndSessionResponse* resp);

  const DaemonInfo info_;
  store::BlockStore* const store_;
  SessionManager* const sessions_;
  Clock* const clock_;
  const int64_t start_ms_;
  CallGate* const gate_;
  std::atomic<bool> verifying_{false};
};

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_ADMIN_SERVICE_H_

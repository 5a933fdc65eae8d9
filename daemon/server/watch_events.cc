// KvCache.WatchEvents: the handler (a member of KvCacheService) and the stream loop.
#include "daemon/server/watch_events.h"

#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/server/grpc_status.h"
#include "daemon/server/kvcache_service.h"

namespace tutti::server {
namespace {

void AddEvents(const std::vector<store::BlockEvent>& events, tutti::v1::WatchEventsResponse* msg) {
  for (const store::BlockEvent& e : events) {
    tutti::v1::BlockEvent* out = msg->add_events();
    out->set_seq(e.seq);
    out->set_kind(e.kind == store::BlockEventKind::kStored ? tutti::v1::BLOCK_STORED
                                                           : tutti::v1::BLOCK_REMOVED);
    out->set_key(std::string(e.key.view()));
  }
}

}  // namespace

bool WatcherSet::TryAdd(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  return ids_.insert(session_id).second;
}

void WatcherSet::Remove(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  ids_.erase(session_id);
}

absl::Status StreamEvents(store::EventHub& hub, NamespaceId ns, uint64_t seq_at_attach,
                          const tutti::v1::WatchEventsRequest& req,
                          const std::function<std::optional<absl::Status>()>& ended,
                          const std::function<bool(const tutti::v1::WatchEventsResponse&)>& write) {
  bool resumed = false;
  store::EventHub::Cursor cursor = hub.Subscribe(ns, req.after_seq(), req.boot_id(), &resumed);
  if (!resumed) {
    // A first watch (0 and 0), another run's seq, or events gone: from the session's attach where
    // every event since is kept (a first watch then misses nothing: resumed), else from now.
    bool kept = false;
    store::EventHub::Cursor since_attach = hub.Subscribe(ns, seq_at_attach, hub.boot_id(), &kept);
    if (kept) cursor = since_attach;
    resumed = kept && req.after_seq() == 0 && req.boot_id() == 0;
  }
  std::vector<store::BlockEvent> batch;
  tutti::v1::WatchEventsResponse msg;
  msg.set_pool_id(hub.pool_id());
  msg.set_boot_id(hub.boot_id());
  msg.set_blocks_lost_at_start(hub.blocks_lost_at_start());
  msg.set_resumed(resumed);
  // The first message goes out at once, with whatever is already there.
  absl::Time deadline = absl::InfinitePast();
  for (bool first = true;; first = false) {
    if (!first) {
      if (std::optional<absl::Status> end = ended(); end.has_value()) return *end;
      deadline = absl::Now() + kWatchTick;
    }
    batch.clear();
    RETURN_IF_ERROR(hub.Next(&cursor, deadline, kMaxEventsPerMessage, &batch));
    if (!first && batch.empty()) continue;
    AddEvents(batch, &msg);
    if (!write(msg)) return absl::CancelledError("the client went away");
    msg.Clear();
  }
}

absl::Status KvCacheService::DoWatchEvents(const tutti::v1::WatchEventsRequest& req,
                                           grpc::ServerContext* ctx,
                                           grpc::ServerWriter<tutti::v1::WatchEventsResponse>* w) {
  // Not EnterSession: a stream that lasts as long as the session must not hold a call slot.
  ASSIGN_OR_RETURN(SessionRef session, sessions_->Touch(req.session_id(), req.session_token()));
  if (!watchers_.TryAdd(session->id)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session->id, " has a WatchEvents stream already; one per session"));
  }
  absl::Cleanup unwatch = [&] { watchers_.Remove(session->id); };
  auto ended = [&]() -> std::optional<absl::Status> {
    if (session->closed.load()) return absl::OkStatus();  // Detach, expiry, engine death
    if (ctx->IsCancelled()) return absl::CancelledError("the call was cancelled");
    if (!gate_->Enter().ok()) return absl::UnavailableError("tuttid is shutting down");
    return std::nullopt;
  };
  log::Get("server")->debug("session {}: watching events (after seq {})", session->id,
                            req.after_seq());
  return StreamEvents(store_->events(), session->ns, session->events_seq_at_attach, req, ended,
                      [w](const tutti::v1::WatchEventsResponse& m) { return w->Write(m); });
}

grpc::Status KvCacheService::WatchEvents(grpc::ServerContext* ctx,
                                         const tutti::v1::WatchEventsRequest* req,
                                         grpc::ServerWriter<tutti::v1::WatchEventsResponse>* w) {
  // Admitted by the gate, which it does not hold: see watch_events.h.
  if (absl::StatusOr<CallGate::Pass> pass = gate_->Enter(); !pass.ok()) {
    return ToGrpcStatus(pass.status());
  }
  return ToGrpcStatus(DoWatchEvents(*req, ctx, w));
}

}  // namespace tutti::server

#include "daemon/service/health.h"

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "tutti/v1/admin.grpc.pb.h"

namespace tutti::service {

Heartbeat::Check MakeLivenessCheck(const std::string& admin_target, const store::BlockStore* store,
                                   absl::Duration deadline, absl::Duration max_backlog_age) {
  std::shared_ptr<v1::Admin::Stub> admin = v1::Admin::NewStub(
      grpc::CreateChannel(admin_target, grpc::InsecureChannelCredentials()));
  return [admin, admin_target, store, deadline, max_backlog_age]() -> absl::Status {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    v1::StatusResponse response;
    const grpc::Status answer = admin->Status(&ctx, {}, &response);
    if (!answer.ok()) {
      return absl::UnavailableError(absl::StrCat("the operator API on ", admin_target,
                                                 " did not answer Status within ",
                                                 absl::FormatDuration(deadline), ": ",
                                                 answer.error_message()));
    }
    return CheckWriterMoves(store->Stats(), max_backlog_age);
  };
}

absl::Status CheckWriterMoves(const store::StoreStats& stats, absl::Duration max_backlog_age) {
  if (absl::Milliseconds(stats.write_backlog_age_ms) <= max_backlog_age) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      "the store's writer is stuck: the oldest of ", stats.write_backlog_blocks,
      " queued blocks has waited ", stats.write_backlog_age_ms, " ms (more than ",
      absl::FormatDuration(max_backlog_age), ")"));
}

std::string SummaryLine(uint32_t sessions, const store::StoreStats& stats) {
  return absl::StrCat("serving: ", sessions, sessions == 1 ? " session, " : " sessions, ",
                      stats.slots_used, " of ", stats.slots_total, " slots used, write backlog ",
                      stats.write_backlog_blocks, " blocks / ", stats.write_backlog_bytes >> 20,
                      " MiB (oldest ", stats.write_backlog_age_ms, " ms)");
}

Heartbeat::Summary MakeSummary(const store::BlockStore* store,
                               const server::SessionManager* sessions) {
  return [store, sessions] { return SummaryLine(sessions->num_sessions(), store->Stats()); };
}

}  // namespace tutti::service

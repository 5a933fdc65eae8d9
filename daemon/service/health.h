// What the heartbeat (heartbeat.h) checks and says for a running tuttid.
//
// Thread-safety: the returned functions may be called from any thread, while the store and the
// session manager they were given live.
#ifndef TUTTI_DAEMON_SERVICE_HEALTH_H_
#define TUTTI_DAEMON_SERVICE_HEALTH_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/server/sessions.h"
#include "daemon/service/heartbeat.h"
#include "daemon/store/block_store.h"

namespace tutti::service {

// Alive when (1) the operator API on `admin_target` ("unix:<path>") answers a Status call within
// `deadline` (gRPC's threads and the store's lock are not stuck), and (2) the store's write backlog
// has no block older than `max_backlog_age` (the writer moves: Capture refuses new blocks past the
// configured age bound, so an older one means a writer stuck in a sync or a write). Else
// UNAVAILABLE or DEADLINE_EXCEEDED naming what failed. `store` must outlive the check.
Heartbeat::Check MakeLivenessCheck(const std::string& admin_target, const store::BlockStore* store,
                                   absl::Duration deadline, absl::Duration max_backlog_age);

// The writer part of the liveness check: OK unless the oldest block of the write backlog in
// `stats` has waited longer than `max_backlog_age` (DEADLINE_EXCEEDED, saying how long).
absl::Status CheckWriterMoves(const store::StoreStats& stats, absl::Duration max_backlog_age);

// "serving: 2 sessions, 130 of 4096 slots used, write backlog 3 blocks / 6 MiB (oldest 14 ms)".
std::string SummaryLine(uint32_t sessions, const store::StoreStats& stats);

// SummaryLine of the store and sessions now; both must outlive it.
Heartbeat::Summary MakeSummary(const store::BlockStore* store,
                               const server::SessionManager* sessions);

}  // namespace tutti::service

#endif  // TUTTI_DAEMON_SERVICE_HEALTH_H_

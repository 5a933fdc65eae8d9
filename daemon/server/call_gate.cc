#include "daemon/server/call_gate.h"

namespace tutti::server {

absl::StatusOr<CallGate::Pass> CallGate::Enter() {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("tuttid is shutting down; retry after it restarts");
  ++in_flight_;
  return Pass(this);
}

void CallGate::Leave() {
  absl::MutexLock lock(&mu_);
  --in_flight_;
}

uint32_t CallGate::Close(absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  mu_.AwaitWithTimeout(absl::Condition(&idle), grace);
  return in_flight_;
}

uint32_t CallGate::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

}  // namespace tutti::server

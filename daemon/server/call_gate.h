// Admission of RPCs, so that shutdown can stop taking new calls, let the running ones finish, and
// then close the server at once. (gRPC's Server::Shutdown(deadline) alone also waits for idle
// client connections to go away: every connected engine would hold each stop for the whole grace.)
//
// Thread-safety: every method is thread-safe.
#ifndef TUTTI_DAEMON_SERVER_CALL_GATE_H_
#define TUTTI_DAEMON_SERVER_CALL_GATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/server/grpc_status.h"
#include "grpcpp/support/status.h"

namespace tutti::server {

class CallGate {
 public:
  // One admitted call; the gate counts it until the pass is destroyed.
  class Pass {
   public:
    explicit Pass(CallGate* gate) : gate_(gate) {}
    Pass(Pass&& other) noexcept : gate_(other.gate_) { other.gate_ = nullptr; }
    Pass& operator=(Pass&&) = delete;
    ~Pass() {
      if (gate_ != nullptr) gate_->Leave();
    }

   private:
    CallGate* gate_;
  };

  // Admits a call, or UNAVAILABLE once Close has begun (the client should retry later).
  absl::StatusOr<Pass> Enter();

  // Stops admitting calls and waits until every admitted call has finished or `grace` has passed.
  // Returns how many calls were still running.
  uint32_t Close(absl::Duration grace);

  uint32_t in_flight() const;

 private:
  void Leave();

  mutable absl::Mutex mu_;
  uint32_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// Runs `body` (returning absl::Status) as one admitted call of `gate` and translates its status:
// the edge of every RPC handler.
template <typename Body>
grpc::Status ServeCall(CallGate* gate, Body&& body) {
  absl::StatusOr<CallGate::Pass> pass = gate->Enter();
  if (!pass.ok()) return ToGrpcStatus(pass.status());
  return ToGrpcStatus(body());
}

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_CALL_GATE_H_

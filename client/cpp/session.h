// Internal: one engine's attachment to tuttid, kept alive and re-made when tuttid comes back.
//
// A background thread calls KeepAlive every session_ttl / 4, and at once when the connection to
// tuttid drops (a second thread watches the channel), so an idle engine notices a restart within
// about a second rather than at the next KeepAlive. When tuttid is unreachable or no longer knows
// the session (it restarted), the session is "lost": calls get UNAVAILABLE, and the thread
// re-sends the same AttachRequest (backing off from 50 ms to 1 s) until tuttid answers; then the
// session id changes and the generation grows by one. Leases and transfers of an older generation
// are void.
//
// Thread-safety: all methods are thread-safe.
#ifndef TUTTI_CLIENT_CPP_SESSION_H_
#define TUTTI_CLIENT_CPP_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "tutti/client.h"
#include "tutti/v1/kvcache.grpc.pb.h"

namespace tutti::client::internal {

struct SessionOptions {
  std::string socket_path;
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration call_timeout = absl::Seconds(120);
  bool reattach = true;
};

class Session {
 public:
  // Connects and attaches with `request`, handing `fds` (the host regions' descriptors, by
  // fd_index; none in cuda mode) over before each Attach, re-attaches included: the session
  // keeps them. UNAVAILABLE when tuttid cannot be reached (the message says why); otherwise the
  // handoff's or tuttid's error for the Attach.
  static absl::StatusOr<std::unique_ptr<Session>> Open(const SessionOptions& options,
                                                       tutti::v1::AttachRequest request,
                                                       std::vector<UniqueFd> fds);
  // Stops the thread and detaches (best effort).
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  struct Current {
    uint64_t session_id = 0;
    std::string token;  // the Attach's session_token: every call proves the session with it
    uint64_t generation = 0;
    // Names the session in a request of the engine API: its id and its token.
    template <class Request>
    void Name(Request* request) const {
      request->set_session_id(session_id);
      request->set_session_token(token);
    }
  };
  // The live session. UNAVAILABLE while it is lost; FAILED_PRECONDITION after Detach.
  absl::StatusOr<Current> current() const;

  tutti::v1::KvCache::Stub& stub() { return *stub_; }
  // A context with the call deadline.
  std::unique_ptr<grpc::ClientContext> NewContext() const;

  // Reports how a call of `generation` ended: UNAVAILABLE marks the session lost (tuttid is gone)
  // and NOT_FOUND makes the thread check the session now (tuttid may have restarted).
  void Observe(const absl::Status& status, uint64_t generation);

  // Stops the thread and detaches. Idempotent; OK when already detached or lost.
  absl::Status Detach();

  SessionInfo info() const;

 private:
  enum class State { kAttached, kLost, kDetached };

  Session(const SessionOptions& options, std::shared_ptr<grpc::Channel> channel,
          tutti::v1::AttachRequest request, std::vector<UniqueFd> fds);
  absl::Status AttachNow(absl::Duration deadline);
  void MarkLost(uint64_t generation, const absl::Status& why);
  void Loop();
  // Wakes Loop when the channel leaves READY (tuttid closed the connection or died).
  void WatchChannel();
  // One round of the loop; returns how long to sleep before the next.
  absl::Duration Tick(absl::Duration backoff);
  void StopThread();

  const SessionOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<tutti::v1::KvCache::Stub> stub_;
  const tutti::v1::AttachRequest request_;  // without its credential
  const std::vector<UniqueFd> fds_;

  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kLost;
  uint64_t session_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::string token_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  tutti::v1::AttachResponse attach_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
  std::thread watcher_;
};

}  // namespace tutti::client::internal

#endif  // TUTTI_CLIENT_CPP_SESSION_H_

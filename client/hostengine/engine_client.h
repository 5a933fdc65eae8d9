// A thin synchronous client of tuttid's KvCache service for one engine session, with the
// session kept alive by a background thread. For tuttictl bench and the daemon-level tests; not
// the engine client library (that one hides gRPC and protobuf).
//
// Errors are the daemon's gRPC status as an absl::Status of the same code and message.
//
// Thread-safety: every method may be called from any thread, concurrently, except that Attach and
// Detach must not race with each other or with the destructor.
#ifndef TUTTI_CLIENT_HOSTENGINE_ENGINE_CLIENT_H_
#define TUTTI_CLIENT_HOSTENGINE_ENGINE_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "grpcpp/channel.h"
#include "tutti/v1/kvcache.grpc.pb.h"

namespace tutti::hostengine {

class EngineClient {
 public:
  // `channel` (from ConnectToTuttid to `socket_path`) is shared; `socket_path` also locates the
  // handoff socket. Every call gets a deadline of `call_timeout`.
  EngineClient(std::shared_ptr<grpc::Channel> channel, std::string socket_path,
               absl::Duration call_timeout = absl::Seconds(120));
  // Stops the keep-alive thread and detaches (best effort) if attached.
  ~EngineClient();
  EngineClient(const EngineClient&) = delete;
  EngineClient& operator=(const EngineClient&) = delete;

  // Hands `fds` over (HandOff), attaches with the credential, and starts a thread calling
  // KeepAlive every session_ttl_ms / 4. FAILED_PRECONDITION if already attached; otherwise the
  // handoff's or the daemon's error.
  absl::StatusOr<tutti::v1::AttachResponse> Attach(tutti::v1::AttachRequest request,
                                                   absl::Span<const int> fds);
  // A credential for `fds` from the handoff socket, for raw requests (bad-input tests).
  absl::StatusOr<std::string> HandOff(absl::Span<const int> fds) const;
  // Stops the keep-alive thread and detaches. FAILED_PRECONDITION if not attached.
  absl::Status Detach();

  bool attached() const { return session_id_.load() != 0; }
  uint64_t session_id() const { return session_id_.load(); }
  // The Attach's session_token ("" when not attached): every call of the session carries it.
  std::string session_token() const;
  // Names this client's session in a raw request: its id and its token.
  template <class Request>
  void Name(Request* request) const {
    request->set_session_id(session_id());
    request->set_session_token(session_token());
  }
  // KeepAlive calls that failed since Attach (the session may have expired).
  uint64_t keepalive_failures() const { return keepalive_failures_.load(); }

  absl::StatusOr<tutti::v1::LookupResponse> Lookup(absl::Span<const Key> keys);

  struct RetrieveResult {
    std::vector<uint32_t> layers;  // layers reported done, in the order they came
    std::vector<uint32_t> failed;  // indices into the request's blocks, sorted, unique
  };
  // Retrieves layers [layer_begin, layer_end) of keys[i] into engine block engine_blocks[i],
  // consuming the progress stream to its end. Precondition: keys.size() == engine_blocks.size().
  absl::StatusOr<RetrieveResult> Retrieve(uint64_t lease_id, absl::Span<const Key> keys,
                                          absl::Span<const uint32_t> engine_blocks,
                                          uint32_t layer_begin = 0, uint32_t layer_end = 0);

  // Stores keys[i] from engine block engine_blocks[i]; one outcome per key.
  absl::StatusOr<std::vector<tutti::v1::StoreOutcome>> Store(
      absl::Span<const Key> keys, absl::Span<const uint32_t> engine_blocks, bool wait_durable,
      uint32_t layer_begin = 0, uint32_t layer_end = 0);

  absl::Status Release(uint64_t lease_id);

  // The raw stub, for requests the helpers above cannot express (bad-input tests).
  tutti::v1::KvCache::Stub& stub() { return *stub_; }
  // A context with this client's deadline.
  std::unique_ptr<grpc::ClientContext> NewContext() const;

 private:
  void KeepAliveLoop(uint64_t session_id, std::string token, absl::Duration period);
  void StopKeepAlive();

  std::shared_ptr<grpc::Channel> channel_;
  const std::string socket_path_;
  std::unique_ptr<tutti::v1::KvCache::Stub> stub_;
  const absl::Duration call_timeout_;
  std::atomic<uint64_t> session_id_{0};
  std::atomic<uint64_t> keepalive_failures_{0};

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::thread keepalive_;
};

}  // namespace tutti::hostengine

#endif  // TUTTI_CLIENT_HOSTENGINE_ENGINE_CLIENT_H_

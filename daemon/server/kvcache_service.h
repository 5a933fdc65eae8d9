// The engine API (tutti.v1.KvCache) over the block store and the session manager.
//
// Attach redeems the credential of the engine's handoff (common/handoff.h): missing,
// unknown, used or expired -> PERMISSION_DENIED. Its text fields must be printable and short
// (INVALID_ARGUMENT naming the field); the namespace and the memory are validated before anything
// is journaled; limits (sessions in all and per user, namespaces) -> RESOURCE_EXHAUSTED naming
// the limit. The namespace belongs to the attaching user (the credential's uid), or to the
// engines giving the same namespace_secret, or to every user under namespace_sharing "host"
// (KvCacheOptions; docs/security.md "Namespaces"). A session may have max_calls_per_session calls
// in flight; more -> RESOURCE_EXHAUSTED.
//
// Every request is validated before it touches the store: unknown session or lease -> NOT_FOUND;
// malformed keys (not 16 bytes), duplicate keys or engine blocks, engine blocks outside the
// session's memory, a bad layer range, or more than max_blocks_per_call blocks -> INVALID_ARGUMENT;
// keys not pinned under the lease, memory the daemon cannot use in this mode ->
// FAILED_PRECONDITION; too many sessions -> RESOURCE_EXHAUSTED. A bad request never affects other
// requests or sessions. Any request of a session counts as its keep-alive.
//
// Memory-less sessions (no regions, no placements, num_blocks 0; memory given in part is
// INVALID_ARGUMENT naming the missing field) may Lookup, Release and ReportCompute; their Retrieve
// and Store are FAILED_PRECONDITION. engine_group: empty or 16 to 64 bytes (INVALID_ARGUMENT). A
// Retrieve claims lease_id and lease_ids (at most 1024, none twice: INVALID_ARGUMENT) all or none,
// its own or a group peer's (SessionManager::ClaimLeases); all of them end with the Retrieve.
//
// Thread-safety: gRPC calls the handlers from many threads at once; they share only the store and
// the session manager, both thread-safe.
//
// Load or recompute (docs/decision.md): a Lookup with prompt_tokens gets the advisor's split
// (load_blocks and the predictions) from the tier of each hit and the store's read bandwidth
// meter; ReportCompute feeds the advisor the engine's measured compute times and TTFTs.
// prompt_tokens above 16777216 and bad samples are INVALID_ARGUMENT naming the field.
//
// GPU mode (sessions whose EngineIo is device memory): a session has at most one Retrieve in
// flight, and with ready words at most one Store; another is FAILED_PRECONDITION and writes no
// word. Once a Retrieve is admitted, every ready word of its layer range is written with its ticket
// whatever happens (copied, failed, cancelled, bad request; all layers when the range itself is
// bad), unless the session was closed (its engine is gone). An admitted Store writes its ticket
// into word num_layers once its blocks are captured, or when it ends without capturing.
#ifndef TUTTI_DAEMON_SERVER_KVCACHE_SERVICE_H_
#define TUTTI_DAEMON_SERVER_KVCACHE_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/decision/advisor.h"
#include "daemon/engine/engine_io.h"
#include "daemon/engine/engine_memory.h"
#include "daemon/server/call_gate.h"
#include "daemon/server/credentials.h"
#include "daemon/server/engine_watcher.h"
#include "daemon/server/sessions.h"
#include "daemon/server/watch_events.h"
#include "daemon/store/block_store.h"
#include "tutti/v1/kvcache.grpc.pb.h"

namespace tutti::server {

// Opens the engine memory an Attach request names (regions, placements, ready words), shaped as
// `ns` says (objects per block, object length), with the descriptors the engine handed over
// (`credential`; the opener may take them). The seam between host mode and GPU mode: the
// request's terms in, an engine::EngineIo (daemon/engine/engine_io.h) out; GPU mode's is
// daemon/server/gpu_memory_opener.h.
using MemoryOpener = std::function<absl::StatusOr<std::unique_ptr<engine::EngineIo>>(
    const tutti::v1::AttachRequest& request, const store::NamespaceInfo& ns,
    Credential& credential)>;

// Host mode: every region must be host_shm (HostMemory) naming one of the credential's
// descriptors by fd_index, each descriptor used once. Any cuda_ipc region is FAILED_PRECONDITION
// ("cuda_ipc needs a GPU build/daemon in cuda mode"); ready_words, a region with no kind, a bad
// fd_index or name are INVALID_ARGUMENT; then HostMemory::Create's errors.
MemoryOpener HostMemoryOpener();

struct KvCacheOptions {
  uint32_t max_blocks_per_call = 2048;
  uint32_t max_calls_per_session = 64;
  // security.namespace_sharing: "user" (a namespace is the attaching user's own) or "host" (every
  // user's engines share namespaces, as before owners existed). An Attach with a namespace_secret
  // (16 to 64 bytes, else INVALID_ARGUMENT) shares its namespace with the engines that give the
  // same secret, and with no other, either way.
  std::string namespace_sharing = "user";
};

class KvCacheService final : public tutti::v1::KvCache::Service {
 public:
  // `store`, `sessions`, `credentials`, `gate` and `watcher` must outlive the service. Every call
  // passes through `gate`. With a `watcher`, an Attach with a nonzero engine_pid is watched: the
  // session closes when the process that made the handoff exits. Without one, engine_pid is
  // ignored. `advisor` (load or recompute) must outlive the service too; without one the service
  // keeps its own, enabled.
  KvCacheService(const KvCacheOptions& options, store::BlockStore* store, SessionManager* sessions,
                 CredentialTable* credentials, MemoryOpener opener, CallGate* gate,
                 EngineWatcher* watcher = nullptr, decision::Advisor* advisor = nullptr);

  grpc::Status Attach(grpc::ServerContext* ctx, const tutti::v1::AttachRequest* req,
                      tutti::v1::AttachResponse* resp) override;
  grpc::Status KeepAlive(grpc::ServerContext* ctx, const tutti::v1::KeepAliveRequest* req,
                         tutti::v1::KeepAliveResponse* resp) override;
  grpc::Status Lookup(grpc::ServerContext* ctx, const tutti::v1::LookupRequest* req,
                      tutti::v1::LookupResponse* resp) override;
  // Lookup for a caller the kernel says is user `peer_uid` (the lookup socket, lookup_server.h):
  // the same call through the same gate, but a session of another user is NOT_FOUND exactly as an
  // unknown one.
  absl::Status LookupAs(uint32_t peer_uid, const tutti::v1::LookupRequest& req,
                        tutti::v1::LookupResponse* resp);
  // Streams one RetrieveProgress per layer; stops early (CANCELLED) if the client goes away, the
  // server shuts down, or the session is closed. The lease ends when the stream ends, however.
  grpc::Status Retrieve(grpc::ServerContext* ctx, const tutti::v1::RetrieveRequest* req,
                        grpc::ServerWriter<tutti::v1::RetrieveProgress>* writer) override;
  grpc::Status Store(grpc::ServerContext* ctx, const tutti::v1::StoreRequest* req,
                     tutti::v1::StoreResponse* resp) override;
  grpc::Status Release(grpc::ServerContext* ctx, const tutti::v1::ReleaseRequest* req,
                       tutti::v1::ReleaseResponse* resp) override;
  grpc::Status Detach(grpc::ServerContext* ctx, const tutti::v1::DetachRequest* req,
                      tutti::v1::DetachResponse* resp) override;
  grpc::Status ReportCompute(grpc::ServerContext* ctx, const tutti::v1::ReportComputeRequest* req,
                             tutti::v1::ReportComputeResponse* resp) override;
  // The session's namespace's block events (watch_events.h, docs/events.md): unknown session ->
  // NOT_FOUND, a second stream of one session -> FAILED_PRECONDITION. Ends OK when the session
  // ends, CANCELLED when the client goes away, UNAVAILABLE at shutdown, RESOURCE_EXHAUSTED for a
  // subscriber more than limits.max_pending_events behind. Takes no call slot of the session.
  grpc::Status WatchEvents(grpc::ServerContext* ctx, const tutti::v1::WatchEventsRequest* req,
                           grpc::ServerWriter<tutti::v1::WatchEventsResponse>* writer) override;

 private:
  // Emits one progress message; false when the stream is gone.
  using Emit = std::function<bool(const tutti::v1::RetrieveProgress&)>;

  absl::Status DoAttach(const tutti::v1::AttachRequest& req, tutti::v1::AttachResponse* resp);
  // The session of a call, admitted as one of its max_calls_per_session (and marked alive); the
  // slot is returned when the SessionCall is destroyed.
  class SessionCall {
   public:
    explicit SessionCall(SessionRef session) : session_(std::move(session)) {}
    SessionCall(SessionCall&&) = default;
    SessionCall& operator=(SessionCall&&) = delete;
    ~SessionCall() {
      if (session_ != nullptr) session_->calls.fetch_sub(1);
    }
    const SessionRef& session() const { return session_; }

   private:
    SessionRef session_;
  };
  // The session named by a request, if `token` is its token (SessionManager::Touch), holding a
  // call slot. NOT_FOUND as for an unknown session; RESOURCE_EXHAUSTED past max_calls_per_session.
  // With `uid`, the session must be that user's too (SessionManager::Touch).
  absl::StatusOr<SessionCall> EnterSession(uint64_t session_id, std::string_view token,
                                           std::optional<uint32_t> uid = std::nullopt);
  absl::Status DoLookup(const tutti::v1::LookupRequest& req, tutti::v1::LookupResponse* resp,
                        std::optional<uint32_t> uid = std::nullopt);
  // Sets resp's load_blocks and, when the advisor predicts, the predictions (kvcache_decision.cc).
  void AdviseLookup(const SessionState& session, uint32_t prompt_tokens,
                    const std::vector<bool>& hit_in_dram, tutti::v1::LookupResponse* resp);
  absl::Status DoReportCompute(const tutti::v1::ReportComputeRequest& req,
                               tutti::v1::ReportComputeResponse* resp);
  // Layers [*next, *end) are the admitted Retrieve's words not yet written; RetrieveLayers
  // advances *next as layers land and narrows *end once the layer range is known. RetrieveLayers
  // parses the request, claims its leases and runs the datapath's retrieve transfer
  // (datapath::RunRetrieve: the store prepares and finishes, its reader reads) into the session's
  // EngineIo, streaming the progress it is handed.
  absl::Status DoRetrieve(const tutti::v1::RetrieveRequest& req, grpc::ServerContext* ctx,
                          const Emit& emit);
  absl::Status RetrieveLayers(const tutti::v1::RetrieveRequest& req, const SessionState& session,
                              grpc::ServerContext* ctx, const Emit& emit, uint32_t* next,
                              uint32_t* end);
  absl::Status DoStore(const tutti::v1::StoreRequest& req, tutti::v1::StoreResponse* resp);
  absl::Status StoreBlocks(const tutti::v1::StoreRequest& req, const SessionState& session,
                           bool* signaled, tutti::v1::StoreResponse* resp);
  absl::Status DoWatchEvents(const tutti::v1::WatchEventsRequest& req, grpc::ServerContext* ctx,
                             grpc::ServerWriter<tutti::v1::WatchEventsResponse>* writer);
  // Watches the engine's process for session `session`; closes the session if that fails.
  absl::Status WatchEngine(const SessionRef& session);

  const KvCacheOptions options_;
  store::BlockStore* const store_;
  SessionManager* const sessions_;
  CredentialTable* const credentials_;
  const MemoryOpener opener_;
  CallGate* const gate_;
  EngineWatcher* const watcher_;
  std::unique_ptr<decision::Advisor> own_advisor_;  // when none was given
  decision::Advisor* const advisor_;
  WatcherSet watchers_;  // sessions with a WatchEvents stream
};

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_KVCACHE_SERVICE_H_

// The engine API (tutti.v1.KvCache) over the block store and the session manager.
//
// Every request is validated before it touches the store: unknown session or lease -> NOT_FOUND;
// malformed keys (not 16 bytes), duplicate keys or engine blocks, engine blocks outside the
// session's memory, a bad layer range, or more than max_blocks_per_call blocks -> INVALID_ARGUMENT;
// keys not pinned under the lease, memory the daemon cannot use in this mode ->
// FAILED_PRECONDITION; too many sessions -> RESOURCE_EXHAUSTED. A bad request never affects other
// requests or sessions. Any request of a session counts as its keep-alive.
//
// Thread-safety: gRPC calls the handlers from many threads at once; they share only the store and
// the session manager, both thread-safe.
#ifndef TUTTI_DAEMON_SERVER_KVCACHE_SERVICE_H_
#define TUTTI_DAEMON_SERVER_KVCACHE_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/engine/engine_memory.h"
#include "daemon/server/call_gate.h"
#include "daemon/server/sessions.h"
#include "daemon/store/block_store.h"
#include "tutti/v1/kvcache.grpc.pb.h"

namespace tutti::server {

// Opens the engine memory an Attach request names, shaped as `ns` says (objects per block,
// object length). The seam between host mode and GPU mode.
using MemoryOpener = std::function<absl::StatusOr<std::unique_ptr<engine::EngineMemory>>(
    const tutti::v1::AttachRequest& request, const store::NamespaceInfo& ns)>;

// Host mode: every region must be host_shm (HostMemory). Any cuda_ipc region is
// FAILED_PRECONDITION ("cuda_ipc needs a GPU build/daemon in cuda mode"); a region with no kind is
// INVALID_ARGUMENT; then HostMemory::Create's errors.
MemoryOpener HostMemoryOpener();

struct KvCacheOptions {
  uint32_t max_blocks_per_call = 2048;
};

class KvCacheService final : public tutti::v1::KvCache::Service {
 public:
  // `store`, `sessions` and `gate` must outlive the service. Every call passes through `gate`.
  KvCacheService(const KvCacheOptions& options, store::BlockStore* store, SessionManager* sessions,
                 MemoryOpener opener, CallGate* gate);

  grpc::Status Attach(grpc::ServerContext* ctx, const tutti::v1::AttachRequest* req,
                      tutti::v1::AttachResponse* resp) override;
  grpc::Status KeepAlive(grpc::ServerContext* ctx, const tutti::v1::KeepAliveRequest* req,
                         tutti::v1::KeepAliveResponse* resp) override;
  grpc::Status Lookup(grpc::ServerContext* ctx, const tutti::v1::LookupRequest* req,
                      tutti::v1::LookupResponse* resp) override;
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

 private:
  // Emits one progress message; false when the stream is gone.
  using Emit = std::function<bool(const tutti::v1::RetrieveProgress&)>;

  absl::Status DoAttach(const tutti::v1::AttachRequest& req, tutti::v1::AttachResponse* resp);
  absl::Status DoLookup(const tutti::v1::LookupRequest& req, tutti::v1::LookupResponse* resp);
  absl::Status DoRetrieve(const tutti::v1::RetrieveRequest& req, grpc::ServerContext* ctx,
                          const Emit& emit);
  absl::Status DoStore(const tutti::v1::StoreRequest& req, tutti::v1::StoreResponse* resp);

  const KvCacheOptions options_;
  store::BlockStore* const store_;
  SessionManager* const sessions_;
  const MemoryOpener opener_;
  CallGate* const gate_;
};

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_KVCACHE_SERVICE_H_

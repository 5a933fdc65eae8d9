// A complete in-process tuttid for service tests: the real BlockStore on the "memory" I/O backend,
// a SessionManager on a ManualClock, both services and the Server on a unix socket under /tmp,
// plus a host-shm "engine" whose KV memory the tests fill and check.
#ifndef TUTTI_DAEMON_SERVER_SERVICE_TEST_ENV_H_
#define TUTTI_DAEMON_SERVER_SERVICE_TEST_ENV_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/stats.h"
#include "common/types.h"
#include "daemon/decision/advisor.h"
#include "daemon/io/memory_backend.h"
#include "daemon/server/admin_service.h"
#include "daemon/server/credentials.h"
#include "daemon/server/handoff_server.h"
#include "daemon/server/kvcache_service.h"
#include "daemon/server/server.h"
#include "daemon/server/sessions.h"
#include "daemon/store/block_store.h"
#include "tutti/v1/admin.grpc.pb.h"
#include "tutti/v1/kvcache.grpc.pb.h"

namespace tutti::server::testing {

// The test namespace: 2 layers, K and V, 16 tokens x 1 head x 64 dims x 2 bytes = 2 KiB objects.
inline constexpr uint32_t kLayers = 2, kParts = 2, kObjects = kLayers * kParts;
inline constexpr uint32_t kObjectLen = 2048;
inline constexpr uint32_t kEngineBlocks = 8;
inline constexpr uint64_t kBlockBytes = uint64_t{kObjects} * kObjectLen;  // fused per block

// An engine's KV cache in POSIX shared memory: block b's object o at b * kBlockBytes + o *
// kObjectLen.
class ShmEngine {
 public:
  ShmEngine();
  ~ShmEngine();
  const std::string& name() const { return name_; }
  int fd() const { return fd_; }
  uint8_t* object(uint32_t block, uint32_t obj) {
    return base_ + block * kBlockBytes + uint64_t{obj} * kObjectLen;
  }
  // Fills every object of `block` with bytes derived from `seed`; Check compares.
  void Fill(uint32_t block, uint64_t seed);
  bool Check(uint32_t block, uint64_t seed, uint32_t layer_begin = 0, uint32_t layer_end = kLayers);
  void Zero(uint32_t block);
  // An Attach request for this memory, without a credential (ServiceEnv::AttachRequest adds one).
  tutti::v1::AttachRequest AttachRequest(const std::string& engine_id = "test-engine") const;

 private:
  std::string name_;
  uint8_t* base_ = nullptr;
  int fd_ = -1;
};

tutti::v1::Namespace TestNamespace();
std::string KeyBytes(uint64_t v);

struct EnvOptions {
  uint32_t max_sessions = 4;
  uint32_t max_blocks_per_call = 16;
  SessionManager::Options sessions;  // max_sessions is taken from above
  uint32_t max_calls_per_session = 64;
  uint32_t max_namespaces = 1024;
  uint32_t max_namespaces_per_user = 64;   // StoreOptions's
  double pool_share_per_user = 1.0;        // StoreOptions's
  std::string namespace_sharing = "user";  // KvCacheOptions's
  MemoryOpener opener;  // empty: HostMemoryOpener()
  uint64_t dram_bytes = 0;  // the store's DRAM tier; 0: off
  uint64_t retrieve_staging_bytes = 4ull << 20;  // StoreOptions's
  // StoreOptions's: one 4 KiB read in flight per pool file, so concurrent Retrieves queue and
  // take turns in every test.
  uint64_t max_read_bytes_in_flight = 4096;
  uint64_t max_write_backlog_bytes = 0;  // StoreOptions's; 0: store staging
  std::string admission = "all";         // StoreOptions's
  std::function<GpuLayerCounts()> gpu_layers;  // RegisterGpuLayerStats' (empty: host mode)
  uint64_t gpu_memory_bytes = 0;               // DaemonInfo::gpu_memory_bytes
  bool decision = true;  // the advisor enabled (datapath.decision "auto") or off
  // The store's read bandwidth priors (no test read is large enough to be measured).
  datapath::BandwidthOptions bandwidth;
};

class ServiceEnv {
 public:
  explicit ServiceEnv(const EnvOptions& options = {});
  ~ServiceEnv();

  tutti::v1::KvCache::Stub& kv() { return *kv_; }
  tutti::v1::Admin::Stub& admin() { return *admin_; }
  ManualClock& clock() { return session_clock_; }
  SessionManager& sessions() { return *sessions_; }
  io::MemoryBackend& backend() { return *backend_; }
  store::BlockStore& store() { return *store_; }
  const std::string& socket_path() const { return socket_path_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  Server& server() { return *server_; }
  KvCacheService& kv_service() { return *kv_service_; }

  // Hands `engine`'s memory over on the handoff socket and returns its AttachRequest with the
  // credential (fd_index 0). An empty credential after a failed EXPECT.
  tutti::v1::AttachRequest AttachRequest(const ShmEngine& engine,
                                         const std::string& engine_id = "test-engine");
  // Attaches `engine`; returns the session id (0 after a failed EXPECT). The env keeps the
  // session's token (Token, Name).
  uint64_t Attach(const ShmEngine& engine);
  // Keeps the token of a session attached by the test itself; returns its id.
  uint64_t Remember(const tutti::v1::AttachResponse& attached);
  // The token of a session this env attached or remembered ("" for any other id).
  std::string Token(uint64_t session) const;
  // Names `session` in `req` as its engine does: its id and its token.
  template <class Request>
  void Name(uint64_t session, Request* req) const {
    req->set_session_id(session);
    req->set_session_token(Token(session));
  }
  CredentialTable& credentials() { return credentials_; }
  const stats::Registry& stats() const { return stats_; }
  DeviceHealthBoard& device_health() { return device_health_; }

 private:
  std::string state_dir_;
  std::string socket_dir_;
  std::string socket_path_;
  ManualClock session_clock_{1'000'000};
  io::MemoryBackend* backend_ = nullptr;  // owned by the store
  CallGate gate_;
  DeviceHealthBoard device_health_;
  CredentialTable credentials_{CredentialTable::Options{}, Clock::Real()};
  std::unique_ptr<HandoffServer> handoff_;
  std::unique_ptr<store::BlockStore> store_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<decision::Advisor> advisor_;
  stats::Registry stats_;  // as tuttid's main fills it: the store's, sessions', ... figures
  std::unique_ptr<KvCacheService> kv_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tutti::v1::KvCache::Stub> kv_;
  std::unique_ptr<tutti::v1::Admin::Stub> admin_;
  // Sessions' tokens: tests attach and name sessions from several threads at once.
  mutable absl::Mutex tokens_mu_;
  std::map<uint64_t, std::string> tokens_ ABSL_GUARDED_BY(tokens_mu_);
};

}  // namespace tutti::server::testing

#endif  // TUTTI_DAEMON_SERVER_SERVICE_TEST_ENV_H_

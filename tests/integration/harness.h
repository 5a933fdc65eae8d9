// Shared pieces of the daemon-level tests: attaching a host-mode engine to a running tuttid, and
// the Admin calls, as StatusOr.
//
// Thread-safety: as the underlying HostEngine and EngineClient.
#ifndef TUTTI_TESTS_INTEGRATION_HARNESS_H_
#define TUTTI_TESTS_INTEGRATION_HARNESS_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "client/hostengine/engine_client.h"
#include "client/hostengine/host_engine.h"
#include "client/hostengine/kv_shape.h"
#include "tests/integration/tuttid_process.h"
#include "tutti/v1/admin.pb.h"

namespace tutti::testing {

// 4 layers x 2 KV heads x 64 dims x 2 bytes x 16 tokens: 4 KiB objects, 8 per block (32 KiB).
hostengine::KvShape SmallShape();

// An engine attached to a daemon: its shared memory, its client (keep-alive running) and the
// daemon's answer. Destroying it detaches (best effort) and removes the shared memory.
struct EngineSession {
  std::unique_ptr<hostengine::HostEngine> engine;
  std::unique_ptr<hostengine::EngineClient> client;
  tutti::v1::AttachResponse attach;
};

// Creates a HostEngine of `shape` x `num_blocks` and attaches it to `daemon`.
absl::StatusOr<EngineSession> AttachEngine(const TuttidProcess& daemon,
                                           const hostengine::KvShape& shape, uint32_t num_blocks,
                                           const hostengine::EngineIdentity& id = {});

absl::StatusOr<tutti::v1::StatusResponse> AdminStatus(TuttidProcess& daemon);
absl::StatusOr<tutti::v1::StatsResponse> AdminStats(TuttidProcess& daemon);
absl::StatusOr<tutti::v1::SessionsResponse> AdminSessions(TuttidProcess& daemon);
absl::StatusOr<tutti::v1::EvictResponse> AdminEvict(TuttidProcess& daemon, uint64_t namespace_id,
                                                    bool all);

// The seed of a test's randomness: $TUTTI_TEST_SEED if set, else from the clock. Printed.
uint64_t TestSeed();

}  // namespace tutti::testing

#endif  // TUTTI_TESTS_INTEGRATION_HARNESS_H_

#include "tests/integration/harness.h"

#include <cstdio>
#include <cstdlib>

#include "absl/time/clock.h"
#include "common/connect.h"
#include "grpcpp/client_context.h"

namespace tutti::testing {
namespace {

template <typename Request, typename Response>
absl::StatusOr<Response> CallAdmin(
    TuttidProcess& daemon,
    grpc::Status (tutti::v1::Admin::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const Request& request) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  Response response;
  absl::Status s = FromGrpc((daemon.admin().*method)(&ctx, request, &response));
  if (!s.ok()) return s;
  return response;
}

}  // namespace

hostengine::KvShape SmallShape() {
  hostengine::KvShape s;
  s.layers = 4;
  s.kv_heads = 2;
  s.head_dim = 64;
  s.dtype_bytes = 2;
  s.block_tokens = 16;
  return s;
}

absl::StatusOr<EngineSession> AttachEngine(const TuttidProcess& daemon,
                                           const hostengine::KvShape& shape, uint32_t num_blocks,
                                           const hostengine::EngineIdentity& id) {
  EngineSession s;
  auto engine = hostengine::HostEngine::Create(shape, num_blocks, "tutti-it");
  if (!engine.ok()) return engine.status();
  s.engine = std::move(*engine);
  s.client = std::make_unique<hostengine::EngineClient>(daemon.channel(), daemon.socket(),
                                                        absl::Seconds(60));
  auto attach = s.client->Attach(s.engine->MakeAttachRequest(id), s.engine->fds());
  if (!attach.ok()) return attach.status();
  s.attach = *attach;
  return s;
}

absl::StatusOr<tutti::v1::StatusResponse> AdminStatus(TuttidProcess& daemon) {
  return CallAdmin(daemon, &tutti::v1::Admin::Stub::Status, tutti::v1::StatusRequest());
}
absl::StatusOr<tutti::v1::StatsResponse> AdminStats(TuttidProcess& daemon) {
  return CallAdmin(daemon, &tutti::v1::Admin::Stub::Stats, tutti::v1::StatsRequest());
}
absl::StatusOr<tutti::v1::SessionsResponse> AdminSessions(TuttidProcess& daemon) {
  return CallAdmin(daemon, &tutti::v1::Admin::Stub::Sessions, tutti::v1::SessionsRequest());
}
absl::StatusOr<tutti::v1::EvictResponse> AdminEvict(TuttidProcess& daemon, uint64_t namespace_id,
                                                    bool all) {
  tutti::v1::EvictRequest request;
  request.set_namespace_id(namespace_id);
  request.set_all(all);
  return CallAdmin(daemon, &tutti::v1::Admin::Stub::Evict, request);
}

uint64_t TestSeed() {
  uint64_t seed = 0;
  if (const char* env = getenv("TUTTI_TEST_SEED"); env != nullptr) {
    seed = strtoull(env, nullptr, 0);
  } else {
    seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) % 1000000007ull;
  }
  fprintf(stderr, "test seed: %llu (rerun with TUTTI_TEST_SEED=%llu)\n",
          static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace tutti::testing

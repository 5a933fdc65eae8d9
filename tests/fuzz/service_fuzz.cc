// Fuzz target: the engine API through the service layer. One in-process tuttid (ServiceEnv: the
// real store on the memory backend, the gRPC server on a unix socket) and one attached host-shm
// engine live for the whole run. An input is one request: byte 0 picks the method, byte 1 bit 0
// puts the env's own session id into it (so the handlers past the session check are reached), the
// rest is the serialized request; byte 1 bit 1 makes Retrieve and Release use the lease of a
// Lookup of the request's keys, done first (so Retrieve gets past the lease check). Attach is
// fuzzed too, and is expected to fail cleanly (fuzzed bytes cannot name the engine's shm object).
// Every call must return (no crash, no hang); the session is re-attached if a fuzzed Detach or
// Release ended it.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/log.h"
#include "daemon/server/service_test_env.h"
#include "grpcpp/client_context.h"

namespace {

using tutti::server::testing::ServiceEnv;
using tutti::server::testing::ShmEngine;

enum Method : uint8_t {
  kAttach,
  kKeepAlive,
  kLookup,
  kRetrieve,
  kStore,
  kRelease,
  kDetach,
  kReportCompute,
  kCount
};

struct World {
  std::unique_ptr<ServiceEnv> env;
  std::unique_ptr<ShmEngine> engine;
  uint64_t session = 0;
};

World* TheWorld() {
  static World* world = [] {
    tutti::log::SetLevel("error");
    auto* w = new World;
    w->engine = std::make_unique<ShmEngine>();
    w->env = std::make_unique<ServiceEnv>();
    w->session = w->env->Attach(*w->engine);
    if (w->session == 0) abort();
    std::atexit([] {  // removes the socket directory, state and shm object
      World* w = TheWorld();
      w->env.reset();
      w->engine.reset();
    });
    return w;
  }();
  return world;
}

template <typename Request>
bool Decode(const uint8_t* data, size_t size, Request* req) {
  return req->ParseFromArray(data, static_cast<int>(size));
}

// With `own`, the request names the env's session as its engine does (id and token); otherwise
// it keeps whatever id and token the input gave.
template <typename Request>
void MaybeOwnSession(bool own, const ServiceEnv& env, uint64_t session, Request* req) {
  if (own) env.Name(session, req);
}

// The lease of a Lookup of `keys` in the env's session (0 if nothing was found).
template <typename Keys>
uint64_t LeaseFor(World* w, const Keys& keys) {
  grpc::ClientContext ctx;
  tutti::v1::LookupRequest req;
  tutti::v1::LookupResponse resp;
  w->env->Name(w->session, &req);
  for (const auto& k : keys) req.add_keys(k);
  return w->env->kv().Lookup(&ctx, req, &resp).ok() ? resp.lease_id() : 0;
}

std::vector<std::string> KeysOf(const tutti::v1::RetrieveRequest& req) {
  std::vector<std::string> keys;
  for (const auto& b : req.blocks()) keys.push_back(b.key());
  return keys;
}

void Call(World* w, Method method, bool own, bool leased, const uint8_t* data, size_t size) {
  grpc::ClientContext ctx;
  auto& kv = w->env->kv();
  switch (method) {
    case kAttach: {
      tutti::v1::AttachRequest req;
      tutti::v1::AttachResponse resp;
      if (Decode(data, size, &req)) (void)kv.Attach(&ctx, req, &resp);
      return;
    }
    case kKeepAlive: {
      tutti::v1::KeepAliveRequest req;
      tutti::v1::KeepAliveResponse resp;
      if (!Decode(data, size, &req)) return;
      MaybeOwnSession(own, *w->env, w->session, &req);
      (void)kv.KeepAlive(&ctx, req, &resp);
      return;
    }
    case kLookup: {
      tutti::v1::LookupRequest req;
      tutti::v1::LookupResponse resp;
      if (!Decode(data, size, &req)) return;
      MaybeOwnSession(own, *w->env, w->session, &req);
      (void)kv.Lookup(&ctx, req, &resp);
      return;
    }
    case kRetrieve: {
      tutti::v1::RetrieveRequest req;
      if (!Decode(data, size, &req)) return;
      MaybeOwnSession(own, *w->env, w->session, &req);
      if (leased) req.set_lease_id(LeaseFor(w, KeysOf(req)));
      std::unique_ptr<grpc::ClientReader<tutti::v1::RetrieveProgress>> reader =
          kv.Retrieve(&ctx, req);
      tutti::v1::RetrieveProgress progress;
      while (reader->Read(&progress)) {
      }
      (void)reader->Finish();
      return;
    }
    case kStore: {
      tutti::v1::StoreRequest req;
      tutti::v1::StoreResponse resp;
      if (!Decode(data, size, &req)) return;
      MaybeOwnSession(own, *w->env, w->session, &req);
      (void)kv.Store(&ctx, req, &resp);
      return;
    }
    case kRelease: {
      tutti::v1::ReleaseRequest req;
      tutti::v1::ReleaseResponse resp;
      if (!Decode(data, size, &req)) return;
      MaybeOwnSession(own, *w->env, w->session, &req);
      if (leased) req.set_lease_id(LeaseFor(w, std::vector<std::string>{std::string(16, 'k')}));
      (void)kv.Release(&ctx, req, &resp);
      return;
    }
    case kReportCompute: {
      tutti::v1::ReportComputeRequest req;
      tutti::v1::ReportComputeResponse resp;
      if (!Decode(data, size, &req)) return;
      MaybeOwnSession(own, *w->env, w->session, &req);
      (void)kv.ReportCompute(&ctx, req, &resp);
      return;
    }
    case kDetach:
    case kCount: {
      tutti::v1::DetachRequest req;
      tutti::v1::DetachResponse resp;
      if (!Decode(data, size, &req)) return;
      MaybeOwnSession(own, *w->env, w->session, &req);
      (void)kv.Detach(&ctx, req, &resp);
      return;
    }
  }
}

// Re-attaches if the env's session is gone.
void KeepSession(World* w) {
  grpc::ClientContext ctx;
  tutti::v1::KeepAliveRequest req;
  tutti::v1::KeepAliveResponse resp;
  w->env->Name(w->session, &req);
  if (w->env->kv().KeepAlive(&ctx, req, &resp).ok()) return;
  w->session = w->env->Attach(*w->engine);
  if (w->session == 0) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  World* w = TheWorld();
  Call(w, static_cast<Method>(data[0] % kCount), (data[1] & 1) != 0, (data[1] & 2) != 0, data + 2,
       size - 2);
  KeepSession(w);
  return 0;
}

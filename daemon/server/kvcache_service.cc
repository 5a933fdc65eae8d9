#include "daemon/server/kvcache_service.h"

#include <xxhash.h>

#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/client_text.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/datapath/engine_sink.h"
#include "daemon/datapath/retrieve_transfer.h"
#include "daemon/engine/host_memory.h"
#include "daemon/server/engine_cpus.h"
#include "daemon/server/request_checks.h"

namespace tutti::server {
namespace {

using tutti::v1::MemoryRegion;

constexpr size_t kMaxEngineId = 256;
constexpr size_t kMaxModelId = 256;
constexpr size_t kMaxHashScheme = 64;
// engine_group and namespace_secret: random bytes the engines choose, or none.
constexpr size_t kMinSharedBytes = 16, kMaxSharedBytes = 64;
// StoreRequest.staging_wait_ms: the longest a Store may wait for staging room.
constexpr uint32_t kMaxStagingWaitMs = 10000;
constexpr uint64_t kNamespaceSecretSeed = 0x74757474692d6e73;  // "tutti-ns"

tutti::v1::StoreOutcome ToProto(store::CaptureOutcome o) {
  switch (o) {
    case store::CaptureOutcome::kCaptured:
      return tutti::v1::STORE_CAPTURED;
    case store::CaptureOutcome::kDurable:
      return tutti::v1::STORE_DURABLE;
    case store::CaptureOutcome::kAlreadyPresent:
      return tutti::v1::STORE_ALREADY_PRESENT;
    case store::CaptureOutcome::kRejectedFull:
    case store::CaptureOutcome::kRejectedOwnerLimit:
    case store::CaptureOutcome::kRejectedBacklog:
    case store::CaptureOutcome::kRejectedShare:
      return tutti::v1::STORE_REJECTED_FULL;
    case store::CaptureOutcome::kFailed:
      return tutti::v1::STORE_FAILED;
    case store::CaptureOutcome::kDeclined:
      return tutti::v1::STORE_DECLINED;
    case store::CaptureOutcome::kInDram:
      return tutti::v1::STORE_IN_DRAM;
  }
  return tutti::v1::STORE_OUTCOME_UNSPECIFIED;
}

uint32_t NumLayers(const store::NamespaceInfo& info) { return info.num_objects / info.parts; }

std::vector<engine::ObjectPlacement> Placements(const tutti::v1::AttachRequest& req) {
  std::vector<engine::ObjectPlacement> out;
  for (const auto& p : req.placements()) out.push_back({p.region(), p.offset(), p.block_stride()});
  return out;
}

// A Retrieve's engine end: the session's EngineIo with the call's ticket, refusing each layer
// once the session is closed or the call cancelled.
class RetrieveEngineSink final : public datapath::EngineSink {
 public:
  RetrieveEngineSink(engine::EngineIo* io, uint32_t ticket, const SessionState& session,
                     grpc::ServerContext* ctx)
      : io_(io), ticket_(ticket), session_(session), ctx_(ctx) {}
  bool can_overlap() const override { return io_->is_device(); }
  absl::Status CopyLayer(uint32_t layer, absl::Span<const engine::CopyOp> ops) override {
    RETURN_IF_ERROR(Live());
    return io_->ScatterLayer(layer, ops, ticket_);
  }
  absl::Status EnqueueLayer(uint32_t layer, absl::Span<const engine::CopyOp> ops) override {
    RETURN_IF_ERROR(Live());
    return io_->EnqueueLayer(layer, ops, ticket_);
  }
  absl::Status Drain() override { return io_->Drain(); }

 private:
  absl::Status Live() const {
    if (session_.closed.load()) return absl::CancelledError("the session was closed");
    if (ctx_ != nullptr && ctx_->IsCancelled()) {
      return absl::CancelledError("the call was cancelled");
    }
    return absl::OkStatus();
  }

  engine::EngineIo* const io_;
  const uint32_t ticket_;
  const SessionState& session_;
  grpc::ServerContext* const ctx_;
};

}  // namespace

MemoryOpener HostMemoryOpener() {
  return [](const tutti::v1::AttachRequest& req, const store::NamespaceInfo& ns,
            Credential& credential) -> absl::StatusOr<std::unique_ptr<engine::EngineIo>> {
    if (req.has_ready_words()) {
      return absl::InvalidArgumentError(
          "ready_words: only with cuda_ipc regions (GPU mode); host-mode engines learn of "
          "each layer from the Retrieve stream");
    }
    std::vector<engine::HostShmRegion> regions;
    for (int i = 0; i < req.regions_size(); ++i) {
      const MemoryRegion& r = req.regions(i);
      if (r.kind_case() == MemoryRegion::kCudaIpc) {
        return absl::FailedPreconditionError(
            absl::StrCat("regions[", i,
                         "]: cuda_ipc needs a GPU build/daemon in cuda mode; this daemon runs "
                         "in host mode: pass host_shm regions"));
      }
      if (r.kind_case() != MemoryRegion::kHostShm) {
        return absl::InvalidArgumentError(absl::StrCat("regions[", i, "]: no kind set"));
      }
      const std::string field = absl::StrCat("regions[", i, "]");
      RETURN_IF_ERROR(CheckClientText(field + ".host_shm.name", r.host_shm().name(), 200));
      const uint32_t index = r.host_shm().fd_index();
      if (index >= credential.fds.size() || !credential.fds[index].valid()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".host_shm.fd_index = ", index, ": the handoff carried ",
                         credential.fds.size(), " descriptors, each usable by one region"));
      }
      regions.push_back(
          {r.host_shm().name(), std::move(credential.fds[index]), r.host_shm().size_bytes()});
    }
    ASSIGN_OR_RETURN(auto memory,
                     engine::HostMemory::Create(std::move(regions), Placements(req),
                                                req.num_blocks(), ns.num_objects, ns.object_len));
    return engine::MakeHostEngineIo(std::move(memory));
  };
}

KvCacheService::KvCacheService(const KvCacheOptions& options, store::BlockStore* store,
                               SessionManager* sessions, CredentialTable* credentials,
                               MemoryOpener opener, CallGate* gate, EngineWatcher* watcher,
                               decision::Advisor* advisor)
    : options_(options),
      store_(store),
      sessions_(sessions),
      credentials_(credentials),
      opener_(std::move(opener)),
      gate_(gate),
      watcher_(watcher),
      own_advisor_(advisor == nullptr ? std::make_unique<decision::Advisor>(true) : nullptr),
      advisor_(advisor == nullptr ? own_advisor_.get() : advisor) {}

absl::StatusOr<KvCacheService::SessionCall> KvCacheService::EnterSession(
    uint64_t session_id, std::string_view token, std::optional<uint32_t> uid) {
  ASSIGN_OR_RETURN(SessionRef session, sessions_->Touch(session_id, token, uid));
  if (session->calls.fetch_add(1) >= options_.max_calls_per_session) {
    session->calls.fetch_sub(1);
    return absl::ResourceExhaustedError(
        absl::StrCat("session ", session_id, " has ", options_.max_calls_per_session,
                     " calls in flight (limits.max_calls_per_session); wait for one to end"));
  }
  return SessionCall(std::move(session));
}

// --- Attach, KeepAlive, Release, Detach ---

namespace {

absl::Status CheckAttachText(const tutti::v1::AttachRequest& req) {
  RETURN_IF_ERROR(CheckClientText("engine_id", req.engine_id(), kMaxEngineId));
  RETURN_IF_ERROR(CheckClientText("namespace.model_id", req.namespace_().model_id(), kMaxModelId));
  return CheckClientText("namespace.hash_scheme", req.namespace_().hash_scheme(), kMaxHashScheme);
}

// `field` empty, or kMinSharedBytes to kMaxSharedBytes long; INVALID_ARGUMENT naming it and
// what empty means otherwise.
absl::Status CheckSharedBytes(absl::string_view field, const std::string& value,
                              absl::string_view empty_means) {
  if (value.empty() || (value.size() >= kMinSharedBytes && value.size() <= kMaxSharedBytes)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value.size(), " bytes; must be ",
                                                 kMinSharedBytes, " to ", kMaxSharedBytes,
                                                 " (or empty: ", empty_means, ")"));
}

// Who the namespace of an Attach belongs to (docs/security.md "Namespaces"): engines giving one
// namespace_secret share it whatever their users; otherwise the attaching user owns it, unless
// the operator shares namespaces by host (their scope is then "", as before owners existed). The
// secret is kept only as its 128-bit hash, salted per purpose.
absl::StatusOr<store::NamespaceScope> ScopeOf(const tutti::v1::AttachRequest& req, uint32_t uid,
                                              bool host_sharing) {
  const std::string& secret = req.namespace_secret();
  if (!secret.empty()) {
    RETURN_IF_ERROR(
        CheckSharedBytes("namespace_secret", secret, "the namespace is the attaching user's own"));
    const XXH128_hash_t h =
        XXH3_128bits_withSeed(secret.data(), secret.size(), kNamespaceSecretSeed);
    return store::NamespaceScope{absl::StrCat("secret:", absl::Hex(h.high64, absl::kZeroPad16),
                                              absl::Hex(h.low64, absl::kZeroPad16)),
                                 uid, true};
  }
  if (host_sharing) return store::NamespaceScope{"", uid, true};
  return store::NamespaceScope{absl::StrCat("uid:", uid), uid, false};
}

// No regions, no placements, no ready words and num_blocks 0: a lookup-only session.
bool IsMemoryless(const tutti::v1::AttachRequest& req) {
  return req.regions().empty() && req.placements().empty() && !req.has_ready_words() &&
         req.num_blocks() == 0;
}

// Memory given in part is refused, naming the first field missing.
absl::Status CheckMemoryGiven(const tutti::v1::AttachRequest& req) {
  constexpr char kWhole[] =
      "; a session with memory gives num_blocks, regions and placements, a memory-less one none "
      "of them";
  if (req.num_blocks() == 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_blocks: 0 but memory is given", kWhole));
  }
  if (req.regions().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("regions: none given", kWhole));
  }
  if (req.placements().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("placements: none given", kWhole));
  }
  return absl::OkStatus();
}

absl::Status CheckHasMemory(const SessionState& session, absl::string_view call) {
  if (!session.memoryless) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("session ", session.id, " is memory-less (it attached no memory): ", call,
                   " needs a session with memory; Lookup, Release and ReportCompute work"));
}

// Says where the engine that attached session `id` may run against tuttid's CPUs: an engine
// sharing them waits behind tuttid's I/O threads (engine_cpus.h).
void LogEngineCpus(uint64_t id, pid_t pid) {
  absl::StatusOr<CpuOverlap> o = EngineCpuOverlap(pid);
  if (!o.ok()) {
    log::Get("server")->debug("session {}: the engine's CPUs are not known: {}", id,
                              o.status().ToString());
  } else if (o->shared == 0) {
    log::Get("server")->info("session {}: engine pid {} runs on CPUs {}, apart from tuttid's ({})",
                             id, pid, o->engine, o->tuttid);
  } else {
    log::Get("server")->info(
        "session {}: engine pid {} may run on CPUs {}, {} of which tuttid uses too (tuttid: "
        "{}); a busy engine waits behind tuttid's I/O threads there: give each CPUs of its own "
        "(docs/operations.md, \"MPS\")",
        id, pid, o->engine, o->shared, o->tuttid);
  }
}

}  // namespace

absl::Status KvCacheService::DoAttach(const tutti::v1::AttachRequest& req,
                                      tutti::v1::AttachResponse* resp) {
  if (req.credential().empty()) {
    return absl::PermissionDeniedError(
        "credential: missing; hand the engine's memory over on the handoff socket "
        "(<socket>.handoff, docs/security.md) first; attaching memory by name is not allowed");
  }
  // Redeemed first, so that a refused Attach closes the descriptors it handed over.
  ASSIGN_OR_RETURN(Credential credential, credentials_->Redeem(req.credential()));
  RETURN_IF_ERROR(CheckAttachText(req));
  RETURN_IF_ERROR(CheckSharedBytes("engine_group", req.engine_group(), "no sharing"));
  ASSIGN_OR_RETURN(const store::NamespaceScope scope,
                   ScopeOf(req, credential.peer.uid, options_.namespace_sharing == "host"));
  const bool memoryless = IsMemoryless(req);
  if (!memoryless) RETURN_IF_ERROR(CheckMemoryGiven(req));
  if (sessions_->num_sessions() >= sessions_->options().max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("already ", sessions_->num_sessions(),
                     " sessions (limits.max_sessions); detach one first"));
  }
  if (!req.has_namespace_()) return absl::InvalidArgumentError("namespace: missing");
  // Nothing is journaled before the namespace and the memory have proved good.
  ASSIGN_OR_RETURN(const store::NamespaceInfo info, store_->CheckNamespace(req.namespace_()));
  std::unique_ptr<engine::EngineIo> io = engine::MakeNoMemoryEngineIo();
  if (!memoryless) {
    ASSIGN_OR_RETURN(io, opener_(req, info, credential));
  }
  // The claim keeps the namespace from being dropped as unused until the session is open.
  ASSIGN_OR_RETURN(const store::NamespaceClaim claim,
                   store_->RegisterNamespace(req.namespace_(), scope,
                                             [this] { return sessions_->SessionsPerNamespace(); }));
  const NamespaceId ns = claim.id();
  const bool watch = watcher_ != nullptr && req.engine_pid() != 0;
  const auto pid = static_cast<uint32_t>(credential.peer.pid);
  // Taken before the session exists, so that no event after its attach is before this seq.
  const uint64_t events_seq = store_->events().last_seq(ns);
  ASSIGN_OR_RETURN(
      SessionRef session,
      sessions_->Open(req.engine_id(), ns, req.namespace_().model_id(), std::move(io), pid,
                      credential.peer.uid, req.engine_group(), memoryless, events_seq));
  if (watch) RETURN_IF_ERROR(WatchEngine(session));
  if (!memoryless && pid > 0) LogEngineCpus(session->id, static_cast<pid_t>(pid));
  resp->set_session_id(session->id);
  resp->set_session_token(session->token);
  resp->set_namespace_id(ns);
  resp->set_session_ttl_ms(sessions_->options().session_ttl_ms);
  resp->set_max_blocks_per_call(options_.max_blocks_per_call);
  resp->set_object_bytes(info.object_len);
  return absl::OkStatus();
}

grpc::Status KvCacheService::Attach(grpc::ServerContext*, const tutti::v1::AttachRequest* req,
                                    tutti::v1::AttachResponse* resp) {
  return ServeCall(gate_, [&] {
    absl::Status s = DoAttach(*req, resp);
    if (!s.ok()) {
      TUTTI_LOG_EVERY_N_SEC(log::Get("server"), spdlog::level::info, 1,
                            "attach of engine \"{}\" refused: {}", Escaped(req->engine_id()),
                            Escaped(s.ToString(), 1024));
    }
    return s;
  });
}

grpc::Status KvCacheService::KeepAlive(grpc::ServerContext*, const tutti::v1::KeepAliveRequest* req,
                                       tutti::v1::KeepAliveResponse* resp) {
  return ServeCall(gate_, [&] {
    absl::StatusOr<SessionCall> call = EnterSession(req->session_id(), req->session_token());
    if (call.ok()) resp->set_session_ttl_ms(sessions_->options().session_ttl_ms);
    return call.status();
  });
}

grpc::Status KvCacheService::Release(grpc::ServerContext*, const tutti::v1::ReleaseRequest* req,
                                     tutti::v1::ReleaseResponse*) {
  return ServeCall(gate_, [&] {
    absl::StatusOr<SessionCall> call = EnterSession(req->session_id(), req->session_token());
    if (!call.ok()) return call.status();
    return sessions_->Release(req->session_id(), req->lease_id());
  });
}

grpc::Status KvCacheService::Detach(grpc::ServerContext*, const tutti::v1::DetachRequest* req,
                                    tutti::v1::DetachResponse*) {
  return ServeCall(gate_, [&]() -> absl::Status {
    // Only the session's engine may end it: the token first, as for every other call.
    RETURN_IF_ERROR(sessions_->Touch(req->session_id(), req->session_token()).status());
    return sessions_->Close(req->session_id());
  });
}

// --- Lookup ---

absl::Status KvCacheService::DoLookup(const tutti::v1::LookupRequest& req,
                                      tutti::v1::LookupResponse* resp,
                                      std::optional<uint32_t> uid) {
  ASSIGN_OR_RETURN(SessionCall call, EnterSession(req.session_id(), req.session_token(), uid));
  const SessionRef& session = call.session();
  ASSIGN_OR_RETURN(std::vector<Key> keys, ParseLookupKeys(req, options_.max_blocks_per_call));
  if (req.prompt_tokens() > decision::kMaxContextTokens) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_tokens = ", req.prompt_tokens(),
                                                   ": must be at most ",
                                                   decision::kMaxContextTokens));
  }
  std::vector<bool> in_dram;
  const uint32_t hits = keys.empty() ? 0 : store_->LookupAndPin(session->ns, keys, &in_dram);
  resp->set_hits(hits);
  if (hits == 0) {
    AdviseLookup(*session, req.prompt_tokens(), in_dram, resp);
    return absl::OkStatus();
  }
  keys.resize(hits);
  absl::StatusOr<uint64_t> lease = sessions_->AddLease(session->id, keys);
  if (!lease.ok()) {
    store_->Unpin(session->ns, keys);  // the session went away meanwhile, or a limit was hit
    return lease.status();
  }
  resp->set_lease_id(*lease);
  resp->set_lease_ttl_ms(sessions_->options().lease_ttl_ms);
  AdviseLookup(*session, req.prompt_tokens(), in_dram, resp);
  return absl::OkStatus();
}

grpc::Status KvCacheService::Lookup(grpc::ServerContext*, const tutti::v1::LookupRequest* req,
                                    tutti::v1::LookupResponse* resp) {
  return ServeCall(gate_, [&] { return DoLookup(*req, resp); });
}

absl::Status KvCacheService::LookupAs(uint32_t peer_uid, const tutti::v1::LookupRequest& req,
                                      tutti::v1::LookupResponse* resp) {
  ASSIGN_OR_RETURN(CallGate::Pass pass, gate_->Enter());
  return DoLookup(req, resp, peer_uid);
}

// --- Retrieve ---

absl::Status KvCacheService::RetrieveLayers(const tutti::v1::RetrieveRequest& req,
                                            const SessionState& session, grpc::ServerContext* ctx,
                                            const Emit& emit, uint32_t* next, uint32_t* end) {
  engine::EngineIo* io = session.io.get();
  ASSIGN_OR_RETURN(const store::NamespaceInfo info, store_->GetNamespace(session.ns));
  *end = NumLayers(info);  // all words, until the range is known to be good
  ASSIGN_OR_RETURN(BlockBatch batch,
                   ParseBlocks(req.blocks(), io->num_blocks(), options_.max_blocks_per_call));
  ASSIGN_OR_RETURN(LayerRange layers,
                   ParseLayerRange(req.layer_begin(), req.layer_end(), NumLayers(info)));
  *next = layers.begin;
  *end = layers.end;
  ASSIGN_OR_RETURN(const std::vector<uint64_t> lease_ids, ParseLeaseIds(req));
  // From here on the leases end with this call, whatever happens.
  ASSIGN_OR_RETURN(std::unique_ptr<ClaimedLease> lease,
                   sessions_->ClaimLeases(session.id, lease_ids, batch.keys));
  // The Retrieve is a transfer of the datapath: the store prepares and finishes it, its reader
  // reads, and the engine handoff (overlap, held progress, drain) is the datapath's. The server
  // adapts its EngineIo and streams progress.
  RetrieveEngineSink engine(io, req.ticket(), session, ctx);
  auto progress = [&emit](uint32_t layer, absl::Span<const uint32_t> failed) {
    tutti::v1::RetrieveProgress p;
    p.set_layer(layer);
    for (uint32_t item : failed) p.add_failed(item);
    return emit(p);
  };
  const datapath::RetrieveOutcome out =
      datapath::RunRetrieve(datapath::RetrieveRequest{session.ns, batch.keys, layers.begin,
                                                      layers.end, batch.engine_blocks},
                            store_, store_->reader(engine.can_overlap()), &engine, progress);
  *next = out.next_layer;
  return out.status;
}

absl::Status KvCacheService::DoRetrieve(const tutti::v1::RetrieveRequest& req,
                                        grpc::ServerContext* ctx, const Emit& emit) {
  ASSIGN_OR_RETURN(SessionCall call, EnterSession(req.session_id(), req.session_token()));
  const SessionRef& session = call.session();
  RETURN_IF_ERROR(CheckHasMemory(*session, "Retrieve"));
  engine::EngineIo* io = session->io.get();
  if (io->is_device() && session->retrieving.exchange(true)) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", session->id,
                     " has a Retrieve in flight; GPU sessions retrieve one request at a time"));
  }
  absl::Cleanup admitted = [&] {
    if (io->is_device()) session->retrieving.store(false);
  };
  uint32_t next = 0, end = 0;
  absl::Status s = RetrieveLayers(req, *session, ctx, emit, &next, &end);
  // Never leave an engine's stream waiting on a live daemon: words not yet written get the ticket.
  if (io->has_ready_words() && next < end && !session->closed.load()) {
    absl::Status w = io->SignalLayers(next, end, req.ticket());
    if (!w.ok()) {
      log::Get("server")->error("session {}: writing ready words [{}, {}): {}", session->id, next,
                                end, w.ToString());
    }
  }
  return s;
}

grpc::Status KvCacheService::Retrieve(grpc::ServerContext* ctx,
                                      const tutti::v1::RetrieveRequest* req,
                                      grpc::ServerWriter<tutti::v1::RetrieveProgress>* writer) {
  return ServeCall(gate_, [&] {
    return DoRetrieve(*req, ctx,
                      [writer](const tutti::v1::RetrieveProgress& p) { return writer->Write(p); });
  });
}

// --- Store ---

absl::Status KvCacheService::StoreBlocks(const tutti::v1::StoreRequest& req,
                                         const SessionState& session, bool* signaled,
                                         tutti::v1::StoreResponse* resp) {
  engine::EngineIo* io = session.io.get();
  ASSIGN_OR_RETURN(BlockBatch batch,
                   ParseBlocks(req.blocks(), io->num_blocks(), options_.max_blocks_per_call));
  ASSIGN_OR_RETURN(const store::NamespaceInfo info, store_->GetNamespace(session.ns));
  ASSIGN_OR_RETURN(LayerRange layers,
                   ParseLayerRange(req.layer_begin(), req.layer_end(), NumLayers(info)));
  auto gather = [&](absl::Span<const engine::CopyOp> ops) -> absl::Status {
    if (session.closed.load()) return absl::CancelledError("the session was closed");
    RETURN_IF_ERROR(io->Gather(ops));
    // Captured: the engine may reuse its blocks now, before the SSD write (and wait_durable).
    *signaled = true;
    return io->SignalCaptured(req.ticket());
  };
  if (req.staging_wait_ms() > kMaxStagingWaitMs) {
    return absl::InvalidArgumentError(absl::StrCat("staging_wait_ms = ", req.staging_wait_ms(),
                                                   " is more than ", kMaxStagingWaitMs));
  }
  ASSIGN_OR_RETURN(
      std::vector<store::CaptureOutcome> outcomes,
      store_->Capture(session.ns, batch.keys, layers.begin, layers.end, gather, req.wait_durable(),
                      session.id, absl::Milliseconds(req.staging_wait_ms()), batch.engine_blocks));
  bool full = false, session_share = false, backlog = false, pool_share = false;
  for (store::CaptureOutcome o : outcomes) {
    resp->add_outcomes(ToProto(o));
    full |= o == store::CaptureOutcome::kRejectedFull;
    pool_share |= o == store::CaptureOutcome::kRejectedShare;
    session_share |= o == store::CaptureOutcome::kRejectedOwnerLimit;
    backlog |= o == store::CaptureOutcome::kRejectedBacklog;
  }
  if (backlog) {
    resp->set_rejected_why(
        "the write backlog is past its bound (datapath.max_write_backlog_bytes or "
        "datapath.max_write_backlog_age_ms): the pool is writing slower than blocks arrive; "
        "retry later or drop the blocks");
  } else if (session_share) {
    resp->set_rejected_why(absl::StrCat(
        "session ", session.id,
        " holds its share of store staging "
        "(limits.max_store_staging_bytes_per_session); retry once its blocks are written"));
  } else if (full) {
    resp->set_rejected_why(
        "store staging is full (limits.store_staging_bytes); retry later or drop the blocks");
  } else if (pool_share) {
    resp->set_rejected_why(
        "the namespace's owner holds its share of the pool (limits.pool_share_per_user) and "
        "every one of its blocks is pinned; release leases, or retry once they end");
  }
  return absl::OkStatus();
}

absl::Status KvCacheService::DoStore(const tutti::v1::StoreRequest& req,
                                     tutti::v1::StoreResponse* resp) {
  ASSIGN_OR_RETURN(SessionCall call, EnterSession(req.session_id(), req.session_token()));
  const SessionRef& session = call.session();
  RETURN_IF_ERROR(CheckHasMemory(*session, "Store"));
  engine::EngineIo* io = session->io.get();
  if (io->has_ready_words() && session->storing.exchange(true)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session->id, " has a Store in flight; with ready words, one at a time"));
  }
  absl::Cleanup admitted = [&] {
    if (io->has_ready_words()) session->storing.store(false);
  };
  bool signaled = false;
  absl::Status s = StoreBlocks(req, *session, &signaled, resp);
  if (io->has_ready_words() && !signaled && !session->closed.load()) {
    absl::Status w = io->SignalCaptured(req.ticket());
    if (!w.ok()) {
      log::Get("server")->error("session {}: writing the store word: {}", session->id,
                                w.ToString());
    }
  }
  return s;
}

grpc::Status KvCacheService::Store(grpc::ServerContext*, const tutti::v1::StoreRequest* req,
                                   tutti::v1::StoreResponse* resp) {
  return ServeCall(gate_, [&] { return DoStore(*req, resp); });
}

// --- Engine processes ---

absl::Status KvCacheService::WatchEngine(const SessionRef& session) {
  std::weak_ptr<const SessionState> weak = session;
  absl::Status s = watcher_->Watch(session->engine_pid, session->id, [weak] {
    SessionRef alive = weak.lock();
    return alive != nullptr && !alive->closed.load();
  });
  if (!s.ok()) (void)sessions_->Close(session->id, "its engine could not be watched");
  return s;
}

}  // namespace tutti::server

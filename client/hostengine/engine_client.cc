#include "client/hostengine/engine_client.h"

#include <algorithm>

#include "common/connect.h"
#include "common/handoff.h"
#include "grpcpp/client_context.h"

namespace tutti::hostengine {

using tutti::v1::AttachRequest;
using tutti::v1::AttachResponse;

namespace {

// keys[i] goes with engine_blocks[i] (Retrieve and Store).
template <typename Request>
void AddBlocks(absl::Span<const Key> keys, absl::Span<const uint32_t> engine_blocks,
               Request* request) {
  for (size_t i = 0; i < keys.size(); ++i) {
    tutti::v1::BlockPair* pair = request->add_blocks();
    pair->set_key(std::string(keys[i].view()));
    pair->set_engine_block(engine_blocks[i]);
  }
}

}  // namespace

EngineClient::EngineClient(std::shared_ptr<grpc::Channel> channel, std::string socket_path,
                           absl::Duration call_timeout)
    : channel_(std::move(channel)),
      socket_path_(std::move(socket_path)),
      stub_(tutti::v1::KvCache::NewStub(channel_)),
      call_timeout_(call_timeout) {}

EngineClient::~EngineClient() {
  if (attached()) (void)Detach();
  StopKeepAlive();
}

std::unique_ptr<grpc::ClientContext> EngineClient::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
  return ctx;
}

absl::StatusOr<std::string> EngineClient::HandOff(absl::Span<const int> fds) const {
  return tutti::HandOff(socket_path_, fds, call_timeout_);
}

absl::StatusOr<AttachResponse> EngineClient::Attach(AttachRequest request,
                                                    absl::Span<const int> fds) {
  if (attached()) return absl::FailedPreconditionError("already attached");
  StopKeepAlive();
  absl::StatusOr<std::string> credential = HandOff(fds);
  if (!credential.ok()) return credential.status();
  request.set_credential(*credential);
  AttachResponse response;
  auto ctx = NewContext();
  absl::Status status = FromGrpc(stub_->Attach(ctx.get(), request, &response));
  if (!status.ok()) return status;
  session_id_.store(response.session_id());
  keepalive_failures_.store(0);
  const uint32_t ttl_ms = std::max<uint32_t>(response.session_ttl_ms(), 40);
  {
    absl::MutexLock lock(&mu_);
    stop_ = false;
    token_ = response.session_token();
  }
  keepalive_ = std::thread(&EngineClient::KeepAliveLoop, this, response.session_id(),
                           response.session_token(), absl::Milliseconds(ttl_ms / 4));
  return response;
}

std::string EngineClient::session_token() const {
  absl::MutexLock lock(&mu_);
  return token_;
}

absl::Status EngineClient::Detach() {
  tutti::v1::DetachRequest request;
  Name(&request);
  const uint64_t id = session_id_.exchange(0);
  if (id == 0) return absl::FailedPreconditionError("not attached");
  StopKeepAlive();
  {
    absl::MutexLock lock(&mu_);
    token_.clear();
  }
  tutti::v1::DetachResponse response;
  auto ctx = NewContext();
  return FromGrpc(stub_->Detach(ctx.get(), request, &response));
}

void EngineClient::StopKeepAlive() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (keepalive_.joinable()) keepalive_.join();
}

void EngineClient::KeepAliveLoop(uint64_t session_id, std::string token, absl::Duration period) {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period)) return;
    }
    tutti::v1::KeepAliveRequest request;
    request.set_session_id(session_id);
    request.set_session_token(token);
    tutti::v1::KeepAliveResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + period));
    if (!stub_->KeepAlive(&ctx, request, &response).ok()) keepalive_failures_.fetch_add(1);
  }
}

absl::StatusOr<tutti::v1::LookupResponse> EngineClient::Lookup(absl::Span<const Key> keys) {
  tutti::v1::LookupRequest request;
  Name(&request);
  for (const Key& k : keys) request.add_keys(std::string(k.view()));
  tutti::v1::LookupResponse response;
  auto ctx = NewContext();
  absl::Status status = FromGrpc(stub_->Lookup(ctx.get(), request, &response));
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<EngineClient::RetrieveResult> EngineClient::Retrieve(
    uint64_t lease_id, absl::Span<const Key> keys, absl::Span<const uint32_t> engine_blocks,
    uint32_t layer_begin, uint32_t layer_end) {
  tutti::v1::RetrieveRequest request;
  Name(&request);
  request.set_lease_id(lease_id);
  AddBlocks(keys, engine_blocks, &request);
  request.set_layer_begin(layer_begin);
  request.set_layer_end(layer_end);
  auto ctx = NewContext();
  auto reader = stub_->Retrieve(ctx.get(), request);
  RetrieveResult result;
  tutti::v1::RetrieveProgress progress;
  while (reader->Read(&progress)) {
    result.layers.push_back(progress.layer());
    result.failed.insert(result.failed.end(), progress.failed().begin(), progress.failed().end());
  }
  absl::Status status = FromGrpc(reader->Finish());
  if (!status.ok()) return status;
  std::sort(result.failed.begin(), result.failed.end());
  result.failed.erase(std::unique(result.failed.begin(), result.failed.end()), result.failed.end());
  return result;
}

absl::StatusOr<std::vector<tutti::v1::StoreOutcome>> EngineClient::Store(
    absl::Span<const Key> keys, absl::Span<const uint32_t> engine_blocks, bool wait_durable,
    uint32_t layer_begin, uint32_t layer_end) {
  tutti::v1::StoreRequest request;
  Name(&request);
  AddBlocks(keys, engine_blocks, &request);
  request.set_layer_begin(layer_begin);
  request.set_layer_end(layer_end);
  request.set_wait_durable(wait_durable);
  tutti::v1::StoreResponse response;
  auto ctx = NewContext();
  absl::Status status = FromGrpc(stub_->Store(ctx.get(), request, &response));
  if (!status.ok()) return status;
  if (static_cast<size_t>(response.outcomes_size()) != keys.size()) {
    return absl::InternalError("tuttid answered Store with a wrong number of outcomes");
  }
  std::vector<tutti::v1::StoreOutcome> outcomes;
  for (int o : response.outcomes()) outcomes.push_back(static_cast<tutti::v1::StoreOutcome>(o));
  return outcomes;
}

absl::Status EngineClient::Release(uint64_t lease_id) {
  tutti::v1::ReleaseRequest request;
  Name(&request);
  request.set_lease_id(lease_id);
  tutti::v1::ReleaseResponse response;
  auto ctx = NewContext();
  return FromGrpc(stub_->Release(ctx.get(), request, &response));
}

}  // namespace tutti::hostengine

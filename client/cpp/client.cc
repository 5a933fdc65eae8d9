// Client and Retrieval: the public API over Session (attachment), Retrieval::Rep (transfer state)
// and the Device seam (cuda mode).
#include "tutti/client.h"

#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cpp/attach_request.h"
#include "client/cpp/device.h"
#include "client/cpp/session.h"
#include "client/cpp/status_convert.h"
#include "client/cpp/transfer.h"
#include "common/connect.h"

namespace tutti::client {
namespace {

using internal::Session;

std::string KeyString(const BlockKey& k) {
  return std::string(reinterpret_cast<const char*>(k.data()), k.size());
}

void AddPairs(const std::vector<BlockKey>& keys, const std::vector<uint32_t>& blocks,
              google::protobuf::RepeatedPtrField<tutti::v1::BlockPair>* out) {
  out->Reserve(static_cast<int>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    tutti::v1::BlockPair* pair = out->Add();
    pair->set_key(KeyString(keys[i]));
    pair->set_engine_block(blocks[i]);
  }
}

Status CheckPairs(const std::vector<BlockKey>& keys, const std::vector<uint32_t>& blocks) {
  if (keys.size() != blocks.size()) {
    return Status(StatusCode::kInvalidArgument,
                  absl::StrCat(keys.size(), " keys but ", blocks.size(), " engine blocks"));
  }
  if (keys.empty()) return Status(StatusCode::kInvalidArgument, "no blocks");
  return Status();
}

}  // namespace

struct Client::Rep {
  MemoryMode mode = MemoryMode::kHost;
  uint32_t num_layers = 0;
  std::unique_ptr<internal::Device> device;     // cuda mode
  std::unique_ptr<internal::ReadyWords> words;  // cuda mode
  std::unique_ptr<Session> session;

  // cuda mode: tuttid takes one Store per session at a time (the store word needs it).
  absl::Mutex store_mu;

  absl::Mutex ticket_mu;
  uint32_t next_ticket ABSL_GUARDED_BY(ticket_mu) = 1;

  // The Retrieve in flight and the thread reading its stream; one at a time.
  absl::Mutex retrieve_mu;
  std::shared_ptr<Retrieval::Rep> inflight ABSL_GUARDED_BY(retrieve_mu);
  std::thread reader ABSL_GUARDED_BY(retrieve_mu);

  uint32_t NextTicket() {
    absl::MutexLock lock(&ticket_mu);
    uint32_t t = next_ticket++;
    if (next_ticket == 0) next_ticket = 1;  // 0 is the words' initial value
    return t;
  }
  // Waits for the transfer in flight to end and joins its reader.
  void FinishInflight() ABSL_EXCLUSIVE_LOCKS_REQUIRED(retrieve_mu) {
    if (inflight != nullptr) inflight->Wait();
    if (reader.joinable()) reader.join();
    inflight.reset();
  }
  void ReadStream(std::shared_ptr<Retrieval::Rep> rep, tutti::v1::RetrieveRequest request,
                  uint64_t generation);
};

void Client::Rep::ReadStream(std::shared_ptr<Retrieval::Rep> rep,
                             tutti::v1::RetrieveRequest request, uint64_t generation) {
  std::unique_ptr<grpc::ClientContext> ctx = session->NewContext();
  auto stream = session->stub().Retrieve(ctx.get(), request);
  tutti::v1::RetrieveProgress progress;
  while (stream->Read(&progress)) {
    rep->OnProgress(progress.layer(), progress.failed());
  }
  absl::Status status = FromGrpc(stream->Finish());
  session->Observe(status, generation);
  rep->OnEnd(status);
}

Client::Client(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}

Client::~Client() {
  {
    absl::MutexLock lock(&rep_->retrieve_mu);
    rep_->FinishInflight();
  }
  rep_->session.reset();  // detaches before the ready words go
}

Result<std::unique_ptr<Client>> Client::Attach(const AttachOptions& options) {
  auto rep = std::make_unique<Rep>();
  rep->mode = options.mode;
  rep->num_layers = options.ns.layout.num_layers;
  absl::StatusOr<tutti::v1::AttachRequest> request;
  if (options.mode == MemoryMode::kCuda) {
    absl::StatusOr<std::unique_ptr<internal::Device>> device =
        internal::OpenCudaDevice(options.cuda_device);
    if (!device.ok()) return FromAbsl(device.status());
    rep->device = std::move(*device);
    auto words = rep->device->CreateReadyWords(options.ns.layout.num_layers + 1);
    if (!words.ok()) return FromAbsl(words.status());
    rep->words = std::move(*words);
    request = internal::BuildCudaAttach(options, *rep->device, *rep->words);
  } else {
    request = internal::BuildHostAttach(options);
  }
  if (!request.ok()) return FromAbsl(request.status());
  absl::StatusOr<std::vector<UniqueFd>> fds = internal::OpenHostRegions(options);
  if (!fds.ok()) return FromAbsl(fds.status());
  internal::SessionOptions so;
  so.socket_path = options.socket_path;
  so.connect_timeout = absl::Milliseconds(options.connect_timeout_ms);
  so.call_timeout = absl::Milliseconds(options.call_timeout_ms);
  so.reattach = options.reattach;
  auto session = Session::Open(so, *std::move(request), *std::move(fds));
  if (!session.ok()) return FromAbsl(session.status());
  rep->session = std::move(*session);
  return std::unique_ptr<Client>(new Client(std::move(rep)));
}

Result<Lease> Client::Lookup(const std::vector<BlockKey>& keys, uint32_t prompt_tokens) {
  absl::StatusOr<Session::Current> cur = rep_->session->current();
  if (!cur.ok()) return FromAbsl(cur.status());
  tutti::v1::LookupRequest request;
  cur->Name(&request);
  // One string for the whole chain (LookupRequest.packed_keys): one allocation on each side.
  std::string* packed = request.mutable_packed_keys();
  packed->reserve(keys.size() * 16);
  for (const BlockKey& k : keys) packed->append(KeyString(k));
  request.set_prompt_tokens(prompt_tokens);
  tutti::v1::LookupResponse response;
  auto ctx = rep_->session->NewContext();
  absl::Status s =
      FromGrpc(rep_->session->stub().Lookup(ctx.get(), request, &response));
  rep_->session->Observe(s, cur->generation);
  if (!s.ok()) return FromAbsl(s);
  Lease lease{response.lease_id(), response.hits(), response.lease_ttl_ms(), cur->generation};
  lease.load_blocks = response.load_blocks();
  lease.predicted_ttft_ms = response.predicted_ttft_ms();
  lease.predicted_recompute_ms = response.predicted_recompute_ms();
  lease.predicted_load_all_ms = response.predicted_load_all_ms();
  lease.decision_id = response.decision_id();
  return lease;
}

Result<ComputeReport> Client::ReportCompute(const std::vector<ComputeSample>& samples,
                                            uint64_t decision_id, double measured_ttft_ms) {
  absl::StatusOr<Session::Current> cur = rep_->session->current();
  if (!cur.ok()) return FromAbsl(cur.status());
  tutti::v1::ReportComputeRequest request;
  cur->Name(&request);
  for (const ComputeSample& c : samples) {
    tutti::v1::ComputeSample* s = request.add_samples();
    s->set_new_tokens(c.new_tokens);
    s->set_context_tokens(c.context_tokens);
    s->set_layer_ms(c.layer_ms);
    s->set_overhead_ms(c.overhead_ms);
  }
  request.set_decision_id(decision_id);
  request.set_measured_ttft_ms(measured_ttft_ms);
  tutti::v1::ReportComputeResponse response;
  auto ctx = rep_->session->NewContext();
  absl::Status s =
      FromGrpc(rep_->session->stub().ReportCompute(ctx.get(), request, &response));
  rep_->session->Observe(s, cur->generation);
  if (!s.ok()) return FromAbsl(s);
  return ComputeReport{response.decision_found(), response.prediction_error()};
}

Result<std::unique_ptr<Retrieval>> Client::Retrieve(const Lease& lease,
                                                    const std::vector<BlockKey>& keys,
                                                    const std::vector<uint32_t>& engine_blocks,
                                                    uint32_t layer_begin, uint32_t layer_end) {
  if (Status s = CheckPairs(keys, engine_blocks); !s.ok()) return s;
  if (layer_end == 0) layer_end = rep_->num_layers;
  if (layer_begin >= layer_end || layer_end > rep_->num_layers) {
    return Status(StatusCode::kInvalidArgument, absl::StrCat("layers [", layer_begin, ", ",
                                                             layer_end, ") of ", rep_->num_layers));
  }
  absl::MutexLock lock(&rep_->retrieve_mu);
  rep_->FinishInflight();
  absl::StatusOr<Session::Current> cur = rep_->session->current();
  if (!cur.ok()) return FromAbsl(cur.status());
  if (lease.generation != cur->generation) {
    return Status(StatusCode::kUnavailable,
                  "the lease is from before tuttid restarted (the client re-attached); look up "
                  "again");
  }
  tutti::v1::RetrieveRequest request;
  cur->Name(&request);
  request.set_lease_id(lease.id);
  AddPairs(keys, engine_blocks, request.mutable_blocks());
  request.set_layer_begin(layer_begin);
  request.set_layer_end(layer_end);
  const uint32_t ticket = rep_->NextTicket();
  request.set_ticket(ticket);
  auto transfer = std::make_shared<Retrieval::Rep>(static_cast<uint32_t>(keys.size()), layer_begin,
                                                   layer_end, ticket, rep_->words.get());
  rep_->inflight = transfer;
  rep_->reader =
      std::thread(&Rep::ReadStream, rep_.get(), transfer, std::move(request), cur->generation);
  return std::make_unique<Retrieval>(std::move(transfer));
}

Result<std::vector<StoreOutcome>> Client::Store(const std::vector<BlockKey>& keys,
                                                const std::vector<uint32_t>& engine_blocks,
                                                const StoreOptions& options) {
  if (Status s = CheckPairs(keys, engine_blocks); !s.ok()) return s;
  std::optional<absl::MutexLock> one_at_a_time;
  if (rep_->device != nullptr) one_at_a_time.emplace(&rep_->store_mu);
  if (rep_->device != nullptr && options.cuda_stream != nullptr) {
    absl::Status s = rep_->device->SynchronizeStream(options.cuda_stream);
    if (!s.ok()) return FromAbsl(s);
  }
  absl::StatusOr<Session::Current> cur = rep_->session->current();
  if (!cur.ok()) return FromAbsl(cur.status());
  tutti::v1::StoreRequest request;
  cur->Name(&request);
  AddPairs(keys, engine_blocks, request.mutable_blocks());
  request.set_layer_begin(options.layer_begin);
  request.set_layer_end(options.layer_end);
  request.set_wait_durable(options.wait_durable);
  request.set_ticket(rep_->NextTicket());
  tutti::v1::StoreResponse response;
  auto ctx = rep_->session->NewContext();
  absl::Status s = FromGrpc(rep_->session->stub().Store(ctx.get(), request, &response));
  rep_->session->Observe(s, cur->generation);
  if (!s.ok()) return FromAbsl(s);
  if (static_cast<size_t>(response.outcomes_size()) != keys.size()) {
    return Status(StatusCode::kInternal, "tuttid answered Store with a wrong number of outcomes");
  }
  std::vector<StoreOutcome> outcomes;
  outcomes.reserve(keys.size());
  for (int o : response.outcomes()) outcomes.push_back(static_cast<StoreOutcome>(o));
  return outcomes;
}

Status Client::Release(const Lease& lease) {
  if (lease.id == 0) return Status();
  absl::StatusOr<Session::Current> cur = rep_->session->current();
  if (!cur.ok()) return FromAbsl(cur.status());
  if (lease.generation != cur->generation) return Status();  // gone with the old session
  tutti::v1::ReleaseRequest request;
  cur->Name(&request);
  request.set_lease_id(lease.id);
  tutti::v1::ReleaseResponse response;
  auto ctx = rep_->session->NewContext();
  absl::Status s =
      FromGrpc(rep_->session->stub().Release(ctx.get(), request, &response));
  rep_->session->Observe(s, cur->generation);
  return FromAbsl(s);
}

Status Client::Detach() {
  {
    absl::MutexLock lock(&rep_->retrieve_mu);
    rep_->FinishInflight();
  }
  return FromAbsl(rep_->session->Detach());
}

SessionInfo Client::info() const { return rep_->session->info(); }

Retrieval::Retrieval(std::shared_ptr<Rep> rep) : rep_(std::move(rep)) {}
Retrieval::~Retrieval() { rep_->Wait(); }
Status Retrieval::WaitLayer(uint32_t layer, void* cuda_stream) {
  return rep_->WaitLayer(layer, cuda_stream);
}
const RetrieveOutcome& Retrieval::Wait() { return rep_->Wait(); }
uint32_t Retrieval::ticket() const { return rep_->ticket; }

}  // namespace tutti::client

#include "tests/gpu/gpu_engine.h"

#include <unistd.h>

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/handoff.h"
#include "common/status_macros.h"
#include "gpu/cuda_status.h"
#include "grpcpp/client_context.h"
#include "tests/gpu/tuttid_runner.h"

namespace tutti::gputest {
namespace {

using gpu::CudaStatus;
constexpr uint64_t kAllocGranularity = 2ull << 20;

// Engine blocks[i] with key key_ids[i] (Store and Retrieve).
template <typename Request>
void AddBlocks(const GpuEngine& engine, const std::vector<uint32_t>& blocks,
               const std::vector<uint32_t>& key_ids, Request* req) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto* b = req->add_blocks();
    b->set_key(engine.Key(key_ids[i]));
    b->set_engine_block(blocks[i]);
  }
}

absl::Status Rpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

uint64_t Fnv(absl::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}

}  // namespace

const char* FormatName(tutti::v1::KvFormat format) {
  switch (format) {
    case tutti::v1::KV_FORMAT_FUSED:
      return "fused";
    case tutti::v1::KV_FORMAT_SEPARATE:
      return "separate";
    case tutti::v1::KV_FORMAT_MLA:
      return "mla";
    default:
      return "unspecified";
  }
}

absl::StatusOr<std::unique_ptr<GpuEngine>> GpuEngine::Create(const EngineShape& shape,
                                                             const std::string& socket,
                                                             const std::string& engine_id) {
  std::unique_ptr<GpuEngine> e(new GpuEngine());
  e->shape_ = shape;
  RETURN_IF_ERROR(e->Allocate());
  RETURN_IF_ERROR(e->Attach(socket, engine_id));
  return e;
}

absl::Status GpuEngine::Allocate() {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(0), "cudaSetDevice"));
  const uint64_t obj = shape_.object_len(), nb = shape_.num_blocks;
  for (uint32_t l = 0; l < shape_.layers; ++l) {
    switch (shape_.format) {
      case tutti::v1::KV_FORMAT_FUSED:
        region_bytes_.push_back(2 * nb * obj);
        placements_.push_back({l, 0, obj});
        placements_.push_back({l, nb * obj, obj});
        break;
      case tutti::v1::KV_FORMAT_SEPARATE:
        region_bytes_.push_back(nb * obj);
        region_bytes_.push_back(nb * obj);
        placements_.push_back({2 * l, 0, obj});
        placements_.push_back({2 * l + 1, 0, obj});
        break;
      default:
        region_bytes_.push_back(nb * obj);
        placements_.push_back({l, 0, obj});
    }
  }
  for (uint64_t& bytes : region_bytes_) {
    bytes = (bytes + kAllocGranularity - 1) / kAllocGranularity * kAllocGranularity;
    void* p = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), "cudaMalloc(KV tensor)"));
    regions_.push_back(static_cast<uint8_t*>(p));
  }
  ASSIGN_OR_RETURN(words_, gpu::ReadyWordArray::Create(0, shape_.layers + 1));
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
  events_.resize(shape_.layers + 1);
  for (cudaEvent_t& ev : events_) RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&ev), "event"));
  const uint64_t refs = uint64_t{shape_.layers} * shape_.parts() * shape_.num_blocks;
  RETURN_IF_ERROR(CudaStatus(
      cudaMalloc(reinterpret_cast<void**>(&fill_refs_), refs * sizeof(ObjectRef)), "cudaMalloc"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMalloc(reinterpret_cast<void**>(&check_refs_), refs * sizeof(ObjectRef)), "cudaMalloc"));
  return CudaStatus(
      cudaMalloc(reinterpret_cast<void**>(&counters_), shape_.layers * sizeof(unsigned long long)),
      "cudaMalloc");
}

absl::Status GpuEngine::Attach(const std::string& socket, const std::string& engine_id) {
  channel_ = UnixChannel(socket);
  stub_ = tutti::v1::KvCache::NewStub(channel_);
  ASSIGN_OR_RETURN(gpu::DeviceInfo device, gpu::Probe(0));
  tutti::v1::AttachRequest req;
  req.set_engine_id(engine_id);
  auto* ns = req.mutable_namespace_();
  ns->set_model_id(shape_.model_id);
  ns->set_tp_size(1);
  ns->set_hash_scheme("gpu-test-v1");
  auto* l = ns->mutable_layout();
  l->set_num_layers(shape_.layers);
  l->set_kv_heads(shape_.kv_heads);
  l->set_head_dim(shape_.head_dim);
  l->set_dtype_bytes(shape_.dtype_bytes);
  l->set_block_tokens(shape_.block_tokens);
  l->set_format(shape_.format);
  for (size_t i = 0; i < regions_.size(); ++i) {
    cudaIpcMemHandle_t h;
    RETURN_IF_ERROR(CudaStatus(cudaIpcGetMemHandle(&h, regions_[i]), "cudaIpcGetMemHandle"));
    auto* r = req.add_regions()->mutable_cuda_ipc();
    r->set_ipc_handle(std::string(reinterpret_cast<const char*>(&h), sizeof(h)));
    r->set_size_bytes(region_bytes_[i]);
    r->set_gpu_uuid(device.uuid_text);
  }
  for (const Placement& p : placements_) {
    auto* pl = req.add_placements();
    pl->set_region(p.region);
    pl->set_offset(p.offset);
    pl->set_block_stride(p.stride);
  }
  req.set_num_blocks(shape_.num_blocks);
  ASSIGN_OR_RETURN(gpu::IpcRegion words, words_->ExportIpc());
  auto* rw = req.mutable_ready_words();
  rw->mutable_region()->set_ipc_handle(words.handle);
  rw->mutable_region()->set_size_bytes(words.size_bytes);
  rw->mutable_region()->set_gpu_uuid(words.gpu_uuid);
  rw->set_count(shape_.layers + 1);
  req.set_engine_pid(static_cast<uint32_t>(getpid()));
  // GPU memory travels as IPC handles; the handoff carries only who this engine is.
  ASSIGN_OR_RETURN(std::string credential, HandOff(socket, {}));
  req.set_credential(credential);
  grpc::ClientContext ctx;
  tutti::v1::AttachResponse resp;
  RETURN_IF_ERROR(Rpc(stub_->Attach(&ctx, req, &resp), "Attach"));
  session_id_ = resp.session_id();
  session_token_ = resp.session_token();
  return absl::OkStatus();
}

GpuEngine::~GpuEngine() {
  if (session_id_ != 0) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    tutti::v1::DetachRequest req;
    req.set_session_id(session_id_);
    req.set_session_token(session_token_);
    tutti::v1::DetachResponse resp;
    (void)stub_->Detach(&ctx, req, &resp);
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  for (uint8_t* r : regions_) cudaFree(r);
  cudaFree(fill_refs_);
  cudaFree(check_refs_);
  cudaFree(counters_);
}

std::string GpuEngine::Key(uint32_t id) const {
  const uint64_t salt = Fnv(shape_.model_id);
  const uint64_t v = id;
  std::string k(16, '\0');
  std::memcpy(k.data(), &salt, 8);
  std::memcpy(k.data() + 8, &v, 8);
  return k;
}

void* GpuEngine::Object(uint32_t block, uint32_t object) const {
  const Placement& p = placements_[object];
  return regions_[p.region] + p.offset + uint64_t{block} * p.stride;
}

absl::Status GpuEngine::UploadRefs(const std::vector<ObjectRef>& refs, ObjectRef* dst) {
  return CudaStatus(
      cudaMemcpy(dst, refs.data(), refs.size() * sizeof(ObjectRef), cudaMemcpyHostToDevice),
      "cudaMemcpy(refs)");
}

absl::Status GpuEngine::Fill(const std::vector<uint32_t>& blocks,
                             const std::vector<uint32_t>& key_ids, uint64_t seed) {
  std::vector<ObjectRef> refs;
  const uint32_t objects = shape_.layers * shape_.parts();
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (uint32_t j = 0; j < objects; ++j) {
      refs.push_back({Object(blocks[i], j), (uint64_t{key_ids[i]} << 16) | j});
    }
  }
  RETURN_IF_ERROR(UploadRefs(refs, fill_refs_));
  RETURN_IF_ERROR(
      CudaStatus(LaunchFillObjects(fill_refs_, refs.size(), shape_.object_len(), seed, stream_),
                 "fill kernel"));
  return CudaStatus(cudaStreamSynchronize(stream_), "fill");
}

absl::Status GpuEngine::Poison(uint8_t byte) {
  for (size_t i = 0; i < regions_.size(); ++i) {
    RETURN_IF_ERROR(
        CudaStatus(cudaMemsetAsync(regions_[i], byte, region_bytes_[i], stream_), "memset"));
  }
  return CudaStatus(cudaStreamSynchronize(stream_), "poison");
}

absl::StatusOr<std::vector<tutti::v1::StoreOutcome>> GpuEngine::Store(
    const std::vector<uint32_t>& blocks, const std::vector<uint32_t>& key_ids, bool wait_durable) {
  tutti::v1::StoreRequest req;
  req.set_session_id(session_id_);
  req.set_session_token(session_token_);
  AddBlocks(*this, blocks, key_ids, &req);
  req.set_wait_durable(wait_durable);
  const uint32_t ticket = NextTicket();
  req.set_ticket(ticket);
  // As an engine would: its stream may not overwrite the blocks before they are captured.
  RETURN_IF_ERROR(gpu::WaitLayer(stream_, words_->word(shape_.layers), ticket));
  grpc::ClientContext ctx;
  tutti::v1::StoreResponse resp;
  absl::Status s = Rpc(stub_->Store(&ctx, req, &resp), "Store");
  if (!s.ok()) {
    (void)words_->ForceRelease(ticket);  // a refused Store writes no word
    return s;
  }
  if (!WaitStream(absl::Seconds(10))) {
    return absl::DeadlineExceededError("the captured word was not written");
  }
  std::vector<tutti::v1::StoreOutcome> out;
  for (int o : resp.outcomes()) out.push_back(static_cast<tutti::v1::StoreOutcome>(o));
  return out;
}

absl::StatusOr<std::pair<uint32_t, uint64_t>> GpuEngine::Lookup(
    const std::vector<uint32_t>& key_ids) {
  tutti::v1::LookupRequest req;
  req.set_session_id(session_id_);
  req.set_session_token(session_token_);
  for (uint32_t id : key_ids) req.add_keys(Key(id));
  grpc::ClientContext ctx;
  tutti::v1::LookupResponse resp;
  RETURN_IF_ERROR(Rpc(stub_->Lookup(&ctx, req, &resp), "Lookup"));
  return std::make_pair(resp.hits(), resp.lease_id());
}

absl::Status GpuEngine::EnqueueLayerWaits(uint32_t ticket, const std::vector<uint32_t>& blocks,
                                          const std::vector<uint32_t>& key_ids,
                                          std::optional<uint64_t> check_seed) {
  const uint32_t parts = shape_.parts();
  if (check_seed.has_value()) {
    std::vector<ObjectRef> refs;  // layer-major
    for (uint32_t l = 0; l < shape_.layers; ++l) {
      for (size_t i = 0; i < blocks.size(); ++i) {
        for (uint32_t p = 0; p < parts; ++p) {
          const uint32_t j = l * parts + p;
          refs.push_back({Object(blocks[i], j), (uint64_t{key_ids[i]} << 16) | j});
        }
      }
    }
    RETURN_IF_ERROR(UploadRefs(refs, check_refs_));
  }
  RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(counters_, 0, shape_.layers * sizeof(unsigned long long), stream_), "zero"));
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(events_[0], stream_), "event"));
  const uint32_t per_layer = static_cast<uint32_t>(blocks.size()) * parts;
  for (uint32_t l = 0; l < shape_.layers; ++l) {
    RETURN_IF_ERROR(gpu::WaitLayer(stream_, words_->word(l), ticket));
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(events_[1 + l], stream_), "event"));
    if (check_seed.has_value()) {
      RETURN_IF_ERROR(CudaStatus(
          LaunchCountMismatches(check_refs_ + uint64_t{l} * per_layer, per_layer,
                                shape_.object_len(), *check_seed, counters_ + l, stream_),
          "check kernel"));
    }
  }
  return absl::OkStatus();
}

RetrieveResult GpuEngine::Retrieve(uint64_t lease, const std::vector<uint32_t>& blocks,
                                   const std::vector<uint32_t>& key_ids, uint32_t ticket,
                                   const std::function<void(uint32_t)>& on_progress) {
  tutti::v1::RetrieveRequest req;
  req.set_session_id(session_id_);
  req.set_session_token(session_token_);
  req.set_lease_id(lease);
  AddBlocks(*this, blocks, key_ids, &req);
  req.set_ticket(ticket);
  RetrieveResult out;
  const absl::Time start = absl::Now();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = stub_->Retrieve(&ctx, req);
  tutti::v1::RetrieveProgress progress;
  while (reader->Read(&progress)) {
    out.layers_reported.push_back(progress.layer());
    out.failed.insert(out.failed.end(), progress.failed().begin(), progress.failed().end());
    if (on_progress) on_progress(progress.layer());
  }
  out.rpc = reader->Finish();
  out.rpc_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  return out;
}

bool GpuEngine::WaitStream(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) return false;
    absl::SleepFor(absl::Microseconds(200));
  }
  return false;
}

absl::StatusOr<std::vector<uint64_t>> GpuEngine::Mismatches() const {
  std::vector<unsigned long long> host(shape_.layers);
  RETURN_IF_ERROR(
      CudaStatus(cudaMemcpy(host.data(), counters_, host.size() * 8, cudaMemcpyDeviceToHost),
                 "cudaMemcpy(counters)"));
  return std::vector<uint64_t>(host.begin(), host.end());
}

absl::StatusOr<std::vector<float>> GpuEngine::LayerReadyMs() const {
  std::vector<float> ms(shape_.layers);
  for (uint32_t l = 0; l < shape_.layers; ++l) {
    RETURN_IF_ERROR(
        CudaStatus(cudaEventElapsedTime(&ms[l], events_[0], events_[1 + l]), "elapsed"));
  }
  return ms;
}

}  // namespace tutti::gputest

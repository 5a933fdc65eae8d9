#include "tests/common/fake_tuttid.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/handoff.h"
#include "daemon/server/credentials.h"
#include "daemon/server/handoff_server.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "tutti/v1/admin.grpc.pb.h"
#include "tutti/v1/kvcache.grpc.pb.h"

namespace tutti::testing {

using grpc::ServerContext;
using grpc::StatusCode;
namespace v1 = tutti::v1;

namespace {

struct Session {
  std::string engine_id, model_id;
  uint8_t* base = nullptr;
  uint64_t size = 0;
  std::vector<v1::ObjectPlacement> placements;
  uint32_t num_blocks = 0, layers = 0, parts = 0;
  uint64_t object_len = 0;
  uint8_t* Object(uint32_t block, uint32_t object) const {
    const auto& p = placements[object];
    return base + p.offset() + block * p.block_stride();
  }
};

}  // namespace

class FakeTuttid::Impl final : public v1::KvCache::Service, public v1::Admin::Service {
 public:
  ~Impl() override {
    if (server_) server_->Shutdown();
    for (auto& [id, s] : sessions_) munmap(s.base, s.size);
  }

  grpc::Status Attach(ServerContext*, const v1::AttachRequest* req,
                      v1::AttachResponse* resp) override {
    if (req->regions_size() != 1 || !req->regions(0).has_host_shm()) {
      return grpc::Status(StatusCode::INVALID_ARGUMENT, "want one host_shm region");
    }
    const auto& shm = req->regions(0).host_shm();
    absl::StatusOr<server::Credential> credential = credentials_.Redeem(req->credential());
    if (!credential.ok()) {
      return grpc::Status(StatusCode::PERMISSION_DENIED,
                          std::string(credential.status().message()));
    }
    if (shm.fd_index() >= credential->fds.size()) {
      return grpc::Status(StatusCode::INVALID_ARGUMENT, "fd_index");
    }
    const int fd = credential->fds[shm.fd_index()].get();
    void* p = mmap(nullptr, shm.size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return grpc::Status(StatusCode::INVALID_ARGUMENT, "mmap");
    const auto& layout = req->namespace_().layout();
    Session s;
    s.engine_id = req->engine_id();
    s.model_id = req->namespace_().model_id();
    s.base = static_cast<uint8_t*>(p);
    s.size = shm.size_bytes();
    s.placements.assign(req->placements().begin(), req->placements().end());
    s.num_blocks = req->num_blocks();
    s.layers = layout.num_layers();
    s.parts = layout.format() == v1::KV_FORMAT_MLA ? 1 : 2;
    s.object_len = uint64_t{layout.block_tokens()} * layout.kv_heads() * layout.head_dim() *
                   layout.dtype_bytes();
    absl::MutexLock lock(&mu_);
    const uint64_t id = ++next_id_;
    sessions_[id] = std::move(s);
    resp->set_session_id(id);
    resp->set_session_token(TokenOf(id));
    resp->set_namespace_id(0xabcdef0123456789ull);
    resp->set_session_ttl_ms(400);
    resp->set_max_blocks_per_call(4096);
    resp->set_object_bytes(sessions_[id].object_len);
    return grpc::Status::OK;
  }

  grpc::Status KeepAlive(ServerContext*, const v1::KeepAliveRequest* req,
                         v1::KeepAliveResponse* resp) override {
    absl::MutexLock lock(&mu_);
    if (Find(*req) == sessions_.end()) return grpc::Status(StatusCode::NOT_FOUND, "session");
    ++keepalives_;
    resp->set_session_ttl_ms(400);
    return grpc::Status::OK;
  }

  grpc::Status Lookup(ServerContext*, const v1::LookupRequest* req,
                      v1::LookupResponse* resp) override {
    absl::MutexLock lock(&mu_);
    if (Find(*req) == sessions_.end()) return grpc::Status(StatusCode::NOT_FOUND, "session");
    ++lookups_;
    uint32_t hits = 0;
    while (hits < req->keys_size() && blocks_.contains(req->keys(hits))) ++hits;
    resp->set_hits(hits);
    if (hits > 0) {
      const uint64_t lease = ++next_id_;
      leases_[lease].assign(req->keys().begin(), req->keys().begin() + hits);
      resp->set_lease_id(lease);
      resp->set_lease_ttl_ms(1000);
    }
    return grpc::Status::OK;
  }

  grpc::Status Retrieve(ServerContext*, const v1::RetrieveRequest* req,
                        grpc::ServerWriter<v1::RetrieveProgress>* writer) override {
    absl::MutexLock lock(&mu_);
    auto sit = Find(*req);
    if (sit == sessions_.end()) return grpc::Status(StatusCode::NOT_FOUND, "session");
    if (!leases_.contains(req->lease_id())) return grpc::Status(StatusCode::NOT_FOUND, "lease");
    const Session& s = sit->second;
    std::vector<uint32_t> failed;
    for (int i = 0; i < req->blocks_size(); ++i) {
      if (failing_.contains(req->blocks(i).key())) failed.push_back(i);
    }
    for (uint32_t l = 0; l < s.layers; ++l) {
      v1::RetrieveProgress progress;
      progress.set_layer(l);
      if (l == 0) progress.mutable_failed()->Add(failed.begin(), failed.end());
      for (int i = 0; i < req->blocks_size(); ++i) {
        if (failing_.contains(req->blocks(i).key())) continue;
        const std::string& data = blocks_.at(req->blocks(i).key());
        for (uint32_t p = 0; p < s.parts; ++p) {
          const uint32_t obj = l * s.parts + p;
          std::memcpy(s.Object(req->blocks(i).engine_block(), obj),
                      data.data() + obj * s.object_len, s.object_len);
        }
      }
      if (l == 0 && corrupt_next_ && req->blocks_size() > 0) {
        s.Object(req->blocks(0).engine_block(), 0)[5] ^= 0x5a;
        corrupt_next_ = false;
      }
      writer->Write(progress);
    }
    leases_.erase(req->lease_id());
    return grpc::Status::OK;
  }

  grpc::Status Store(ServerContext*, const v1::StoreRequest* req,
                     v1::StoreResponse* resp) override {
    absl::MutexLock lock(&mu_);
    ++store_calls_;
    if (store_error_ != 0) return grpc::Status(static_cast<StatusCode>(store_error_), "injected");
    auto sit = Find(*req);
    if (sit == sessions_.end()) return grpc::Status(StatusCode::NOT_FOUND, "session");
    const Session& s = sit->second;
    for (const auto& pair : req->blocks()) {
      if (reject_ > 0) {
        --reject_;
        resp->add_outcomes(v1::STORE_REJECTED_FULL);
        continue;
      }
      if (blocks_.contains(pair.key())) {
        resp->add_outcomes(v1::STORE_ALREADY_PRESENT);
        continue;
      }
      std::string data(s.object_len * s.layers * s.parts, '\0');
      for (uint32_t obj = 0; obj < s.layers * s.parts; ++obj) {
        std::memcpy(data.data() + obj * s.object_len, s.Object(pair.engine_block(), obj),
                    s.object_len);
      }
      blocks_[pair.key()] = std::move(data);
      resp->add_outcomes(req->wait_durable() ? v1::STORE_DURABLE : v1::STORE_CAPTURED);
    }
    return grpc::Status::OK;
  }

  grpc::Status Release(ServerContext*, const v1::ReleaseRequest* req,
                       v1::ReleaseResponse*) override {
    absl::MutexLock lock(&mu_);
    if (leases_.erase(req->lease_id()) == 0) return grpc::Status(StatusCode::NOT_FOUND, "lease");
    return grpc::Status::OK;
  }

  grpc::Status Detach(ServerContext*, const v1::DetachRequest* req, v1::DetachResponse*) override {
    absl::MutexLock lock(&mu_);
    auto it = Find(*req);
    if (it == sessions_.end()) return grpc::Status(StatusCode::NOT_FOUND, "session");
    munmap(it->second.base, it->second.size);
    sessions_.erase(it);
    return grpc::Status::OK;
  }

  grpc::Status Status(ServerContext*, const v1::StatusRequest*, v1::StatusResponse* resp) override {
    absl::MutexLock lock(&mu_);
    resp->set_version("fake-1");
    resp->set_uptime_ms(3723004);
    resp->set_io_backend("memory");
    resp->set_device_mode("host");
    resp->add_pool_dirs("/fake/pool");
    resp->set_capacity_bytes(kCapacity);
    resp->set_used_bytes(blocks_.size() * kBlockBytes);
    resp->set_slots_total(kCapacity / kBlockBytes);
    resp->set_slots_used(blocks_.size());
    resp->set_sessions(sessions_.size());
    resp->set_notes("fake daemon");
    return grpc::Status::OK;
  }

  grpc::Status Sessions(ServerContext*, const v1::SessionsRequest*,
                        v1::SessionsResponse* resp) override {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sessions_) {
      v1::SessionInfo* info = resp->add_sessions();
      info->set_session_id(id);
      info->set_engine_id(s.engine_id);
      info->set_namespace_id(0xabcdef0123456789ull);
      info->set_model_id(s.model_id);
      info->set_num_blocks(s.num_blocks);
      info->set_leases(leases_.size());
      info->set_idle_ms(12);
    }
    return grpc::Status::OK;
  }

  grpc::Status Stats(ServerContext*, const v1::StatsRequest*, v1::StatsResponse* resp) override {
    absl::MutexLock lock(&mu_);
    resp->set_capacity_bytes(kCapacity);
    resp->set_used_bytes(blocks_.size() * kBlockBytes);
    resp->set_slots_total(kCapacity / kBlockBytes);
    resp->set_slots_used(blocks_.size());
    resp->set_lookups(lookups_);
    resp->set_blocks_stored(blocks_.size());
    resp->set_sessions(sessions_.size());
    resp->set_write_backlog_bytes(3 * kBlockBytes);  // fixed figures, for tuttictl's output
    resp->set_write_backlog_blocks(3);
    resp->set_write_backlog_age_ms(250);
    resp->set_store_rejected_backlog(2);
    resp->set_admission("second_sight");  // fixed figures, for tuttictl's output
    resp->set_blocks_admitted(5);
    resp->set_blocks_declined(7);
    v1::MetricFamily* errors = resp->add_metrics();  // fixed figures, for tuttictl's output
    errors->set_name("tutti_errors_total");
    errors->set_help("Failures by kind.");
    errors->set_type("counter");
    errors->add_label_names("kind");
    v1::MetricSample* verify = errors->add_samples();
    verify->add_label_values("verify");
    verify->set_value(4);
    v1::NamespaceStats* ns = resp->add_namespaces();
    ns->set_namespace_id(0xabcdef0123456789ull);
    ns->set_model_id("bench-llama3-8b");
    ns->set_blocks_ssd(blocks_.size());
    return grpc::Status::OK;
  }

  grpc::Status Evict(ServerContext*, const v1::EvictRequest* req,
                     v1::EvictResponse* resp) override {
    absl::MutexLock lock(&mu_);
    if (req->namespace_id() == 0 && !req->all()) {
      return grpc::Status(StatusCode::INVALID_ARGUMENT, "namespace_id 0 needs all");
    }
    if (req->namespace_id() != 0 && req->namespace_id() != 0xabcdef0123456789ull) {
      return grpc::Status(StatusCode::NOT_FOUND, "no such namespace");
    }
    resp->set_evicted(blocks_.size());
    blocks_.clear();
    return grpc::Status::OK;
  }

  // Verify: its blocks in batches; the keys of FailKey are found bad (and dropped).
  grpc::Status Verify(ServerContext*, const v1::VerifyRequest* req,
                      grpc::ServerWriter<v1::VerifyProgress>* writer) override {
    absl::MutexLock lock(&mu_);
    const uint64_t total = blocks_.size(),
                   batch = req->batch_blocks() == 0 ? 8 : req->batch_blocks();
    v1::VerifyProgress last;
    last.set_blocks_total(total);
    for (uint64_t done = 0; done < total;) {
      done = std::min(total, done + batch);
      v1::VerifyProgress p;
      p.set_blocks_total(total);
      p.set_blocks_checked(done);
      p.set_bytes_read(done * kBlockBytes);
      p.set_elapsed_seconds(0.5 * static_cast<double>(done) / static_cast<double>(batch));
      writer->Write(p);
      last = p;
    }
    if (corrupt_for_verify_ && !blocks_.empty()) {
      corrupt_for_verify_ = false;
      auto first = std::min_element(blocks_.begin(), blocks_.end(),
                                    [](const auto& a, const auto& b) { return a.first < b.first; });
      v1::BadBlock* b = last.add_bad();
      b->set_namespace_id(0xabcdef0123456789ull);
      b->set_key_hex(absl::BytesToHexString(first->first));
      b->set_slot(7);
      b->set_reason("object checksum mismatch");
      blocks_.erase(first);
    }
    last.set_blocks_bad(last.bad_size());
    last.set_done(true);
    writer->Write(last);
    return grpc::Status::OK;
  }

  grpc::Status Drain(ServerContext*, const v1::DrainRequest* req,
                     v1::DrainResponse* resp) override {
    resp->set_backlog_blocks_before(3);
    resp->set_backlog_bytes_before(3 * kBlockBytes);
    const bool drained = req->timeout_ms() >= 1000;  // the fake "needs" a second
    resp->set_backlog_blocks_after(drained ? 0 : 1);
    resp->set_backlog_bytes_after(drained ? 0 : kBlockBytes);
    resp->set_elapsed_ms(drained ? 1000 : req->timeout_ms());
    resp->set_drained(drained);
    return grpc::Status::OK;
  }

  grpc::Status Config(ServerContext*, const v1::ConfigRequest*, v1::ConfigResponse* resp) override {
    resp->set_text("pool {\n  dirs: \"/fake/pool\"\n}\nlog_level: \"info\"\n");
    return grpc::Status::OK;
  }

  grpc::Status SetLogLevel(ServerContext*, const v1::SetLogLevelRequest* req,
                           v1::SetLogLevelResponse* resp) override {
    if (req->subsystem() != "store" && req->subsystem() != "all") {
      return grpc::Status(StatusCode::NOT_FOUND, "no logger named '" + req->subsystem() + "'");
    }
    if (req->level() != "debug" && req->level() != "info") {
      return grpc::Status(StatusCode::INVALID_ARGUMENT, "unknown log level '" + req->level() + "'");
    }
    if (req->subsystem() == "store") resp->set_previous_level("info");
    return grpc::Status::OK;
  }

  // As tuttid: a token per session (here derived from the id, not random), and a request whose
  // token is not its session's names no session.
  static std::string TokenOf(uint64_t id) {
    std::string token(16, 't');
    std::memcpy(token.data(), &id, sizeof(id));
    return token;
  }
  template <class Request>
  std::map<uint64_t, Session>::iterator Find(const Request& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = sessions_.find(req.session_id());
    if (it == sessions_.end() || req.session_token() != TokenOf(req.session_id())) {
      return sessions_.end();
    }
    return it;
  }

  static constexpr uint64_t kCapacity = 1ull << 30;
  static constexpr uint64_t kBlockBytes = 2ull << 20;

  mutable absl::Mutex mu_;
  std::unique_ptr<grpc::Server> server_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::vector<std::string>> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, bool> failing_ ABSL_GUARDED_BY(mu_);
  bool corrupt_next_ ABSL_GUARDED_BY(mu_) = false;
  bool corrupt_for_verify_ ABSL_GUARDED_BY(mu_) = false;
  int reject_ ABSL_GUARDED_BY(mu_) = 0;
  int store_error_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t store_calls_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t keepalives_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t lookups_ ABSL_GUARDED_BY(mu_) = 0;
  server::CredentialTable credentials_{server::CredentialTable::Options{}, Clock::Real()};
  std::unique_ptr<server::HandoffServer> handoff_;
};

absl::StatusOr<std::unique_ptr<FakeTuttid>> FakeTuttid::Start(const std::string& socket_path) {
  unlink(socket_path.c_str());
  auto impl = std::make_unique<Impl>();
  grpc::ServerBuilder builder;
  unlink((socket_path + ".admin").c_str());
  // Both services on the engine socket and the admin socket: a fake need not keep them apart.
  builder.AddListeningPort(absl::StrCat("unix:", socket_path), grpc::InsecureServerCredentials());
  builder.AddListeningPort(absl::StrCat("unix:", socket_path, ".admin"),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(static_cast<v1::KvCache::Service*>(impl.get()));
  builder.RegisterService(static_cast<v1::Admin::Service*>(impl.get()));
  impl->server_ = builder.BuildAndStart();
  if (!impl->server_) return absl::InternalError("cannot serve on " + socket_path);
  auto handoff =
      server::HandoffServer::Start(HandoffPath(socket_path), {0600, ""}, &impl->credentials_);
  if (!handoff.ok()) return handoff.status();
  impl->handoff_ = std::move(*handoff);
  return std::unique_ptr<FakeTuttid>(new FakeTuttid(std::move(impl)));
}

FakeTuttid::FakeTuttid(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FakeTuttid::~FakeTuttid() = default;

void FakeTuttid::CorruptNextRetrieve() {
  absl::MutexLock lock(&impl_->mu_);
  impl_->corrupt_next_ = true;
}
void FakeTuttid::FailKey(const Key& key) {
  absl::MutexLock lock(&impl_->mu_);
  impl_->failing_[std::string(key.view())] = true;
}
void FakeTuttid::RejectNextStores(int n) {
  absl::MutexLock lock(&impl_->mu_);
  impl_->reject_ = n;
}
void FakeTuttid::CorruptOneBlockForVerify() {
  absl::MutexLock lock(&impl_->mu_);
  impl_->corrupt_for_verify_ = true;
}
void FakeTuttid::FailStoresWith(int grpc_code) {
  absl::MutexLock lock(&impl_->mu_);
  impl_->store_error_ = grpc_code;
}
uint64_t FakeTuttid::blocks() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->blocks_.size();
}
uint64_t FakeTuttid::store_calls() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->store_calls_;
}
uint64_t FakeTuttid::keepalives() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->keepalives_;
}
uint64_t FakeTuttid::sessions() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->sessions_.size();
}

}  // namespace tutti::testing

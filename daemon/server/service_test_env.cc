#include "daemon/server/service_test_env.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/handoff.h"
#include "daemon/pool/layout.h"
#include "daemon/store/store_stats.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"

namespace tutti::server::testing {
namespace {

std::atomic<int> counter{0};

uint8_t Pattern(uint64_t block_seed, uint32_t obj, uint32_t i) {
  return static_cast<uint8_t>(block_seed * 131 + obj * 17 + i * 7 + (i >> 8));
}

}  // namespace

ShmEngine::ShmEngine() {
  // Not getpid(): tests in Bazel's sandbox share /dev/shm and may share a pid.
  name_ = absl::StrCat("/tutti_svc_test_", std::random_device{}(), "_", counter++);
  fd_ = shm_open(name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  EXPECT_GE(fd_, 0) << strerror(errno);
  EXPECT_EQ(ftruncate(fd_, kEngineBlocks * kBlockBytes), 0);
  base_ = static_cast<uint8_t*>(
      mmap(nullptr, kEngineBlocks * kBlockBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
  EXPECT_NE(base_, MAP_FAILED);
}

ShmEngine::~ShmEngine() {
  munmap(base_, kEngineBlocks * kBlockBytes);
  close(fd_);
  shm_unlink(name_.c_str());
}

void ShmEngine::Fill(uint32_t block, uint64_t seed) {
  for (uint32_t o = 0; o < kObjects; ++o) {
    for (uint32_t i = 0; i < kObjectLen; ++i) object(block, o)[i] = Pattern(seed, o, i);
  }
}

bool ShmEngine::Check(uint32_t block, uint64_t seed, uint32_t layer_begin, uint32_t layer_end) {
  for (uint32_t o = layer_begin * kParts; o < layer_end * kParts; ++o) {
    for (uint32_t i = 0; i < kObjectLen; ++i) {
      if (object(block, o)[i] != Pattern(seed, o, i)) return false;
    }
  }
  return true;
}

void ShmEngine::Zero(uint32_t block) { std::memset(object(block, 0), 0, kBlockBytes); }

tutti::v1::AttachRequest ShmEngine::AttachRequest(const std::string& engine_id) const {
  tutti::v1::AttachRequest req;
  req.set_engine_id(engine_id);
  *req.mutable_namespace_() = TestNamespace();
  auto* shm = req.add_regions()->mutable_host_shm();
  shm->set_name(name_);
  shm->set_size_bytes(kEngineBlocks * kBlockBytes);
  for (uint32_t o = 0; o < kObjects; ++o) {
    auto* p = req.add_placements();
    p->set_region(0);
    p->set_offset(uint64_t{o} * kObjectLen);
    p->set_block_stride(kBlockBytes);
  }
  req.set_num_blocks(kEngineBlocks);
  return req;
}

tutti::v1::Namespace TestNamespace() {
  tutti::v1::Namespace ns;
  ns.set_model_id("test-model");
  auto* l = ns.mutable_layout();
  l->set_num_layers(kLayers);
  l->set_kv_heads(1);
  l->set_head_dim(64);
  l->set_dtype_bytes(2);
  l->set_block_tokens(16);
  l->set_format(tutti::v1::KV_FORMAT_SEPARATE);
  ns.set_tp_rank(0);
  ns.set_tp_size(1);
  ns.set_hash_scheme("test-hash");
  return ns;
}

std::string KeyBytes(uint64_t v) {
  std::string k(16, '\0');
  std::memcpy(k.data(), &v, 8);
  std::memcpy(k.data() + 8, "tutti-k!", 8);
  return k;
}

ServiceEnv::ServiceEnv(const EnvOptions& options) {
  const char* tmp = getenv("TEST_TMPDIR");
  std::string dir_template = absl::StrCat(tmp ? tmp : "/tmp", "/state.XXXXXX");
  EXPECT_NE(mkdtemp(dir_template.data()), nullptr);
  state_dir_ = dir_template;
  // sun_path is short: keep the socket under /tmp, in a directory of its own.
  std::string socket_dir = "/tmp/tutti_svc_XXXXXX";
  EXPECT_NE(mkdtemp(socket_dir.data()), nullptr);
  socket_dir_ = socket_dir;
  socket_path_ = socket_dir + "/tuttid.sock";

  auto layout = pool::PoolLayout::Compute(64ull << 20, 2, 4096, 8);
  EXPECT_TRUE(layout.ok()) << layout.status();
  auto backend = io::MemoryBackend::Create({layout->file_bytes(), layout->file_bytes()});
  EXPECT_TRUE(backend.ok()) << backend.status();
  backend_ = backend->get();
  store::StoreOptions so;
  so.state_dir = state_dir_;
  so.layout = *layout;
  so.store_staging_bytes = 4ull << 20;
  so.retrieve_staging_bytes = options.retrieve_staging_bytes;
  so.max_read_bytes_in_flight = options.max_read_bytes_in_flight;
  so.dram_bytes = options.dram_bytes;
  so.max_write_backlog_bytes = options.max_write_backlog_bytes;
  so.admission = options.admission;
  so.max_namespaces = options.max_namespaces;
  so.max_namespaces_per_user = options.max_namespaces_per_user;
  so.pool_share_per_user = options.pool_share_per_user;
  so.bandwidth = options.bandwidth;
  auto st = store::BlockStore::Open(so, std::move(*backend), Clock::Real());
  EXPECT_TRUE(st.ok()) << st.status();
  store_ = std::move(*st);

  store::BlockStore* raw_store = store_.get();
  SessionManager::Options session_options = options.sessions;
  session_options.session_ttl_ms = 30000;
  session_options.lease_ttl_ms = 10000;
  session_options.max_sessions = options.max_sessions;
  session_options.pool_slots = store_->Stats().slots_total;  // as tuttid's main does
  sessions_ = std::make_unique<SessionManager>(session_options, &session_clock_,
      [raw_store](NamespaceId ns, absl::Span<const Key> keys) { raw_store->Unpin(ns, keys); },
      [raw_store](uint64_t session_id) { raw_store->DropPending(session_id); });
  advisor_ = std::make_unique<decision::Advisor>(options.decision);
  kv_service_ = std::make_unique<KvCacheService>(
      KvCacheOptions{options.max_blocks_per_call, options.max_calls_per_session,
                     options.namespace_sharing},
      raw_store, sessions_.get(), &credentials_,
      options.opener ? options.opener : HostMemoryOpener(), &gate_, nullptr, advisor_.get());
  store::RegisterStoreStats(raw_store, &stats_);
  RegisterSessionStats([s = sessions_.get()] { return s->num_sessions(); }, &stats_);
  RegisterHandoffStats([c = &credentials_] { return c->outstanding(); }, &stats_);
  decision::RegisterAdvisorStats([a = advisor_.get()] { return a->Stats(); }, &stats_);
  RegisterGpuLayerStats(options.gpu_layers, &stats_);
  RegisterDeviceHealthStats([h = &device_health_] { return h->Snapshot(); }, &stats_);
  DaemonInfo info{"test", "memory", "host", {state_dir_ + "/pool"}, ""};
  info.stats = &stats_;
  info.gpu_memory_bytes = options.gpu_memory_bytes;
  info.config_text = "pool {\n  dirs: \"test\"\n}\n";
  info.device_health = &device_health_;
  admin_service_ = std::make_unique<AdminService>(std::move(info), raw_store, sessions_.get(),
                                                  &session_clock_, &gate_);
  auto server =
      Server::Start({socket_path_, {0660, ""}}, {kv_service_.get(), admin_service_.get()}, &gate_);
  EXPECT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);
  auto handoff = HandoffServer::Start(HandoffPath(socket_path_), {0660, ""}, &credentials_);
  EXPECT_TRUE(handoff.ok()) << handoff.status();
  handoff_ = std::move(*handoff);
  channel_ = grpc::CreateChannel(server_->target(), grpc::InsecureChannelCredentials());
  kv_ = tutti::v1::KvCache::NewStub(channel_);
  admin_ = tutti::v1::Admin::NewStub(channel_);
}

ServiceEnv::~ServiceEnv() {
  server_->Shutdown(absl::Seconds(5));
  server_.reset();
  handoff_.reset();
  admin_service_.reset();
  kv_service_.reset();
  advisor_.reset();
  sessions_.reset();
  store_.reset();
  std::filesystem::remove_all(state_dir_);
  std::filesystem::remove_all(socket_dir_);
}

tutti::v1::AttachRequest ServiceEnv::AttachRequest(const ShmEngine& engine,
                                                   const std::string& engine_id) {
  tutti::v1::AttachRequest req = engine.AttachRequest(engine_id);
  const int fds[] = {engine.fd()};
  absl::StatusOr<std::string> credential = HandOff(socket_path_, fds);
  EXPECT_TRUE(credential.ok()) << credential.status();
  if (credential.ok()) req.set_credential(*credential);
  return req;
}

uint64_t ServiceEnv::Attach(const ShmEngine& engine) {
  grpc::ClientContext ctx;
  tutti::v1::AttachResponse resp;
  grpc::Status s = kv_->Attach(&ctx, AttachRequest(engine), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return Remember(resp);
}

uint64_t ServiceEnv::Remember(const tutti::v1::AttachResponse& attached) {
  absl::MutexLock lock(&tokens_mu_);
  tokens_[attached.session_id()] = attached.session_token();
  return attached.session_id();
}

std::string ServiceEnv::Token(uint64_t session) const {
  absl::MutexLock lock(&tokens_mu_);
  auto it = tokens_.find(session);
  return it == tokens_.end() ? "" : it->second;
}

}  // namespace tutti::server::testing

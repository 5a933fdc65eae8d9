// tuttid: the tutti KV cache daemon. Reads its configuration, opens the pool and the block store,
// serves the engine and operator APIs on a unix socket, and on SIGTERM or SIGINT stops accepting,
// finishes or cancels in-flight work, flushes and checkpoints the store, and exits 0. Any start-up
// failure prints one line "tuttid: <what>" and exits 1.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "config/config.h"
#include "daemon/common/clock.h"
#include "daemon/common/dirs.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"
#include "daemon/decision/advisor.h"
#include "daemon/io/io_factory.h"
#include "daemon/pool/layout.h"
#include "daemon/pool/pool_files.h"
#include "daemon/common/handoff.h"
#include "daemon/server/admin_service.h"
#include "daemon/server/credentials.h"
#include "daemon/server/handoff_server.h"
#include "daemon/server/engine_watcher.h"
#include "daemon/server/gpu_engine_io.h"
#include "daemon/server/kvcache_service.h"
#include "daemon/server/server.h"
#include "daemon/server/sessions.h"
#include "daemon/store/block_store.h"
#include "gpu/io_stream.h"
#include "gpu/layer_copier.h"
#include "gpu/pinned.h"
#include "gpu/probe.h"

ABSL_FLAG(std::string, config, "",
          "text-proto config file (tutti.v1.Config) merged over the embedded default; empty: the "
          "embedded default only");
ABSL_FLAG(std::string, state_dir, "", "overrides state_dir of the config");
ABSL_FLAG(std::string, socket, "", "overrides listen.socket_path of the config");
ABSL_FLAG(bool, print_default_config, false, "print the embedded default config and exit");

namespace tutti {
namespace {

constexpr char kVersion[] = "0.1.0";
static_assert(config::kMaxObjectsPerSlot == pool::kMaxObjectsPerSlot,
              "config validation and the pool layout disagree on objects per slot");
static_assert(config::kMaxExtentSlots == pool::kMaxExtentSlots,
              "config validation and the pool layout disagree on extent slots");

// How long SIGTERM lets in-flight calls finish before cancelling them.
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);

// Tells systemd (Type=notify) about a state change, if NOTIFY_SOCKET is set: the sd_notify
// protocol by hand, one datagram.
void NotifySystemd(const char* state) {
  const char* path = getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = std::min(strlen(path), sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path, path, len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  const socklen_t addr_len = offsetof(sockaddr_un, sun_path) + len;
  if (sendto(fd, state, strlen(state), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), addr_len) <
      0) {
    log::Get("main")->warn("sd_notify {}: {}", state, strerror(errno));
  }
  close(fd);
}

absl::StatusOr<v1::Config> LoadEffectiveConfig() {
  const std::string path = absl::GetFlag(FLAGS_config);
  absl::StatusOr<v1::Config> loaded =
      path.empty() ? config::LoadConfig("") : config::LoadConfigFile(path);
  ASSIGN_OR_RETURN(v1::Config config, std::move(loaded));
  if (!absl::GetFlag(FLAGS_state_dir).empty()) config.set_state_dir(absl::GetFlag(FLAGS_state_dir));
  if (!absl::GetFlag(FLAGS_socket).empty()) {
    config.mutable_listen()->set_socket_path(absl::GetFlag(FLAGS_socket));
  }
  RETURN_IF_ERROR(config::ValidateConfig(config));
  if (config.pool().dirs().empty()) config.mutable_pool()->add_dirs(config.state_dir() + "/pool");
  return config;
}

// Opens (creating on first start) the pool files and the I/O backend over them. The "memory"
// backend keeps the pool in RAM and touches no file.
absl::StatusOr<std::unique_ptr<io::IoBackend>> OpenBackend(const v1::Config& config,
                                                           const pool::PoolLayout& layout) {
  const std::vector<std::string> dirs(config.pool().dirs().begin(), config.pool().dirs().end());
  std::vector<uint64_t> sizes(layout.num_files(), layout.file_bytes());
  std::vector<int> fds;
  if (config.io().backend() != "memory") {
    // Only the default pool directory is created. A configured one must exist: it is an SSD's
    // mount point, and creating it would silently put the pool on the root filesystem when the SSD
    // is not mounted.
    const std::string default_dir = config.state_dir() + "/pool";
    for (const std::string& d : dirs) {
      if (d == default_dir) RETURN_IF_ERROR(MakeDirs(d, 0750));
    }
    auto log = log::Get("main");
    int last_tenth = -1;
    ASSIGN_OR_RETURN(pool::PoolFiles files,
                     pool::OpenOrCreatePool(
                         dirs, layout, [&](const std::string& path, uint64_t done, uint64_t total) {
                           const int tenth = total == 0 ? 10 : static_cast<int>(done * 10 / total);
                           if (tenth == last_tenth) return;
                           last_tenth = tenth;
                           log->info("pool: allocating {}: {}%", path, tenth * 10);
                         }));
    log->info("pool {}: {} {}", files.UuidHex(), files.created ? "created" : "opened",
              absl::StrJoin(files.paths, ", "));
    fds = files.TakeFds();
  }
  return io::CreateIoBackend(config.io().backend(), std::move(fds), std::move(sizes),
                             io::IoOptions{config.io().queue_depth()});
}

store::StoreOptions MakeStoreOptions(const v1::Config& config, const pool::PoolLayout& layout) {
  store::StoreOptions o;
  o.state_dir = config.state_dir();
  o.layout = layout;
  o.dram_bytes = config.dram().capacity_bytes();
  o.store_staging_bytes = config.limits().store_staging_bytes();
  o.retrieve_staging_bytes = config.limits().retrieve_staging_bytes();
  o.max_read_bytes = static_cast<uint32_t>(config.datapath().max_read_bytes());
  o.checkpoint_every = config.journal().checkpoint_every();
  o.max_namespaces = config.limits().max_namespaces();
  o.max_staging_bytes_per_owner = config.limits().max_store_staging_bytes_per_session();
  o.pending_ttl_ms = config.limits().partial_store_ttl_ms();
  const v1::DatapathConfig& dp = config.datapath();  // 0: the meter's default prior
  if (dp.ssd_read_prior_bytes_per_sec() > 0) {
    o.bandwidth.ssd_prior_bytes_per_sec = dp.ssd_read_prior_bytes_per_sec();
  }
  if (dp.dram_read_prior_bytes_per_sec() > 0) {
    o.bandwidth.dram_prior_bytes_per_sec = dp.dram_read_prior_bytes_per_sec();
  }
  o.max_write_backlog_bytes = config.datapath().max_write_backlog_bytes();
  o.max_write_backlog_age_ms = config.datapath().max_write_backlog_age_ms();
  o.write_bytes_in_flight_while_reading = config.datapath().write_bytes_in_flight_while_reading();
  return o;
}

// Blocks until SIGTERM or SIGINT arrives (both are blocked in every thread; see main).
int WaitForStopSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

// The GPU data path of a daemon in cuda mode. Destroyed in reverse order: the copier, then the
// staging registration, then the stream.
struct GpuRuntime {
  gpu::DeviceInfo device;
  std::unique_ptr<gpu::IoStream> stream;
  std::unique_ptr<gpu::PinnedRegion> staging;  // the store's staging, page-locked and mapped
  std::unique_ptr<gpu::PinnedRegion> dram;     // the DRAM tier's region, likewise (if on)
  std::unique_ptr<gpu::LayerCopier> copier;
};

// The running daemon's parts. Destroyed in reverse order: serving stops before the sessions,
// the sessions (and their pins and mappings) go before the GPU runtime and the store.
struct Daemon {
  std::string io_backend;
  std::string device_mode = "host";
  std::vector<std::string> notes;  // fallbacks and modes taken at start, for logs and status
  server::CallGate gate;
  std::unique_ptr<server::CredentialTable> credentials;
  std::unique_ptr<store::BlockStore> store;
  std::unique_ptr<GpuRuntime> gpu;
  std::unique_ptr<server::SessionManager> sessions;
  std::unique_ptr<server::EngineWatcher> watcher;
  std::unique_ptr<decision::Advisor> advisor;
  std::unique_ptr<server::KvCacheService> kv;
  std::unique_ptr<server::AdminService> admin;
  std::unique_ptr<server::Server> server;        // engines: the KvCache service
  std::unique_ptr<server::HandoffServer> handoff;  // engines' credentials and memory
  std::unique_ptr<server::Server> admin_server;  // operators: the Admin service
  std::unique_ptr<server::Reaper> reaper;
};

// Lays out and opens the pool, the I/O backend and the block store (recovering its index).
absl::Status OpenStore(const v1::Config& config, Daemon* d) {
  RETURN_IF_ERROR(MakeDirs(config.state_dir(), 0750));
  ASSIGN_OR_RETURN(
      const pool::PoolLayout layout,
      pool::PoolLayout::Compute(config.pool().capacity_bytes(), config.pool().dirs_size(),
                                config.pool().object_bytes(), config.pool().max_objects(),
                                config.pool().extent_slots()));
  log::Get("main")->info(
      "pool: {} files of {} bytes, {} slots of {} objects x {} bytes, in extents of {} slots per "
      "file (pool.extent_slots = {})",
      layout.num_files(), layout.file_bytes(), layout.num_slots(), layout.max_objects(),
      layout.object_bytes(), layout.extent_slots(), config.pool().extent_slots());
  ASSIGN_OR_RETURN(std::unique_ptr<io::IoBackend> backend, OpenBackend(config, layout));
  d->io_backend = std::string(backend->name());
  if (d->io_backend == "memory") {
    d->notes.push_back("io backend \"memory\": the pool lives in RAM and nothing persists");
  }
  ASSIGN_OR_RETURN(d->store, store::BlockStore::Open(MakeStoreOptions(config, layout),
                                                     std::move(backend), Clock::Real()));
  return absl::OkStatus();
}

// GPU staging for retrieves: one layer of a maximal call, at most 512 MiB, and at least a slot
// per object (gpu/layer_copier.h).
uint64_t GpuStagingBytes(const v1::Config& config) {
  const uint64_t object = config.pool().object_bytes();
  const uint64_t layer = uint64_t{config.limits().max_blocks_per_call()} * 2 * object;
  return std::max(gpu::LayerCopier::kSlots * object, std::min<uint64_t>(layer, 512ull << 20));
}

// Decides the device mode before anything else starts: the device to use in cuda mode, or none
// (host mode, noted). gpu.mode = cuda without a usable GPU, or an io_sm_count the device cannot
// give, stops start-up.
absl::StatusOr<std::optional<gpu::DeviceInfo>> ChooseDevice(const v1::Config& config, Daemon* d) {
  const v1::GpuConfig& g = config.gpu();
  if (g.mode() == "host") {
    d->notes.push_back("host mode (gpu.mode = host): engines attach host shared memory");
    return std::nullopt;
  }
  absl::StatusOr<gpu::DeviceInfo> device = gpu::Probe(static_cast<int>(g.device()));
  if (!device.ok()) {
    if (g.mode() == "cuda") {
      return absl::FailedPreconditionError(absl::StrCat(
          "gpu.mode = cuda, but GPU ", g.device(), " is not usable: ", device.status().message()));
    }
    d->notes.push_back(absl::StrCat("host mode: no usable GPU (", device.status().message(),
                                    "); engines attach host shared memory"));
    return std::nullopt;
  }
  absl::Status valid = gpu::IoStream::ValidateOptions(
      {static_cast<int>(g.device()), g.io_sm_count(), g.copy_ctas()}, device->sm_count);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("gpu.io_sm_count = ", g.io_sm_count(), ": ",
                                                   device->name, " has ", device->sm_count,
                                                   " SMs (", valid.message(), ")"));
  }
  return *device;
}

// Sets up the GPU data path on `device`: the I/O stream (a green context, or an ordinary stream
// with a note), the store's staging registered as pinned and mapped (once: nothing is registered
// or allocated on the I/O path), and the layer copier with its GPU staging.
absl::Status StartGpu(const v1::Config& config, const gpu::DeviceInfo& device, Daemon* d) {
  const v1::GpuConfig& g = config.gpu();
  const gpu::IoStream::Options stream_options{static_cast<int>(g.device()), g.io_sm_count(),
                                              g.copy_ctas()};
  auto rt = std::make_unique<GpuRuntime>();
  rt->device = device;
  ASSIGN_OR_RETURN(rt->stream, gpu::IoStream::Create(stream_options));
  const absl::Span<uint8_t> staging = d->store->staging_region();
  ASSIGN_OR_RETURN(rt->staging, gpu::PinnedRegion::Register(staging.data(), staging.size()));
  // DRAM-tier hits are copied straight from the tier's region, so it is registered too (without
  // it they would go through the copier's bounce buffer, at about a third of the speed).
  std::vector<gpu::StagingRegion> registered = {rt->staging->staging()};
  const absl::Span<uint8_t> dram = d->store->dram_region();
  if (!dram.empty()) {
    ASSIGN_OR_RETURN(rt->dram, gpu::PinnedRegion::Register(dram.data(), dram.size()));
    registered.push_back(rt->dram->staging());
  }
  // ValidateConfig admits only the copier's names.
  const gpu::LayerCopier::Mode mode =
      gpu::LayerCopier::ModeFromName(g.scatter()).value_or(gpu::LayerCopier::Mode::kStaged);
  ASSIGN_OR_RETURN(rt->copier, gpu::LayerCopier::Create({mode, GpuStagingBytes(config),
                                                         /*bounce_threads=*/4, g.round_bytes()},
                                                        rt->stream.get(), registered));
  d->device_mode = "cuda";
  d->notes.push_back(absl::StrCat(
      "cuda mode on GPU ", g.device(), " (", device.name, ", ", device.uuid_text, "): I/O ",
      rt->stream->description(), ", ", rt->stream->ctas(), " CTAs per copy; retrieve copies ",
      g.scatter(),
      (mode == gpu::LayerCopier::Mode::kStaged || mode == gpu::LayerCopier::Mode::kAuto) &&
              g.round_bytes() > 0
          ? absl::StrCat(" in rounds of at most ", g.round_bytes() >> 10, " KiB")
          : std::string(),
      "; ", staging.size() >> 20, " MiB of staging and ", dram.size() >> 20,
      " MiB of DRAM tier registered"));
  if (!rt->stream->is_green() && g.io_sm_count() > 0) {
    d->notes.push_back("no green context: the daemon's kernels may use every SM");
  }
  if (const gpu::MpsHint mps = gpu::FindMps();
      !mps.control_pipe_found && mode != gpu::LayerCopier::Mode::kCopyEngine) {
    // Without MPS, scatter kernels time-slice the GPU with the engine's: "auto" cannot see it.
    d->notes.push_back(absl::StrCat(
        "no MPS control daemon found (no ", mps.pipe_directory,
        "/control): the GPU time-slices between tuttid and the engines, and an engine that keeps "
        "every SM busy loses about 16% while tuttid retrieves (docs/gpu.md); run "
        "nvidia-cuda-mps-control -d, or set gpu.scatter: \"copy_engine\""));
  }
  d->gpu = std::move(rt);
  return absl::OkStatus();
}

// Sessions, both services, the three sockets, and the reaper.
absl::Status StartServing(const v1::Config& config, Daemon* d) {
  const auto& limits = config.limits();
  server::SessionManager::Options session_options;
  session_options.session_ttl_ms = limits.session_ttl_ms();
  session_options.lease_ttl_ms = limits.lease_ttl_ms();
  session_options.max_sessions = limits.max_sessions();
  session_options.max_sessions_per_user = limits.max_sessions_per_user();
  session_options.max_leases_per_session = limits.max_leases_per_session();
  session_options.max_pinned_blocks_per_session = limits.max_pinned_blocks_per_session();
  session_options.max_pinned_blocks = limits.max_pinned_blocks();
  d->sessions = std::make_unique<server::SessionManager>(
      session_options, Clock::Real(),
      [s = d->store.get()](NamespaceId ns, absl::Span<const Key> keys) { s->Unpin(ns, keys); },
      [s = d->store.get()](uint64_t session_id) { s->DropPending(session_id); });
  // A credential waits at most a session TTL for its Attach; a user may have as many waiting as
  // it may have sessions.
  d->credentials = std::make_unique<server::CredentialTable>(
      server::CredentialTable::Options{limits.session_ttl_ms(), 4 * limits.max_sessions(),
                                       limits.max_sessions_per_user()},
      Clock::Real());
  ASSIGN_OR_RETURN(
      d->watcher, server::EngineWatcher::Create([s = d->sessions.get()](uint64_t id, uint32_t pid) {
        (void)s->Close(id,
                       absl::StrCat("engine process ", pid, " exited; its mappings are closed"));
      }));
  server::MemoryOpener opener =
      d->gpu ? server::GpuMemoryOpener({d->gpu->stream.get(), d->gpu->copier.get()})
             : server::HostMemoryOpener();
  d->advisor = std::make_unique<decision::Advisor>(config.datapath().decision() != "off",
                                                   config.datapath().decision_min_gain());
  d->kv = std::make_unique<server::KvCacheService>(
      server::KvCacheOptions{limits.max_blocks_per_call(), limits.max_calls_per_session()},
      d->store.get(), d->sessions.get(), d->credentials.get(), std::move(opener), &d->gate,
      d->watcher.get(), d->advisor.get());
  server::DaemonInfo info{kVersion,
                          d->io_backend,
                          d->device_mode,
                          {config.pool().dirs().begin(), config.pool().dirs().end()},
                          absl::StrJoin(d->notes, "; ")};
  info.handoffs_outstanding = [c = d->credentials.get()] { return c->outstanding(); };
  info.decision_stats = [a = d->advisor.get()] { return a->Stats(); };
  info.config_text = config::RenderConfig(config);
  if (d->gpu) {
    info.gpu_layers = [copier = d->gpu->copier.get()] {
      const gpu::LayerCopier::Counters c = copier->counters();
      return server::GpuLayerCounts{c.layers, c.copy_engine_layers, c.gathers,
                                    c.copy_engine_gathers};
    };
  }
  d->admin = std::make_unique<server::AdminService>(std::move(info), d->store.get(),
                                                    d->sessions.get(), Clock::Real(), &d->gate);
  const auto& listen = config.listen();
  const server::SocketAccess engines{listen.socket_mode(), listen.socket_group()};
  ASSIGN_OR_RETURN(d->handoff, server::HandoffServer::Start(HandoffPath(listen.socket_path()),
                                                            engines, d->credentials.get()));
  ASSIGN_OR_RETURN(
      d->admin_server,
      server::Server::Start({config::AdminSocketPath(listen),
                             {listen.admin_socket_mode(), listen.admin_socket_group()}},
                            {d->admin.get()}));
  ASSIGN_OR_RETURN(d->server,
                   server::Server::Start({listen.socket_path(), engines, limits.max_rpc_threads()},
                                         {d->kv.get()}, &d->gate));
  const uint32_t reap_ms =
      std::clamp<uint32_t>(std::min(limits.session_ttl_ms(), limits.lease_ttl_ms()) / 4, 10, 1000);
  d->reaper = std::make_unique<server::Reaper>(d->sessions.get(), reap_ms);
  return absl::OkStatus();
}

// Stops accepting, lets in-flight calls finish (then cancels them), drops every session, and
// makes every captured block durable before the store checkpoints and closes.
void Stop(Daemon* d) {
  d->server->Shutdown(kShutdownGrace);  // returns once every handler has returned
  d->admin_server->Shutdown(absl::ZeroDuration());  // the gate answers its calls UNAVAILABLE now
  d->handoff.reset();
  d->reaper.reset();
  d->watcher.reset();
  d->sessions.reset();  // drops every lease's pins and every engine mapping
  d->gpu.reset();       // before the store: its staging is unregistered first
  d->store->Flush();
  d->store.reset();  // checkpoints and stops the writer
}

absl::Status Run() {
  ASSIGN_OR_RETURN(const v1::Config config, LoadEffectiveConfig());
  log::SetLevel(config.log_level());
  auto log = log::Get("main");
  log->info("tuttid {} starting; effective configuration:\n{}", kVersion,
            config::RenderConfig(config));
  // Fail before touching the pool if another daemon serves this socket (Server::Start checks too).
  if (server::ProbeSocket(config.listen().socket_path(), SOCK_STREAM) ==
      server::SocketState::kAnswering) {
    return absl::FailedPreconditionError(
        absl::StrCat("another server (tuttid?) is answering on ", config.listen().socket_path()));
  }
  Daemon daemon;
  ASSIGN_OR_RETURN(const std::optional<gpu::DeviceInfo> device, ChooseDevice(config, &daemon));
  RETURN_IF_ERROR(OpenStore(config, &daemon));
  if (device.has_value()) RETURN_IF_ERROR(StartGpu(config, *device, &daemon));
  RETURN_IF_ERROR(StartServing(config, &daemon));
  log->info("ready: engines on unix:{} (and {}), operators on unix:{} ({}; io backend {})",
            config.listen().socket_path(), daemon.handoff->path(),
            config::AdminSocketPath(config.listen()), absl::StrJoin(daemon.notes, "; "),
            daemon.io_backend);
  NotifySystemd("READY=1");
  const int sig = WaitForStopSignal();
  log->info("{}: stopping; in-flight calls get {}", strsignal(sig),
            absl::FormatDuration(kShutdownGrace));
  NotifySystemd("STOPPING=1");
  Stop(&daemon);
  log->info("stopped cleanly");
  return absl::OkStatus();
}

}  // namespace
}  // namespace tutti

int main(int argc, char** argv) {
  // Block the stop signals before any thread starts, so every thread inherits the mask and only
  // WaitForStopSignal receives them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::SetProgramUsageMessage(
      "tuttid [--config=FILE] [--state_dir=DIR] [--socket=PATH]: the tutti KV cache daemon");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_print_default_config)) {
    std::fputs(std::string(tutti::config::DefaultConfigText()).c_str(), stdout);
    return 0;
  }
  const absl::Status status = tutti::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "tuttid: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

// tuttid: the tutti KV cache daemon. Reads its configuration, opens the pool and the block store,
// serves the engine and operator APIs on a unix socket, and on SIGTERM or SIGINT stops accepting,
// finishes or cancels in-flight work, flushes and checkpoints the store, and exits 0. Any start-up
// failure prints one line "tuttid: <what>" and exits 1. SIGHUP re-reads the config file and applies
// its run-time settings (daemon/service/reload.h). Under systemd (Type=notify) it reports through
// daemon/service: STATUS= at each start-up step, READY=1 once serving, then a heartbeat (STATUS=
// summary, WATCHDOG=1 while alive), RELOADING=1 around a reload and STOPPING=1 on SIGTERM.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "config/config.h"
#include "common/clock.h"
#include "common/dirs.h"
#include "common/log.h"
#include "common/stats.h"
#include "common/status_macros.h"
#include "daemon/datapath/work_pool.h"
#include "daemon/decision/advisor.h"
#include "daemon/gpu_setup.h"
#include "daemon/io/backend_choice.h"
#include "daemon/io/gds_backend.h"
#include "daemon/metrics/exporter.h"
#include "daemon/open_pool.h"
#include "daemon/pool/layout.h"
#include "common/handoff.h"
#include "common/lookup_wire.h"
#include "daemon/server/admin_service.h"
#include "daemon/server/credentials.h"
#include "daemon/server/handoff_server.h"
#include "daemon/server/lookup_server.h"
#include "daemon/server/engine_watcher.h"
#include "daemon/server/kvcache_service.h"
#include "daemon/server/server.h"
#include "daemon/server/sessions.h"
#include "daemon/service/health.h"
#include "daemon/service/heartbeat.h"
#include "daemon/service/notifier.h"
#include "daemon/service/reload.h"
#include "daemon/store/block_store.h"
#include "daemon/store/store_stats.h"
#include "daemon/version.h"

ABSL_FLAG(std::string, config, "",
          "text-proto config file (tutti.v1.Config) merged over the embedded default; empty: the "
          "embedded default only");
ABSL_FLAG(std::string, state_dir, "", "overrides state_dir of the config");
ABSL_FLAG(std::string, socket, "", "overrides listen.socket_path of the config");
ABSL_FLAG(int32_t, gpu_device, -1,
          "overrides gpu.device of the config (tuttid@N.service passes N); -1: the config's");
ABSL_FLAG(bool, print_default_config, false, "print the embedded default config and exit");

namespace tutti {
namespace {

static_assert(config::kMaxObjectsPerSlot == pool::kMaxObjectsPerSlot,
              "config validation and the pool layout disagree on objects per slot");
static_assert(config::kMaxExtentSlots == pool::kMaxExtentSlots,
              "config validation and the pool layout disagree on extent slots");

// How long SIGTERM lets in-flight calls finish before cancelling them.
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);

absl::StatusOr<v1::Config> LoadEffectiveConfig() {
  const std::string path = absl::GetFlag(FLAGS_config);
  absl::StatusOr<v1::Config> loaded =
      path.empty() ? config::LoadConfig("") : config::LoadConfigFile(path);
  ASSIGN_OR_RETURN(v1::Config config, std::move(loaded));
  if (!absl::GetFlag(FLAGS_state_dir).empty()) config.set_state_dir(absl::GetFlag(FLAGS_state_dir));
  if (!absl::GetFlag(FLAGS_socket).empty()) {
    config.mutable_listen()->set_socket_path(absl::GetFlag(FLAGS_socket));
  }
  if (absl::GetFlag(FLAGS_gpu_device) >= 0) {
    config.mutable_gpu()->set_device(static_cast<uint32_t>(absl::GetFlag(FLAGS_gpu_device)));
  }
  RETURN_IF_ERROR(config::ValidateConfig(config));
  if (config.pool().dirs().empty()) config.mutable_pool()->add_dirs(config.state_dir() + "/pool");
  return config;
}

store::StoreOptions MakeStoreOptions(const v1::Config& config, const pool::PoolLayout& layout) {
  store::StoreOptions o;
  o.state_dir = config.state_dir();
  o.layout = layout;
  o.dram_bytes = config.dram().capacity_bytes();
  o.store_staging_bytes = config.limits().store_staging_bytes();
  o.retrieve_staging_bytes = config.limits().retrieve_staging_bytes();
  o.max_read_bytes = static_cast<uint32_t>(config.datapath().max_read_bytes());
  o.read_post_bytes = static_cast<uint32_t>(config.datapath().read_post_bytes());
  o.checksum_threads = config.datapath().checksum_threads() != 0
                           ? config.datapath().checksum_threads()
                           : datapath::WorkPool::DefaultThreads();
  o.checkpoint_every = config.journal().checkpoint_every();
  o.max_namespaces = config.limits().max_namespaces();
  o.max_namespaces_per_user = config.limits().max_namespaces_per_user();
  o.pool_share_per_user = config.limits().pool_share_per_user();
  o.max_staging_bytes_per_owner = config.limits().max_store_staging_bytes_per_session();
  o.pending_ttl_ms = config.limits().partial_store_ttl_ms();
  o.admission = config.pool().admission().empty() ? "all" : config.pool().admission();
  o.tail_first = config.pool().recency() != "chain";
  o.admission_ghost_blocks = config.pool().admission_ghost_blocks();
  o.max_pending_events = config.limits().max_pending_events();
  o.max_pending_events_total = config.limits().max_pending_events_total();
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
  o.max_write_bytes_in_flight = config.datapath().max_write_bytes_in_flight();
  o.write_batches_in_flight = config.datapath().write_batches_in_flight();
  o.write_latency_target_us = int64_t{config.datapath().write_latency_target_ms()} * 1000;
  o.max_read_bytes_in_flight = config::MaxReadBytesInFlight(config);
  return o;
}

// Blocks until SIGTERM, SIGINT or SIGHUP arrives (all blocked in every thread; see main).
int WaitForSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

// The running daemon's parts. Destroyed in reverse order: serving stops before the sessions,
// the sessions (and their pins and mappings) go before the GPU runtime and the store.
struct Daemon {
  std::string io_backend;
  io::BackendChoice io_choice;            // what io.backend asked for, and why another runs
  std::vector<std::string> pool_places;  // pool.dirs, or the raw namespaces of uring_cmd
  std::string device_mode = "host";
  std::vector<std::string> notes;  // fallbacks and modes taken at start, for logs and status
  server::CallGate gate;
  stats::Registry stats;  // every figure, registered by its component: /metrics and Admin.Stats
  server::DeviceHealthBoard device_health;  // what tuttictl devices --report sends
  std::unique_ptr<server::CredentialTable> credentials;
  std::unique_ptr<store::BlockStore> store;
  std::unique_ptr<gpu_setup::GpuRuntime> gpu;  // cuda mode only
  std::unique_ptr<server::SessionManager> sessions;
  std::unique_ptr<server::EngineWatcher> watcher;
  std::unique_ptr<decision::Advisor> advisor;
  std::unique_ptr<server::KvCacheService> kv;
  std::unique_ptr<server::AdminService> admin;
  std::unique_ptr<server::Server> server;        // engines: the KvCache service
  std::unique_ptr<server::HandoffServer> handoff;  // engines' credentials and memory
  std::unique_ptr<server::LookupServer> lookup;    // Lookups outside gRPC; null: turned off
  std::unique_ptr<server::Server> admin_server;  // operators: the Admin service
  std::unique_ptr<server::Reaper> reaper;
  std::unique_ptr<metrics::MetricsExporter> metrics;  // null: metrics.listen is off
};

// Lays out and opens the pool, the I/O backend and the block store (recovering its index).
absl::Status OpenStore(const v1::Config& config, bool gpu_staging, Daemon* d) {
  RETURN_IF_ERROR(MakeDirs(config.state_dir(), 0750));
  io::GdsOptions gds;
  gds.gpu_staging = gpu_staging;
  const char* cufile = getenv("TUTTI_CUFILE_LIBRARY");  // tests: the fake libcufile
  if (cufile != nullptr) gds.library = cufile;
  ASSIGN_OR_RETURN(OpenedPool opened, OpenPool(config, gds));
  d->io_choice = opened.choice;
  d->pool_places = opened.places;
  const pool::PoolLayout layout = opened.layout;
  std::unique_ptr<io::IoBackend> backend = std::move(opened.backend);
  d->io_backend = std::string(backend->name());
  if (!d->io_choice.fell_back()) {
    log::Get("main")->info("io backend \"{}\" (io.backend)", d->io_backend);
  } else {
    log::Get("main")->warn("io backend \"{}\" cannot run here; using \"{}\": {}",
                           d->io_choice.requested, d->io_choice.backend, d->io_choice.reason);
    d->notes.push_back(absl::StrCat("io backend \"", d->io_choice.backend, "\" instead of \"",
                                    d->io_choice.requested, "\" (", d->io_choice.reason, ")"));
  }
  if (d->io_backend == "memory") {
    d->notes.push_back("io backend \"memory\": the pool lives in RAM and nothing persists");
  }
  store::StoreOptions options = MakeStoreOptions(config, layout);
  options.pool_id = opened.pool_id;
  const io::IoBackend* const backend_stats = backend.get();  // the store owns it from here
  ASSIGN_OR_RETURN(d->store, store::BlockStore::Open(options, std::move(backend), Clock::Real()));
  backend_stats->RegisterStats(&d->stats);  // its own counters, as long as the store lives
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
  session_options.max_pinned_blocks_per_user = limits.max_pinned_blocks_per_user();
  session_options.max_pinned_pool_share_per_user = limits.max_pinned_pool_share_per_user();
  session_options.max_pinned_pool_share = limits.max_pinned_pool_share();
  session_options.pool_slots = d->store->Stats().slots_total;
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
      d->gpu ? d->gpu->MemoryOpener() : server::HostMemoryOpener();
  d->advisor = std::make_unique<decision::Advisor>(config.datapath().decision() != "off",
                                                   config.datapath().decision_min_gain());
  d->kv = std::make_unique<server::KvCacheService>(
      server::KvCacheOptions{limits.max_blocks_per_call(), limits.max_calls_per_session(),
                             config.security().namespace_sharing()},
      d->store.get(), d->sessions.get(), d->credentials.get(), std::move(opener), &d->gate,
      d->watcher.get(), d->advisor.get());
  server::DaemonInfo info{kVersion,
                          d->io_backend,
                          d->device_mode,
                          d->pool_places,
                          absl::StrJoin(d->notes, "; ")};
  store::RegisterStoreStats(d->store.get(), &d->stats);
  metrics::RegisterStartupInfo(d->pool_places, d->io_choice, &d->stats);
  server::RegisterSessionStats([s = d->sessions.get()] { return s->num_sessions(); }, &d->stats);
  server::RegisterHandoffStats([c = d->credentials.get()] { return c->outstanding(); },
                               &d->stats);
  decision::RegisterAdvisorStats([a = d->advisor.get()] { return a->Stats(); }, &d->stats);
  std::function<server::GpuLayerCounts()> gpu_layers;  // empty in host mode: zeros
  if (d->gpu) gpu_layers = [gpu = d->gpu.get()] { return gpu->LayerCounts(); };
  server::RegisterGpuLayerStats(std::move(gpu_layers), &d->stats);
  server::RegisterDeviceHealthStats([h = &d->device_health] { return h->Snapshot(); },
                                    &d->stats);
  info.stats = &d->stats;
  info.config_text = config::RenderConfig(config);
  info.io_choice = d->io_choice;
  info.device_health = &d->device_health;
  if (d->gpu) info.gpu_memory_bytes = d->gpu->memory_bytes();
  const auto& mc = config.metrics();
  ASSIGN_OR_RETURN(d->metrics, metrics::MetricsExporter::Start(
                                   {mc.listen(), mc.namespace_labels(), mc.basic_auth_file()},
                                   &d->stats));
  if (d->metrics) log::Get("main")->info("metrics on {}", d->metrics->url());
  d->admin = std::make_unique<server::AdminService>(std::move(info), d->store.get(),
                                                    d->sessions.get(), Clock::Real(), &d->gate);
  const auto& listen = config.listen();
  const server::SocketAccess engines{listen.socket_mode(), listen.socket_group()};
  ASSIGN_OR_RETURN(d->handoff,
                   server::HandoffServer::Start(HandoffPath(listen.socket_path()), engines,
                                                d->credentials.get(),
                                                {limits.max_handoff_connections_per_user(),
                                                 limits.max_handoff_connections()}));
  if (listen.lookup_socket()) {
    server::LookupLimits lookup_limits;
    lookup_limits.max_connections_per_user = limits.max_lookup_connections_per_user();
    lookup_limits.max_connections = limits.max_lookup_connections();
    lookup_limits.max_request_bytes = MaxLookupRequest(limits.max_blocks_per_call());
    ASSIGN_OR_RETURN(
        d->lookup,
        server::LookupServer::Start(
            LookupSocketPath(listen.socket_path()), engines,
            [kv = d->kv.get()](uint32_t uid, const v1::LookupRequest& req,
                               v1::LookupResponse* resp) { return kv->LookupAs(uid, req, resp); },
            lookup_limits));
  }
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
  d->metrics.reset();  // scrapes read the store and the sessions
  d->server->Shutdown(kShutdownGrace);  // returns once every handler has returned
  d->lookup.reset();  // the gate is closed: its Lookups finished or answer UNAVAILABLE
  d->admin_server->Shutdown(absl::ZeroDuration());  // the gate answers its calls UNAVAILABLE now
  d->handoff.reset();
  d->reaper.reset();
  d->watcher.reset();
  d->sessions.reset();  // drops every lease's pins and every engine mapping
  d->gpu.reset();       // before the store: its staging is unregistered first
  d->store->Flush();
  d->store.reset();  // checkpoints and stops the writer
}

// The systemd unit to restart for a start-up-only setting, for reload's log lines.
std::string UnitName() {
  const char* unit = getenv("TUTTID_UNIT");  // set by tuttid@.service
  return unit != nullptr && unit[0] != '\0' ? unit : "tuttid";
}

// The heartbeat of a serving daemon: alive while the operator API answers within a quarter of the
// watchdog interval (at most 5 s) and the writer's oldest queued block waited less than the
// watchdog interval (at least 30 s: past the backlog's age bound Capture refuses new blocks).
std::unique_ptr<service::Heartbeat> StartHeartbeat(const v1::Config& config, service::Notifier* n,
                                                   Daemon* d) {
  const absl::Duration watchdog = n->WatchdogInterval();
  const absl::Duration deadline =
      watchdog > absl::ZeroDuration() ? std::min(absl::Seconds(5), watchdog / 4) : absl::Seconds(5);
  auto beat = std::make_unique<service::Heartbeat>(
      n,
      service::MakeLivenessCheck("unix:" + config::AdminSocketPath(config.listen()),
                                 d->store.get(), deadline, std::max(absl::Seconds(30), watchdog)),
      service::MakeSummary(d->store.get(), d->sessions.get()));
  beat->Start();
  return beat;
}

absl::Status Run() {
  const std::unique_ptr<service::Notifier> notifier = service::SystemdNotifier();
  notifier->Status("reading the configuration");
  ASSIGN_OR_RETURN(v1::Config config, LoadEffectiveConfig());
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
  ASSIGN_OR_RETURN(const std::optional<gpu_setup::ChosenGpu> gpu,
                   gpu_setup::ChooseDevice(config, &daemon.notes));
  notifier->Status("opening the pool and recovering the index");
  RETURN_IF_ERROR(OpenStore(config, gpu.has_value(), &daemon));
  if (gpu.has_value()) {
    notifier->Status(absl::StrCat("starting the GPU data path on GPU ", config.gpu().device()));
    ASSIGN_OR_RETURN(daemon.gpu,
                     gpu_setup::StartGpu(config, *gpu, daemon.store.get(), &daemon.notes));
    daemon.device_mode = "cuda";
  } else {
    if (config.datapath().verifier() == "gpu") {
      daemon.notes.push_back(
          "datapath.verifier \"gpu\" needs cuda mode: retrieves are checked "
          "on the CPU");
    }
    if (config.datapath().store_checksums() == "gpu") {
      daemon.notes.push_back(
          "datapath.store_checksums \"gpu\" needs cuda mode: stores are "
          "checksummed on the CPU");
    }
  }
  notifier->Status("starting the sessions and the sockets");
  RETURN_IF_ERROR(StartServing(config, &daemon));
  log->info("ready: engines on unix:{} (and {}), operators on unix:{} ({}; io backend {})",
            config.listen().socket_path(), daemon.handoff->path(),
            config::AdminSocketPath(config.listen()), absl::StrJoin(daemon.notes, "; "),
            daemon.io_backend);
  notifier->Ready();
  std::unique_ptr<service::Heartbeat> heartbeat = StartHeartbeat(config, notifier.get(), &daemon);
  int sig = 0;
  while ((sig = WaitForSignal()) == SIGHUP) {
    notifier->Reloading();
    log->info("SIGHUP: reloading {}", absl::GetFlag(FLAGS_config).empty()
                                           ? "the embedded default config"
                                           : absl::GetFlag(FLAGS_config));
    config = service::Reload(config, LoadEffectiveConfig(), UnitName(), daemon.store.get());
    notifier->Ready();
  }
  log->info("{}: stopping; in-flight calls get {}", strsignal(sig),
            absl::FormatDuration(kShutdownGrace));
  heartbeat->Stop();
  notifier->Stopping();
  notifier->Status("stopping: finishing calls, writing captured blocks, checkpointing");
  Stop(&daemon);
  log->info("stopped cleanly");
  return absl::OkStatus();
}

}  // namespace
}  // namespace tutti

int main(int argc, char** argv) {
  // Block the stop and reload signals before any thread starts, so every thread inherits the mask
  // and only WaitForSignal receives them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::SetProgramUsageMessage(
      "tuttid [--config=FILE] [--state_dir=DIR] [--socket=PATH]: the tutti KV cache daemon");
  absl::FlagsUsageConfig usage_config;  // --version prints "tuttid VERSION" (//:version.bzl)
  usage_config.version_string = [] { return absl::StrCat("tuttid ", tutti::kVersion, "\n"); };
  absl::SetFlagsUsageConfig(usage_config);
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

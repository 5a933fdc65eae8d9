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
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"
#include "daemon/io/io_factory.h"
#include "daemon/pool/layout.h"
#include "daemon/pool/pool_files.h"
#include "daemon/server/admin_service.h"
#include "daemon/server/kvcache_service.h"
#include "daemon/server/server.h"
#include "daemon/server/sessions.h"
#include "daemon/store/block_store.h"

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

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot read config ", path, ": ", strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<v1::Config> LoadEffectiveConfig() {
  std::string text;
  const std::string path = absl::GetFlag(FLAGS_config);
  if (!path.empty()) {
    ASSIGN_OR_RETURN(text, ReadFile(path));
  }
  absl::StatusOr<v1::Config> loaded = config::LoadConfig(text);
  if (!loaded.ok() && !path.empty()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat(path, ": ", loaded.status().message()));
  }
  ASSIGN_OR_RETURN(v1::Config config, std::move(loaded));
  if (!absl::GetFlag(FLAGS_state_dir).empty()) config.set_state_dir(absl::GetFlag(FLAGS_state_dir));
  if (!absl::GetFlag(FLAGS_socket).empty()) {
    config.mutable_listen()->set_socket_path(absl::GetFlag(FLAGS_socket));
  }
  RETURN_IF_ERROR(config::ValidateConfig(config));
  if (config.pool().dirs().empty()) config.mutable_pool()->add_dirs(config.state_dir() + "/pool");
  return config;
}

// mkdir -p, mode 0750 for what it creates.
absl::Status MakeDirs(const std::string& dir) {
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  }
  const size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) RETURN_IF_ERROR(MakeDirs(dir.substr(0, slash)));
  if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", dir, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

// Opens (creating on first start) the pool files and the I/O backend over them. The "memory"
// backend keeps the pool in RAM and touches no file.
absl::StatusOr<std::unique_ptr<io::IoBackend>> OpenBackend(const v1::Config& config,
                                                           const pool::PoolLayout& layout) {
  const std::vector<std::string> dirs(config.pool().dirs().begin(), config.pool().dirs().end());
  std::vector<uint64_t> sizes(layout.num_files(), layout.file_bytes());
  std::vector<int> fds;
  if (config.io().backend() != "memory") {
    for (const std::string& d : dirs) RETURN_IF_ERROR(MakeDirs(d));
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
  o.checkpoint_every = config.journal().checkpoint_every();
  return o;
}

std::string Notes(const v1::Config& config) {
  std::vector<std::string> notes;
  notes.push_back("host mode: engines attach host shared memory (no CUDA in this build)");
  if (config.io().backend() == "memory") {
    notes.push_back("io backend \"memory\": the pool lives in RAM and nothing persists");
  }
  return absl::StrJoin(notes, "; ");
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

// The running daemon's parts. Destroyed in reverse order: serving stops before the sessions,
// the sessions (and their pins) go before the store.
struct Daemon {
  std::string io_backend;
  server::CallGate gate;
  std::unique_ptr<store::BlockStore> store;
  std::unique_ptr<server::SessionManager> sessions;
  std::unique_ptr<server::KvCacheService> kv;
  std::unique_ptr<server::AdminService> admin;
  std::unique_ptr<server::Server> server;
  std::unique_ptr<server::Reaper> reaper;
};

// Lays out and opens the pool, the I/O backend and the block store (recovering its index).
absl::Status OpenStore(const v1::Config& config, Daemon* d) {
  RETURN_IF_ERROR(MakeDirs(config.state_dir()));
  ASSIGN_OR_RETURN(
      const pool::PoolLayout layout,
      pool::PoolLayout::Compute(config.pool().capacity_bytes(), config.pool().dirs_size(),
                                config.pool().object_bytes(), config.pool().max_objects()));
  log::Get("main")->info("pool: {} files of {} bytes, {} slots of {} objects x {} bytes",
                         layout.num_files(), layout.file_bytes(), layout.num_slots(),
                         layout.max_objects(), layout.object_bytes());
  ASSIGN_OR_RETURN(std::unique_ptr<io::IoBackend> backend, OpenBackend(config, layout));
  d->io_backend = std::string(backend->name());
  ASSIGN_OR_RETURN(d->store, store::BlockStore::Open(MakeStoreOptions(config, layout),
                                                     std::move(backend), Clock::Real()));
  return absl::OkStatus();
}

// Sessions, both services, the socket, and the reaper.
absl::Status StartServing(const v1::Config& config, Daemon* d) {
  const auto& limits = config.limits();
  d->sessions = std::make_unique<server::SessionManager>(
      server::SessionManager::Options{limits.session_ttl_ms(), limits.lease_ttl_ms(),
                                      limits.max_sessions()},
      Clock::Real(),
      [s = d->store.get()](NamespaceId ns, absl::Span<const Key> keys) { s->Unpin(ns, keys); });
  d->kv = std::make_unique<server::KvCacheService>(
      server::KvCacheOptions{limits.max_blocks_per_call()}, d->store.get(), d->sessions.get(),
      server::HostMemoryOpener(), &d->gate);
  server::DaemonInfo info{kVersion,
                          d->io_backend,
                          "host",
                          {config.pool().dirs().begin(), config.pool().dirs().end()},
                          Notes(config)};
  d->admin = std::make_unique<server::AdminService>(std::move(info), d->store.get(),
                                                    d->sessions.get(), Clock::Real(), &d->gate);
  const auto& listen = config.listen();
  ASSIGN_OR_RETURN(d->server, server::Server::Start({listen.socket_path(), listen.socket_mode(),
                                                     listen.socket_group()},
                                                    {d->kv.get(), d->admin.get()}, &d->gate));
  const uint32_t reap_ms =
      std::clamp<uint32_t>(std::min(limits.session_ttl_ms(), limits.lease_ttl_ms()) / 4, 10, 1000);
  d->reaper = std::make_unique<server::Reaper>(d->sessions.get(), reap_ms);
  return absl::OkStatus();
}

// Stops accepting, lets in-flight calls finish (then cancels them), drops every session, and
// makes every captured block durable before the store checkpoints and closes.
void Stop(Daemon* d) {
  d->server->Shutdown(kShutdownGrace);  // returns once every handler has returned
  d->reaper.reset();
  d->sessions.reset();  // drops every lease's pins and every engine mapping
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
  if (server::ProbeSocket(config.listen().socket_path()) == server::SocketState::kAnswering) {
    return absl::FailedPreconditionError(
        absl::StrCat("another server (tuttid?) is answering on ", config.listen().socket_path()));
  }
  Daemon daemon;
  RETURN_IF_ERROR(OpenStore(config, &daemon));
  RETURN_IF_ERROR(StartServing(config, &daemon));
  log->info("ready: serving on unix:{} ({}; io backend {})", config.listen().socket_path(),
            Notes(config), daemon.io_backend);
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

#include "tests/integration/tuttid_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/connect.h"
#include "grpcpp/client_context.h"

namespace tutti::testing {
namespace {

namespace fs = std::filesystem;

std::string ConfigText(const TuttidEnv& env) {
  const TuttidConfig& c = env.config();
  return absl::StrFormat(
      "state_dir: \"%s\"\n"
      "listen { socket_path: \"%s\" socket_mode: 384 }\n"
      "pool { dirs: \"%s\" capacity_bytes: %d object_bytes: %d max_objects: %d }\n"
      "io { backend: \"%s\" fallback: \"%s\" queue_depth: %d %s }\n"
      "dram { capacity_bytes: %d }\n"
      "limits { max_blocks_per_call: %d session_ttl_ms: %d lease_ttl_ms: %d\n"
      "         store_staging_bytes: %d retrieve_staging_bytes: %d %s }\n"
      "journal { checkpoint_every: %d }\n"
      "log_level: \"%s\"\n"
      "metrics { listen: \"%s\" %s }\n",
      env.state_dir(), env.socket(), env.pool_dir(), c.capacity_bytes, c.object_bytes,
      c.max_objects, c.backend, c.io_fallback, c.queue_depth, c.extra_io, c.dram_bytes, c.max_blocks_per_call,
      c.session_ttl_ms, c.lease_ttl_ms, c.store_staging_bytes, c.retrieve_staging_bytes,
      c.extra_limits, c.checkpoint_every, c.log_level, c.metrics_listen, c.extra_metrics);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TuttidEnv>> TuttidEnv::Create(const TuttidConfig& config) {
  std::unique_ptr<TuttidEnv> env(new TuttidEnv());
  env->config_ = config;
  auto root = MakePoolRoot("tuttid");
  if (!root.ok()) return root.status();
  env->root_ = *root;
  auto sock = MakeTempDir("/tmp/tutti-sock-XXXXXX");
  if (!sock.ok()) return sock.status();
  env->socket_dir_ = *sock;
  env->socket_ = *sock + "/tuttid.sock";
  env->state_dir_ = env->root_ + "/state";
  env->pool_dir_ = env->root_ + "/pool";
  env->config_path_ = env->root_ + "/tuttid.textproto";
  std::error_code ec;
  fs::create_directories(env->state_dir_, ec);
  fs::create_directories(env->pool_dir_, ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir under ", env->root_, ": ", ec.message()));
  std::ofstream(env->config_path_) << ConfigText(*env);
  return env;
}

TuttidEnv::~TuttidEnv() {
  std::error_code ec;
  if (getenv("TUTTI_KEEP_TEST_DIRS") == nullptr) fs::remove_all(root_, ec);
  fs::remove_all(socket_dir_, ec);
}

TuttidEnv::DiskUse TuttidEnv::PoolDiskUse() const {
  DiskUse use;
  std::error_code ec;
  for (const auto& entry : fs::recursive_directory_iterator(pool_dir_, ec)) {
    struct stat st;
    if (!entry.is_regular_file() || stat(entry.path().c_str(), &st) != 0) continue;
    ++use.files;
    use.apparent_bytes += st.st_size;
    use.allocated_bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return use;
}

absl::StatusOr<std::unique_ptr<TuttidProcess>> TuttidProcess::Start(const TuttidEnv& env,
                                                                    int ready_timeout_s) {
  auto p = Spawn(env);
  if (!p.ok()) return p.status();
  if (absl::Status ready = (*p)->WaitReady(ready_timeout_s); !ready.ok()) {
    (*p)->Kill();
    return absl::UnavailableError(
        absl::StrCat(ready.message(), "\n--- tuttid log tail ---\n", (*p)->LogTail()));
  }
  return p;
}

absl::StatusOr<std::unique_ptr<TuttidProcess>> TuttidProcess::Spawn(const TuttidEnv& env) {
  static std::atomic<int> runs{0};
  std::unique_ptr<TuttidProcess> p(new TuttidProcess());
  p->env_ = &env;
  p->log_path_ = absl::StrCat(env.root(), "/tuttid.", runs.fetch_add(1), ".log");
  auto pid = SpawnLogged({TuttidBinary(), "--config=" + env.config_path(),
                          "--state_dir=" + env.state_dir(), "--socket=" + env.socket()},
                         p->log_path_);
  if (!pid.ok()) return pid.status();
  p->pid_ = *pid;
  p->running_.store(true);
  return p;
}

absl::Status TuttidProcess::WaitReady(int timeout_s) {
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      running_.store(false);
      return absl::UnavailableError(
          absl::StrCat("tuttid exited during start-up (wait status ", status, ")"));
    }
    // The admin socket opens after the handoff socket and before the engine socket.
    auto admin_channel = ConnectToTuttid(env_->admin_socket(), absl::Seconds(1));
    if (admin_channel.ok()) {
      auto admin = tutti::v1::Admin::NewStub(*admin_channel);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      tutti::v1::StatusResponse resp;
      auto channel = ConnectToTuttid(env_->socket(), absl::Seconds(1));
      if (channel.ok() && admin->Status(&ctx, tutti::v1::StatusRequest(), &resp).ok()) {
        channel_ = *channel;
        admin_channel_ = *admin_channel;
        admin_ = std::move(admin);
        return absl::OkStatus();
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat("tuttid did not answer within ", timeout_s, " s"));
}

TuttidProcess::~TuttidProcess() {
  if (running()) Kill();
}

absl::StatusOr<int> TuttidProcess::Stop(int timeout_s) {
  if (!running()) return absl::FailedPreconditionError("tuttid is not running");
  // Close our connection first: an idle gRPC client does not read the server's GOAWAY, and the
  // daemon's shutdown would wait out its whole grace period for the connection to go.
  admin_.reset();
  admin_channel_.reset();
  channel_.reset();
  kill(pid_, SIGTERM);
  const int status = WaitForExit(pid_, absl::Seconds(timeout_s));
  if (status == -1) {
    Kill();
    return absl::DeadlineExceededError(
        absl::StrCat("tuttid did not exit within ", timeout_s, " s of SIGTERM; killed"));
  }
  running_.store(false);
  if (WIFSIGNALED(status)) {
    return absl::InternalError(absl::StrCat("tuttid died of signal ", WTERMSIG(status)));
  }
  return WEXITSTATUS(status);
}

void TuttidProcess::Kill() {
  if (running_.exchange(false)) KillAndReap(pid_);
}

std::string TuttidProcess::LogTail(size_t bytes) const { return FileTail(log_path_, bytes); }

CommandResult RunCommand(const std::vector<std::string>& argv) {
  CommandResult result;
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) return result;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    dprintf(2, "execv %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        sinks[i]->append(buf, n);
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  return result;
}

}  // namespace tutti::testing

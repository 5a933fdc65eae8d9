#include "tests/gpu/tuttid_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace tutti::gputest {
namespace {

namespace fs = std::filesystem;

bool TakesODirect(const std::string& dir) {
  const std::string probe = dir + "/.odirect-probe";
  const int fd = open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0600);
  if (fd < 0) return false;
  void* buf = nullptr;
  bool ok = posix_memalign(&buf, 4096, 4096) == 0;
  if (ok) {
    std::memset(buf, 0, 4096);
    ok = pwrite(fd, buf, 4096, 0) == 4096;
  }
  free(buf);
  close(fd);
  unlink(probe.c_str());
  return ok;
}

std::string BaseDir() {
  if (const char* d = getenv("TUTTI_GPU_TEST_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* t = getenv("TEST_TMPDIR"); t != nullptr && TakesODirect(t)) return t;
  return "/var/tmp";
}

std::string Binary() {
  if (const char* bin = getenv("TUTTID_BIN"); bin != nullptr && *bin != '\0') return bin;
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const char* root = getenv(var); root != nullptr) {
      const std::string path = absl::StrCat(root, "/tutti/daemon/tuttid");
      if (access(path.c_str(), X_OK) == 0) return path;
    }
  }
  if (access(".bundle/bin/daemon/tuttid", X_OK) == 0) return ".bundle/bin/daemon/tuttid";
  return "daemon/tuttid";
}

absl::StatusOr<std::string> TempDir(const std::string& pattern) {
  std::string path = pattern;
  if (mkdtemp(path.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", strerror(errno)));
  }
  return path;
}

}  // namespace

std::shared_ptr<grpc::Channel> UnixChannel(const std::string& socket) {
  return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
}

absl::StatusOr<std::unique_ptr<TuttidRunner>> TuttidRunner::Start(const std::string& config_body,
                                                                  int ready_s) {
  std::unique_ptr<TuttidRunner> r(new TuttidRunner());
  auto root = TempDir(BaseDir() + "/tuttid-gpu-XXXXXX");
  if (!root.ok()) return root.status();
  r->root_ = *root;
  auto sock = TempDir("/tmp/tutti-gpu-sock-XXXXXX");
  if (!sock.ok()) return sock.status();
  r->socket_dir_ = *sock;
  r->socket_ = *sock + "/tuttid.sock";
  r->config_path_ = r->root_ + "/tuttid.textproto";
  r->log_path_ = r->root_ + "/tuttid.log";
  fs::create_directories(r->root_ + "/state");
  fs::create_directories(r->root_ + "/pool");
  std::ofstream(r->config_path_) << "state_dir: \"" << r->root_ << "/state\"\n"
                                 << "listen { socket_path: \"" << r->socket_
                                 << "\" socket_mode: 384 }\n"
                                 << "pool { dirs: \"" << r->root_ << "/pool\" }\n"
                                 << config_body << "\n";
  absl::Status s = r->Launch(ready_s);
  if (!s.ok()) return s;
  return r;
}

absl::Status TuttidRunner::Launch(int ready_s) {
  const std::string bin = Binary();
  pid_ = fork();
  if (pid_ < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    const std::string flag = "--config=" + config_path_;
    execl(bin.c_str(), bin.c_str(), flag.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  channel_ = UnixChannel(socket_);
  admin_ = tutti::v1::Admin::NewStub(channel_);
  const absl::Time deadline = absl::Now() + absl::Seconds(ready_s);
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(
          absl::StrCat(bin, " exited at start (status ", status, "):\n", LogTail()));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    tutti::v1::StatusResponse resp;
    if (admin_->Status(&ctx, tutti::v1::StatusRequest(), &resp).ok()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  Kill();
  return absl::UnavailableError(
      absl::StrCat("tuttid did not answer in ", ready_s, " s:\n", LogTail()));
}

absl::Status TuttidRunner::Restart(int ready_s) {
  if (pid_ > 0) Kill();
  return Launch(ready_s);
}

absl::StatusOr<int> TuttidRunner::Stop(int timeout_s) {
  if (pid_ <= 0) return absl::FailedPreconditionError("tuttid is not running");
  admin_.reset();
  channel_.reset();
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return absl::InternalError(absl::StrCat("tuttid died of signal ", WTERMSIG(status)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  Kill();
  return absl::InternalError("tuttid did not stop in time");
}

void TuttidRunner::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

TuttidRunner::~TuttidRunner() {
  Kill();
  std::error_code ec;
  if (getenv("TUTTI_GPU_KEEP") == nullptr) fs::remove_all(root_, ec);
  fs::remove_all(socket_dir_, ec);
}

std::string TuttidRunner::LogTail(size_t bytes) const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

}  // namespace tutti::gputest

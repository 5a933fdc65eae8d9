#include "tests/gpu/tuttid_runner.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "tests/common/daemon_launch.h"

namespace tutti::gputest {
namespace {

// `body` with the pool in `dir`: added to its pool section (a field may be given once), or as one.
std::string WithPoolDir(const std::string& body, const std::string& dir) {
  const std::string dirs = "pool { dirs: \"" + dir + "\" ";
  const size_t at = body.find("pool {");
  if (at == std::string::npos) return body + "\n" + dirs + "}";
  return body.substr(0, at) + dirs + body.substr(at + 6);
}

namespace fs = std::filesystem;

// $TUTTI_GPU_TEST_DIR (on the GPU machine) or a directory that takes O_DIRECT.
absl::StatusOr<std::string> RunnerRoot() {
  if (const char* d = getenv("TUTTI_GPU_TEST_DIR"); d != nullptr && *d != '\0') {
    return tutti::testing::MakeTempDir(std::string(d) + "/tuttid-gpu-XXXXXX");
  }
  return tutti::testing::MakePoolRoot("tuttid-gpu");
}

// The daemon from $TUTTID_BIN or the runfiles, else from the bundle tools/gpu_bundle.sh made.
std::string Binary() {
  const std::string bin = tutti::testing::TuttidBinary();
  if (access(bin.c_str(), X_OK) != 0 && access(".bundle/bin/daemon/tuttid", X_OK) == 0) {
    return ".bundle/bin/daemon/tuttid";
  }
  return bin;
}

}  // namespace

std::shared_ptr<grpc::Channel> UnixChannel(const std::string& socket) {
  return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
}

absl::StatusOr<std::unique_ptr<TuttidRunner>> TuttidRunner::Start(const std::string& config_body,
                                                                  int ready_s) {
  std::unique_ptr<TuttidRunner> r(new TuttidRunner());
  auto root = RunnerRoot();
  if (!root.ok()) return root.status();
  r->root_ = *root;
  auto sock = tutti::testing::MakeTempDir("/tmp/tutti-gpu-sock-XXXXXX");
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
                                 << "metrics { listen: \"off\" }\n"
                                 << WithPoolDir(config_body, r->root_ + "/pool") << "\n";
  absl::Status s = r->Launch(ready_s);
  if (!s.ok()) return s;
  return r;
}

absl::Status TuttidRunner::Launch(int ready_s) {
  const std::string bin = Binary();
  auto pid = tutti::testing::SpawnLogged({bin, "--config=" + config_path_}, log_path_);
  if (!pid.ok()) return pid.status();
  pid_ = *pid;
  channel_ = UnixChannel(socket_ + ".admin");  // the operator socket: Admin.Status
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
  tutti::testing::KillAndReap(pid_);
  pid_ = -1;
}

TuttidRunner::~TuttidRunner() {
  Kill();
  std::error_code ec;
  if (getenv("TUTTI_GPU_KEEP") == nullptr) fs::remove_all(root_, ec);
  fs::remove_all(socket_dir_, ec);
}

std::string TuttidRunner::LogTail(size_t bytes) const {
  return tutti::testing::FileTail(log_path_, bytes);
}

}  // namespace tutti::gputest

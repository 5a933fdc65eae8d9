#include "tests/e2e/tuttid_fixture.h"

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
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/hostengine/connect.h"

namespace tutti::e2e {
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

absl::StatusOr<std::string> MakeTempDir(std::string pattern) {
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", strerror(errno)));
  }
  return pattern;
}

std::string TuttidBinary() {
  if (const char* bin = getenv("TUTTID_BIN"); bin != nullptr && *bin != '\0') return bin;
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const char* root = getenv(var); root != nullptr) {
      const std::string path = absl::StrCat(root, "/tutti/daemon/tuttid");
      if (access(path.c_str(), X_OK) == 0) return path;
    }
  }
  return "bazel-bin/daemon/tuttid";
}

// Waits up to `timeout` for `pid`; its wait status, or -1 while it runs.
int WaitFor(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return 0;
    if (absl::Now() > deadline) return -1;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TuttidFixture>> TuttidFixture::Create(const FixtureConfig& c) {
  std::unique_ptr<TuttidFixture> f(new TuttidFixture());
  const char* tmp = getenv("TEST_TMPDIR");
  const std::string base = tmp != nullptr && TakesODirect(tmp) ? tmp : "/var/tmp";
  auto root = MakeTempDir(base + "/tuttid-e2e-XXXXXX");
  if (!root.ok()) return root.status();
  f->root_ = *root;
  auto sock = MakeTempDir("/tmp/tutti-e2e-sock-XXXXXX");
  if (!sock.ok()) return sock.status();
  f->socket_dir_ = *sock;
  f->socket_ = *sock + "/tuttid.sock";
  f->config_path_ = f->root_ + "/tuttid.textproto";
  f->log_path_ = f->root_ + "/tuttid.log";
  std::error_code ec;
  fs::create_directories(f->root_ + "/state", ec);
  fs::create_directories(f->root_ + "/pool", ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir under ", f->root_, ": ", ec.message()));
  std::ofstream(f->config_path_) << absl::StrFormat(
      "state_dir: \"%s/state\"\n"
      "listen { socket_path: \"%s\" socket_mode: 384 }\n"
      "pool { dirs: \"%s/pool\" capacity_bytes: %d object_bytes: %d max_objects: %d }\n"
      "io { backend: \"uring\" queue_depth: 32 }\n"
      "dram { capacity_bytes: %d }\n"
      "limits { max_blocks_per_call: 512 session_ttl_ms: %d lease_ttl_ms: 30000\n"
      "         store_staging_bytes: %d retrieve_staging_bytes: %d }\n%s\n",
      f->root_, f->socket_, f->root_, c.capacity_bytes, c.object_bytes, c.max_objects, c.dram_bytes,
      c.session_ttl_ms, c.store_staging_bytes, c.retrieve_staging_bytes, c.extra);
  return f;
}

TuttidFixture::~TuttidFixture() {
  Kill();
  std::error_code ec;
  fs::remove_all(root_, ec);
  fs::remove_all(socket_dir_, ec);
}

absl::Status TuttidFixture::Start() {
  if (running()) return absl::FailedPreconditionError("tuttid already runs");
  const std::string bin = TuttidBinary();
  std::vector<std::string> args = {bin, "--config=" + config_path_};
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (log >= 0) {
      dup2(log, 1);
      dup2(log, 2);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    dprintf(2, "execv %s: %s\n", bin.c_str(), strerror(errno));
    _exit(127);
  }
  pid_ = pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    if (WaitFor(pid_, absl::ZeroDuration()) != -1) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat("tuttid exited during start-up\n", LogTail()));
    }
    if (hostengine::ConnectToTuttid(socket_, absl::Seconds(1)).ok()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  Kill();
  return absl::UnavailableError(absl::StrCat("tuttid did not answer within 60 s\n", LogTail()));
}

absl::Status TuttidFixture::Stop() {
  if (!running()) return absl::FailedPreconditionError("tuttid is not running");
  kill(pid_, SIGTERM);
  const int status = WaitFor(pid_, absl::Seconds(60));
  if (status == -1) {
    Kill();
    return absl::InternalError("tuttid did not exit within 60 s of SIGTERM; killed");
  }
  pid_ = -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("tuttid exited with wait status ", status));
  }
  return absl::OkStatus();
}

void TuttidFixture::Kill() {
  if (!running()) return;
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

std::string TuttidFixture::LogTail(size_t bytes) const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  return all.size() <= bytes ? all : all.substr(all.size() - bytes);
}

}  // namespace tutti::e2e

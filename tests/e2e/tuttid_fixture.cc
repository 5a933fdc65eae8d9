#include "tests/e2e/tuttid_fixture.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/connect.h"
#include "tests/common/daemon_launch.h"

namespace tutti::e2e {
namespace {

namespace fs = std::filesystem;

// The daemon from the runfiles, or from bazel-bin when run by hand from the workspace root.
std::string FixtureBinary() {
  const std::string bin = tutti::testing::TuttidBinary();
  return access(bin.c_str(), X_OK) == 0 ? bin : "bazel-bin/daemon/tuttid";
}

}  // namespace

absl::StatusOr<std::unique_ptr<TuttidFixture>> TuttidFixture::Create(const FixtureConfig& c) {
  std::unique_ptr<TuttidFixture> f(new TuttidFixture());
  auto root = tutti::testing::MakePoolRoot("tuttid-e2e");
  if (!root.ok()) return root.status();
  f->root_ = *root;
  auto sock = tutti::testing::MakeTempDir("/tmp/tutti-e2e-sock-XXXXXX");
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
      "metrics { listen: \"off\" }\n"
      "pool { dirs: \"%s/pool\" capacity_bytes: %d object_bytes: %d max_objects: %d }\n"
      "io { backend: \"uring\" queue_depth: 32 }\n"
      "dram { capacity_bytes: %d }\n"
      "limits { max_blocks_per_call: 512 session_ttl_ms: %d lease_ttl_ms: 30000\n"
      "         store_staging_bytes: %d retrieve_staging_bytes: %d\n"
      // One engine per fixture: its session may use all of staging.
      "         max_store_staging_bytes_per_session: %d }\n%s\n",
      f->root_, f->socket_, f->root_, c.capacity_bytes, c.object_bytes, c.max_objects, c.dram_bytes,
      c.session_ttl_ms, c.store_staging_bytes, c.retrieve_staging_bytes, c.store_staging_bytes,
      c.extra);
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
  auto pid = tutti::testing::SpawnLogged({FixtureBinary(), "--config=" + config_path_}, log_path_);
  if (!pid.ok()) return pid.status();
  pid_ = *pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    if (tutti::testing::WaitForExit(pid_, absl::ZeroDuration()) != -1) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat("tuttid exited during start-up\n", LogTail()));
    }
    if (ConnectToTuttid(socket_, absl::Seconds(1)).ok()) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  Kill();
  return absl::UnavailableError(absl::StrCat("tuttid did not answer within 60 s\n", LogTail()));
}

absl::Status TuttidFixture::Stop() {
  if (!running()) return absl::FailedPreconditionError("tuttid is not running");
  kill(pid_, SIGTERM);
  const int status = tutti::testing::WaitForExit(pid_, absl::Seconds(60));
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
  tutti::testing::KillAndReap(pid_);
  pid_ = -1;
}

std::string TuttidFixture::LogTail(size_t bytes) const {
  return tutti::testing::FileTail(log_path_, bytes);
}

}  // namespace tutti::e2e

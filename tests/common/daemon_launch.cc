#include "tests/common/daemon_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/io/test_util.h"

namespace tutti::testing {

absl::StatusOr<std::string> MakePoolRoot(const std::string& name) {
  std::string why;
  std::string dir = io::testing::MakeODirectDir(name, &why);
  if (dir.empty())
    return absl::InternalError(absl::StrCat("no pool directory for ", name, ": ", why));
  return dir;
}

absl::StatusOr<std::string> MakeTempDir(const std::string& pattern) {
  std::string path = pattern;
  if (mkdtemp(path.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", strerror(errno)));
  }
  return path;
}

std::string RunfilePath(const std::string& workspace_relative) {
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    const char* root = getenv(var);
    if (root == nullptr) continue;
    const std::string path = absl::StrCat(root, "/tutti/", workspace_relative);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return workspace_relative;
}

std::string TuttidBinary() {
  if (const char* bin = getenv("TUTTID_BIN"); bin != nullptr && *bin != '\0') return bin;
  return RunfilePath("daemon/tuttid");
}

absl::StatusOr<pid_t> SpawnLogged(const std::vector<std::string>& argv,
                                  const std::string& log_path) {
  std::vector<std::string> args = argv;  // copied before fork: the child only execs
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (log >= 0) {
      dup2(log, 1);
      dup2(log, 2);
    }
    std::vector<char*> cargv;
    for (auto& a : args) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    execv(cargv[0], cargv.data());
    dprintf(2, "execv %s: %s\n", cargv[0], strerror(errno));
    _exit(127);
  }
  return pid;
}

int WaitForExit(pid_t pid, absl::Duration timeout) {
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

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

std::string FileTail(const std::string& path, size_t bytes) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  return all.size() <= bytes ? all : all.substr(all.size() - bytes);
}

}  // namespace tutti::testing

// What every test that runs a real tuttid needs: a pool directory that takes O_DIRECT, the
// binary's path, starting it with its output in a log, waiting for it, and reading the log.
// tests/integration (TuttidProcess), tests/e2e (TuttidFixture) and tests/gpu (TuttidRunner) build
// their launchers on these. Test-only.
//
// Thread-safety: the functions are thread-safe.
#ifndef TUTTI_TESTS_COMMON_DAEMON_LAUNCH_H_
#define TUTTI_TESTS_COMMON_DAEMON_LAUNCH_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tutti::testing {

// A fresh directory named after `name` on a filesystem that takes O_DIRECT ($TEST_TMPDIR when it
// does, else /var/tmp or /tmp: io::testing::MakeODirectDir). INTERNAL, with the reasons, if none.
absl::StatusOr<std::string> MakePoolRoot(const std::string& name);

// mkdtemp(`pattern`), which must end in XXXXXX. INTERNAL with the errno text.
absl::StatusOr<std::string> MakeTempDir(const std::string& pattern);

// The path of a binary of this workspace in the test's runfiles, e.g. "daemon/tuttid"; the
// workspace-relative path itself when there are no runfiles (run from the workspace root).
std::string RunfilePath(const std::string& workspace_relative);

// $TUTTID_BIN when set, else RunfilePath("daemon/tuttid").
std::string TuttidBinary();

// Forks and execs `argv` (argv[0] is the path) with stdout and stderr appended to `log_path`. The
// child is killed when the test process dies (PR_SET_PDEATHSIG). Returns its pid; INTERNAL if fork
// fails. A failed exec shows in the log and as exit code 127.
absl::StatusOr<pid_t> SpawnLogged(const std::vector<std::string>& argv,
                                  const std::string& log_path);

// Waits up to `timeout` for child `pid`; returns its wait status, -1 while it still runs, 0 if it
// is not our child any more.
int WaitForExit(pid_t pid, absl::Duration timeout);

// SIGKILLs child `pid` and reaps it.
void KillAndReap(pid_t pid);

// The last `bytes` of the file at `path` (all of it if shorter; "" if unreadable).
std::string FileTail(const std::string& path, size_t bytes);

}  // namespace tutti::testing

#endif  // TUTTI_TESTS_COMMON_DAEMON_LAUNCH_H_

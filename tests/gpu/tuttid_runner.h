// Runs the real tuttid binary for GPU tests and benchmarks: writes a config, starts the daemon,
// waits until Admin.Status answers, and stops (SIGTERM) or kills (SIGKILL) it.
//
// The binary is $TUTTID_BIN, else daemon/tuttid in the test's runfiles, else daemon/tuttid
// relative to the working directory's bundle (.bundle/bin/daemon/tuttid). The pool goes on a
// filesystem that takes O_DIRECT: $TUTTI_GPU_TEST_DIR, else $TEST_TMPDIR if it takes O_DIRECT,
// else /var/tmp; the socket under /tmp.
//
// Thread-safety: none; one owner thread (Kill may come from another thread).
#ifndef TUTTI_TESTS_GPU_TUTTID_RUNNER_H_
#define TUTTI_TESTS_GPU_TUTTID_RUNNER_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "tutti/v1/admin.grpc.pb.h"

namespace tutti::gputest {

class TuttidRunner {
 public:
  // Makes fresh directories and starts tuttid with `config_body` (text-proto fields other than
  // state_dir, listen and pool.dirs, which the runner sets) and waits up to `ready_s` for it.
  // UNAVAILABLE with the daemon's log tail if it exits or does not answer.
  static absl::StatusOr<std::unique_ptr<TuttidRunner>> Start(const std::string& config_body,
                                                             int ready_s = 60);
  ~TuttidRunner();  // kills the daemon if it runs, removes the directories

  // Restarts on the same state (after Stop or Kill).
  absl::Status Restart(int ready_s = 60);
  // SIGTERM and wait; the exit code, or INTERNAL if it died of a signal or did not exit in time.
  absl::StatusOr<int> Stop(int timeout_s = 30);
  // SIGKILL and wait.
  void Kill();

  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  const std::string& root() const { return root_; }
  std::string LogTail(size_t bytes = 3000) const;
  tutti::v1::Admin::Stub& admin() { return *admin_; }

 private:
  TuttidRunner() = default;
  absl::Status Launch(int ready_s);

  std::string root_, socket_dir_, socket_, config_path_, log_path_;
  pid_t pid_ = -1;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tutti::v1::Admin::Stub> admin_;
};

// A gRPC channel to a unix socket.
std::shared_ptr<grpc::Channel> UnixChannel(const std::string& socket);

}  // namespace tutti::gputest

#endif  // TUTTI_TESTS_GPU_TUTTID_RUNNER_H_

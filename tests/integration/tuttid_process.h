// Runs the real tuttid binary for daemon-level tests: writes its config, starts it, waits until
// it answers, stops it with SIGTERM or kills it with SIGKILL, and restarts it on the same state.
//
// The binary is found through the test's runfiles ($TEST_SRCDIR/tutti/daemon/tuttid), or
// $TUTTID_BIN when set. The pool goes on a disk filesystem that takes O_DIRECT ($TEST_TMPDIR,
// else /var/tmp); the socket under /tmp (a unix socket path is at most 107 bytes).
//
// Thread-safety: none; drive one TuttidProcess from one thread (Kill may be called from another
// thread while the owner waits, see Kill).
#ifndef TUTTI_TESTS_INTEGRATION_TUTTID_PROCESS_H_
#define TUTTI_TESTS_INTEGRATION_TUTTID_PROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "tests/common/daemon_launch.h"
#include "tutti/v1/admin.grpc.pb.h"

namespace tutti::testing {

struct TuttidConfig {
  uint64_t capacity_bytes = 64ull << 20;
  uint32_t object_bytes = 4096;
  uint32_t max_objects = 8;
  std::string backend = "uring";
  std::string io_fallback;  // io.fallback: "" (uring), "uring" or "fail"
  std::string extra_io;     // more IoConfig fields in text format, e.g. "nvme_devices: \"...\""
  uint32_t queue_depth = 32;
  uint64_t dram_bytes = 0;
  uint32_t max_blocks_per_call = 256;
  uint32_t session_ttl_ms = 30000;
  uint32_t lease_ttl_ms = 30000;
  uint64_t store_staging_bytes = 32ull << 20;
  uint64_t retrieve_staging_bytes = 32ull << 20;
  uint32_t checkpoint_every = 65536;
  std::string log_level = "info";
  // More LimitsConfig fields in text format, written inside the limits block, e.g.
  // "max_sessions: 80 max_sessions_per_user: 80"; empty: none.
  std::string extra_limits;
  // metrics.listen: "off" binds no TCP port (tests run side by side); "127.0.0.1:0": any free
  // port, logged as "metrics on http://127.0.0.1:PORT/metrics".
  std::string metrics_listen = "off";
  // More MetricsConfig fields in text format, e.g. "namespace_labels: true"; empty: none.
  std::string extra_metrics;
};

// Where one daemon's files live; the same env across restarts keeps the pool and journal.
class TuttidEnv {
 public:
  // Creates fresh directories. INTERNAL if they cannot be made.
  static absl::StatusOr<std::unique_ptr<TuttidEnv>> Create(const TuttidConfig& config);
  ~TuttidEnv();  // removes the directories and the socket

  const TuttidConfig& config() const { return config_; }
  const std::string& root() const { return root_; }
  const std::string& state_dir() const { return state_dir_; }
  const std::string& pool_dir() const { return pool_dir_; }
  const std::string& socket() const { return socket_; }
  std::string admin_socket() const { return socket_ + ".admin"; }
  const std::string& config_path() const { return config_path_; }

  // Sum over the pool files of (apparent size, allocated bytes = st_blocks * 512).
  struct DiskUse {
    uint64_t files = 0, apparent_bytes = 0, allocated_bytes = 0;
  };
  DiskUse PoolDiskUse() const;

 private:
  TuttidEnv() = default;
  TuttidConfig config_;
  std::string root_, state_dir_, pool_dir_, socket_dir_, socket_, config_path_;
};

class TuttidProcess {
 public:
  // Starts tuttid on `env` and waits (up to `ready_timeout_s`) until Admin.Status answers.
  // UNAVAILABLE (with the daemon's log tail) if it exits or never answers; the process is gone
  // then. `env` must outlive the process.
  static absl::StatusOr<std::unique_ptr<TuttidProcess>> Start(const TuttidEnv& env,
                                                              int ready_timeout_s = 60);
  // Starts tuttid on `env` without waiting for it (to kill it during start-up and recovery).
  // channel() and admin() are unusable on the result. INTERNAL if fork fails.
  static absl::StatusOr<std::unique_ptr<TuttidProcess>> Spawn(const TuttidEnv& env);
  ~TuttidProcess();  // SIGKILLs the daemon if it still runs

  // Drops this object's channel (channel() and admin() are unusable afterwards; close other
  // users' channels first too, or the daemon waits for them), sends SIGTERM, and waits up to
  // `timeout_s`. Returns the exit code; INTERNAL if it died of a signal, DEADLINE_EXCEEDED
  // (after a SIGKILL) if it did not exit in time.
  absl::StatusOr<int> Stop(int timeout_s = 60);
  // SIGKILL and wait. Safe to call from another thread while the owner is not in Stop/Kill.
  void Kill();
  bool running() const { return running_.load(); }
  pid_t pid() const { return pid_; }

  // The engine socket's channel, and the operator API on the admin socket.
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  std::shared_ptr<grpc::Channel> admin_channel() const { return admin_channel_; }
  tutti::v1::Admin::Stub& admin() { return *admin_; }
  const std::string& socket() const { return env_->socket(); }
  // The last `bytes` of this run's log (stderr and stdout).
  std::string LogTail(size_t bytes = 4000) const;
  const std::string& log_path() const { return log_path_; }

 private:
  TuttidProcess() = default;
  absl::Status WaitReady(int timeout_s);

  const TuttidEnv* env_ = nullptr;
  pid_t pid_ = -1;
  std::atomic<bool> running_{false};
  std::string log_path_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<grpc::Channel> admin_channel_;
  std::unique_ptr<tutti::v1::Admin::Stub> admin_;
};

// Runs `argv` to completion, capturing stdout and stderr. Returns the exit code (-signal when
// killed by one).
struct CommandResult {
  int exit_code = -1;
  std::string out, err;
};
CommandResult RunCommand(const std::vector<std::string>& argv);

}  // namespace tutti::testing

#endif  // TUTTI_TESTS_INTEGRATION_TUTTID_PROCESS_H_

// A real tuttid for the client libraries' C++ tests: writes a config into a fresh directory
// (pool on a filesystem that takes O_DIRECT: $TEST_TMPDIR, else /var/tmp; socket under /tmp),
// starts //daemon:tuttid from the test's runfiles ($TUTTID_BIN overrides), waits until the socket
// answers, and stops (SIGTERM) or kills (SIGKILL) it; a restart reuses the same pool and journal.
//
// (Built on tests/common/daemon_launch.h, like tests/integration's fuller harness.)
//
// Thread-safety: none; one thread drives a fixture.
#ifndef TUTTI_TESTS_E2E_TUTTID_FIXTURE_H_
#define TUTTI_TESTS_E2E_TUTTID_FIXTURE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti::e2e {

struct FixtureConfig {
  uint64_t capacity_bytes = 256ull << 20;
  uint32_t object_bytes = 64 << 10;
  uint32_t max_objects = 16;
  uint64_t dram_bytes = 0;
  uint64_t store_staging_bytes = 64ull << 20;
  uint64_t retrieve_staging_bytes = 64ull << 20;
  uint32_t session_ttl_ms = 30000;
  std::string extra;  // more config text, e.g. "gpu { mode: \"cuda\" }"
};

class TuttidFixture {
 public:
  // Makes the directories and writes the config; does not start tuttid. INTERNAL on errors.
  static absl::StatusOr<std::unique_ptr<TuttidFixture>> Create(const FixtureConfig& config);
  ~TuttidFixture();  // kills tuttid if running, removes the directories

  // Starts tuttid and waits up to 60 s until its socket accepts a gRPC connection. UNAVAILABLE
  // with the log's tail if it exits or does not answer.
  absl::Status Start();
  // SIGTERM, then waits up to 60 s. INTERNAL if it does not exit cleanly (exit code 0).
  absl::Status Stop();
  // SIGKILL and wait.
  void Kill();

  bool running() const { return pid_ > 0; }
  const std::string& socket() const { return socket_; }
  std::string LogTail(size_t bytes = 4000) const;

 private:
  TuttidFixture() = default;

  std::string root_, socket_dir_, socket_, config_path_, log_path_;
  pid_t pid_ = -1;
};

}  // namespace tutti::e2e

#endif  // TUTTI_TESTS_E2E_TUTTID_FIXTURE_H_

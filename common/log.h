// The daemon's one logging layer, over spdlog.
//
// One named logger per subsystem ("io", "store", "server", "gpu", ...), all writing to stderr (the
// journal, under systemd). Messages carry an identity prefix where one exists ("pool0 q3",
// "session 7"). Levels mean:
//   error: something was lost or refused that an operator must look at (I/O error, corrupt block).
//   warn:  a fallback was taken or a limit was hit; service continues.
//   info:  start-up, shut-down, configuration, sessions attaching and leaving.
//   debug: per-request detail; trace: per-I/O detail. Both are off by default.
// On the I/O path use TUTTI_LOG_EVERY_N_SEC so a failing disk cannot flood the log.
#ifndef TUTTI_COMMON_LOG_H_
#define TUTTI_COMMON_LOG_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "spdlog/spdlog.h"

namespace tutti::log {

// Returns the logger named `subsystem`, creating it on first use. Thread-safe.
std::shared_ptr<spdlog::logger> Get(const std::string& subsystem);

// Sets the level of every logger, present and future. Returns false for an unknown name.
bool SetLevel(const std::string& level_name);

// Sets the level of the existing logger named `subsystem` until the next SetLevel (a run-time
// change by an operator). Returns its previous level's name. INVALID_ARGUMENT for an unknown
// level; NOT_FOUND for a subsystem with no logger, the message listing those there are.
absl::StatusOr<std::string> SetSubsystemLevel(const std::string& subsystem,
                                              const std::string& level_name);

// True at most once per `seconds` for each call site (see TUTTI_LOG_EVERY_N_SEC).
class RateLimiter {
 public:
  explicit RateLimiter(double seconds) : period_ns_(static_cast<int64_t>(seconds * 1e9)) {}
  // Returns true if a message may be logged now; counts the ones suppressed.
  bool Allow(uint64_t* suppressed);

 private:
  const int64_t period_ns_;
  std::atomic<int64_t> next_ns_{0};
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace tutti::log

// Logs at `level` through `logger` at most once every `seconds` from this call site.
#define TUTTI_LOG_EVERY_N_SEC(logger, level, seconds, ...)                           \
  do {                                                                               \
    static ::tutti::log::RateLimiter tutti_rl_(seconds);                             \
    uint64_t tutti_suppressed_ = 0;                                                  \
    if (tutti_rl_.Allow(&tutti_suppressed_)) {                                       \
      if (tutti_suppressed_ > 0)                                                     \
        (logger)->log(level, "({} similar messages suppressed)", tutti_suppressed_); \
      (logger)->log(level, __VA_ARGS__);                                             \
    }                                                                                \
  } while (0)

#endif  // TUTTI_COMMON_LOG_H_

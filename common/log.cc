#include "common/log.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace tutti::log {
namespace {

absl::Mutex g_mu;
spdlog::level::level_enum g_level ABSL_GUARDED_BY(g_mu) = spdlog::level::info;

}  // namespace

std::shared_ptr<spdlog::logger> Get(const std::string& subsystem) {
  absl::MutexLock lock(&g_mu);
  if (auto existing = spdlog::get(subsystem)) return existing;
  auto logger = spdlog::stderr_color_mt(subsystem);
  logger->set_level(g_level);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%n] %v");
  return logger;
}

bool SetLevel(const std::string& level_name) {
  auto level = spdlog::level::from_str(level_name);
  if (level == spdlog::level::off && level_name != "off") return false;
  absl::MutexLock lock(&g_mu);
  g_level = level;
  spdlog::set_level(level);
  return true;
}

absl::StatusOr<std::string> SetSubsystemLevel(const std::string& subsystem,
                                              const std::string& level_name) {
  const auto level = spdlog::level::from_str(level_name);
  if (level == spdlog::level::off && level_name != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown log level '", level_name, "'; one of trace, debug, info, warn, error, critical, off"));
  }
  absl::MutexLock lock(&g_mu);
  std::shared_ptr<spdlog::logger> logger = spdlog::get(subsystem);
  if (logger == nullptr) {
    std::vector<std::string> names;
    spdlog::apply_all([&names](std::shared_ptr<spdlog::logger> l) { names.push_back(l->name()); });
    std::sort(names.begin(), names.end());
    return absl::NotFoundError(absl::StrCat("no logger named '", subsystem,
                                            "'; the subsystems are: ", absl::StrJoin(names, ", ")));
  }
  const spdlog::string_view_t previous = spdlog::level::to_string_view(logger->level());
  logger->set_level(level);
  return std::string(previous.data(), previous.size());
}

bool RateLimiter::Allow(uint64_t* suppressed) {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t next = next_ns_.load(std::memory_order_relaxed);
  if (now < next || !next_ns_.compare_exchange_strong(next, now + period_ns_)) {
    suppressed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
  return true;
}

}  // namespace tutti::log

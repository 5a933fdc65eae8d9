#include "daemon/service/heartbeat.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tutti::service {

namespace {

absl::Duration PeriodFor(absl::Duration watchdog) {
  if (watchdog <= absl::ZeroDuration()) return Heartbeat::kStatusPeriod;
  return std::min(Heartbeat::kStatusPeriod, watchdog / 2);
}

}  // namespace

Heartbeat::Heartbeat(Notifier* notifier, Check check, Summary summary)
    : notifier_(notifier),
      check_(std::move(check)),
      summary_(std::move(summary)),
      watchdog_(notifier->WatchdogInterval() > absl::ZeroDuration()),
      period_(PeriodFor(notifier->WatchdogInterval())) {}

Heartbeat::~Heartbeat() { Stop(); }

absl::Status Heartbeat::Beat() {
  absl::Status alive = check_();
  if (!alive.ok()) {
    const std::string why = absl::StrCat("unhealthy: ", alive.message());
    notifier_->Status(why);
    TUTTI_LOG_EVERY_N_SEC(log::Get("service"), spdlog::level::warn, 60,
                          "{}; not petting the watchdog", why);
    return alive;
  }
  if (watchdog_) notifier_->PetWatchdog();
  const std::string summary = summary_();
  notifier_->Status(summary);
  log::Get("service")->debug("heartbeat: {}", summary);
  return alive;
}

void Heartbeat::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Heartbeat::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    mu_.Unlock();
    (void)Beat();
    mu_.Lock();
    const absl::Time next = absl::Now() + period_;
    // Wakes early only for Stop.
    mu_.AwaitWithDeadline(absl::Condition(&stop_), next);
  }
}

}  // namespace tutti::service

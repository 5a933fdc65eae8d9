#include "daemon/service/notifier.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/log.h"

namespace tutti::service {

void Notifier::Status(std::string_view text) {
  std::string state = "STATUS=";
  state.append(text);
  std::replace(state.begin(), state.end(), '\n', ' ');
  Send(state);
}

namespace {

class SdNotifier : public Notifier {
 public:
  void Send(const std::string& state) override {
    // 0: NOTIFY_SOCKET unset (not under systemd); < 0: -errno.
    const int r = sd_notify(/*unset_environment=*/0, state.c_str());
    if (r < 0) {
      TUTTI_LOG_EVERY_N_SEC(log::Get("service"), spdlog::level::warn, 60, "sd_notify {}: {}",
                            state.substr(0, state.find('=')), strerror(-r));
    }
  }

  absl::Duration WatchdogInterval() const override {
    uint64_t usec = 0;
    // > 0: on for this process (WATCHDOG_PID, if set, is ours); 0: off; < 0: a bad variable.
    const int r = sd_watchdog_enabled(/*unset_environment=*/0, &usec);
    if (r < 0) {
      log::Get("service")->warn("watchdog off: WATCHDOG_USEC/WATCHDOG_PID unreadable: {}",
                                strerror(-r));
    }
    return r > 0 ? absl::Microseconds(usec) : absl::ZeroDuration();
  }
};

}  // namespace

std::unique_ptr<Notifier> SystemdNotifier() { return std::make_unique<SdNotifier>(); }

}  // namespace tutti::service

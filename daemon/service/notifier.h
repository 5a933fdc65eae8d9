// How tuttid tells its service manager what it is doing: the sd_notify(3) protocol (systemd's
// Type=notify), through libsystemd. READY=1 once it serves, STATUS= lines with what it is doing,
// RELOADING=1 around a config reload, STOPPING=1 on SIGTERM, WATCHDOG=1 while it is alive
// (daemon/service/heartbeat.h decides when).
//
// Notification is advisory: a failed send is logged (rate-limited), never returned, and never
// stops the daemon. Outside systemd (no NOTIFY_SOCKET) every send does nothing.
//
// Thread-safety: every method may be called from any thread.
#ifndef TUTTI_DAEMON_SERVICE_NOTIFIER_H_
#define TUTTI_DAEMON_SERVICE_NOTIFIER_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/time/time.h"

namespace tutti::service {

class Notifier {
 public:
  virtual ~Notifier() = default;

  // Sends one sd_notify state block, e.g. "READY=1" or "STATUS=serving".
  virtual void Send(const std::string& state) = 0;
  // How often the manager expects WATCHDOG=1 at the latest (its WatchdogSec), or zero when the
  // watchdog is off for this process.
  virtual absl::Duration WatchdogInterval() const = 0;

  void Ready() { Send("READY=1"); }
  void Reloading() { Send("RELOADING=1"); }
  void Stopping() { Send("STOPPING=1"); }
  void PetWatchdog() { Send("WATCHDOG=1"); }
  // STATUS=<text>, with newlines replaced by spaces (a STATUS value is one line).
  void Status(std::string_view text);
};

// The notifier of the running process: sd_notify(0, ...) and sd_watchdog_enabled(0, ...), both
// reading NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID from the environment (left set).
std::unique_ptr<Notifier> SystemdNotifier();

}  // namespace tutti::service

#endif  // TUTTI_DAEMON_SERVICE_NOTIFIER_H_

// The daemon's heartbeat while it serves: every period() a liveness check runs; while it passes,
// WATCHDOG=1 goes to the service manager (when its watchdog is on) and STATUS= carries a one-line
// summary (sessions, blocks, backlog); when it fails, no WATCHDOG=1 goes out, STATUS= says why,
// and a warning is logged, so a daemon whose server or store writer is stuck is killed and
// restarted by systemd after WatchdogSec. A stopped process (SIGSTOP) pets nothing either.
//
// Thread-safety: Start, Stop and the destructor from one thread; Beat from any one thread at a
// time (the heartbeat's own thread once started).
#ifndef TUTTI_DAEMON_SERVICE_HEARTBEAT_H_
#define TUTTI_DAEMON_SERVICE_HEARTBEAT_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/service/notifier.h"

namespace tutti::service {

class Heartbeat {
 public:
  // OK when the daemon is alive; else what is stuck. May block (a stuck lock): then no beat
  // happens until it returns, which is what the watchdog needs.
  using Check = std::function<absl::Status()>;
  // The one-line STATUS= text while alive.
  using Summary = std::function<std::string()>;

  // The most time between two STATUS= summaries (a beat may come sooner, for the watchdog).
  static constexpr absl::Duration kStatusPeriod = absl::Seconds(10);

  // `notifier` must outlive the heartbeat; its WatchdogInterval() is read here, once. Starts
  // nothing.
  Heartbeat(Notifier* notifier, Check check, Summary summary);
  ~Heartbeat();  // Stop()

  // Half the watchdog interval when it is on (and shorter than kStatusPeriod), else kStatusPeriod.
  absl::Duration period() const { return period_; }

  // One beat: runs the check; if it passes, pets the watchdog (when on) and sends the summary;
  // else sends "STATUS=unhealthy: <why>" and logs it (at most once a minute). Returns the check's
  // status.
  absl::Status Beat();

  // Starts the thread that beats at once and then every period(). At most once.
  void Start();
  // Stops and joins the thread (before STOPPING=1: a stopping daemon pets nothing). Idempotent.
  void Stop();

 private:
  void Run();

  Notifier* const notifier_;
  const Check check_;
  const Summary summary_;
  const bool watchdog_;
  const absl::Duration period_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tutti::service

#endif  // TUTTI_DAEMON_SERVICE_HEARTBEAT_H_

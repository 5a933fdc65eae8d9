// A Notifier for tests: records every state block sent, with a chosen watchdog interval.
#ifndef TUTTI_DAEMON_SERVICE_FAKE_NOTIFIER_H_
#define TUTTI_DAEMON_SERVICE_FAKE_NOTIFIER_H_

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "daemon/service/notifier.h"

namespace tutti::service {

class FakeNotifier : public Notifier {
 public:
  explicit FakeNotifier(absl::Duration watchdog = absl::ZeroDuration()) : watchdog_(watchdog) {}

  void Send(const std::string& state) override {
    absl::MutexLock lock(&mu_);
    sent_.push_back(state);
  }
  absl::Duration WatchdogInterval() const override { return watchdog_; }

  // Every block sent so far, in order; Take() also forgets them.
  std::vector<std::string> Sent() const {
    absl::MutexLock lock(&mu_);
    return sent_;
  }
  std::vector<std::string> Take() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    out.swap(sent_);
    return out;
  }

 private:
  const absl::Duration watchdog_;
  mutable absl::Mutex mu_;
  std::vector<std::string> sent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::service

#endif  // TUTTI_DAEMON_SERVICE_FAKE_NOTIFIER_H_

#include "daemon/server/engine_watcher.h"

#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/server/pidfd.h"

namespace tutti::server {
namespace {

constexpr int kPidfdTimeoutMs = 200;
constexpr int kPollTimeoutMs = 50;
constexpr int64_t kSweepEveryMs = 1000;
constexpr uint64_t kWakeId = 0;  // epoll data of the wake-up eventfd; watch ids start at 1

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status NoSuchProcess(uint32_t pid) {
  return absl::InvalidArgumentError(absl::StrCat(
      "engine_pid ", pid, ": no such process (it exited, or lives in another pid namespace)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<EngineWatcher>> EngineWatcher::Create(OnExit on_exit) {
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) return absl::InternalError(absl::StrCat("epoll_create1: ", strerror(errno)));
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  if (wake_fd < 0 || epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &ev) != 0) {
    const int err = errno;
    close(epoll_fd);
    if (wake_fd >= 0) close(wake_fd);
    return absl::InternalError(absl::StrCat("eventfd: ", strerror(err)));
  }
  const int self = PidfdOpen(getpid());
  const bool use_pidfd = self >= 0;
  if (use_pidfd) {
    close(self);
  } else {
    log::Get("server")->warn("pidfd_open unavailable ({}): engine processes are polled every {} ms",
                             strerror(errno), kPollTimeoutMs);
  }
  return std::unique_ptr<EngineWatcher>(
      new EngineWatcher(std::move(on_exit), epoll_fd, wake_fd, use_pidfd));
}

EngineWatcher::EngineWatcher(OnExit on_exit, int epoll_fd, int wake_fd, bool use_pidfd)
    : on_exit_(std::move(on_exit)),
      epoll_fd_(epoll_fd),
      wake_fd_(wake_fd),
      use_pidfd_(use_pidfd),
      thread_([this] { Loop(); }) {}

EngineWatcher::~EngineWatcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  for (auto& [id, e] : entries_) Drop(e);
  close(wake_fd_);
  close(epoll_fd_);
}

absl::Status EngineWatcher::Watch(uint32_t pid, uint64_t session_id, std::function<bool()> wanted) {
  if (pid == 0) return NoSuchProcess(pid);
  int pidfd = -1;
  if (use_pidfd_) {
    pidfd = PidfdOpen(static_cast<pid_t>(pid));
    if (pidfd < 0) {
      if (errno == ESRCH || errno == EINVAL) return NoSuchProcess(pid);
      return absl::InternalError(absl::StrCat("pidfd_open(", pid, "): ", strerror(errno)));
    }
  } else if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
    return NoSuchProcess(pid);
  }
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  if (pidfd >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, pidfd, &ev) != 0) {
      const int err = errno;
      close(pidfd);
      return absl::InternalError(absl::StrCat("epoll_ctl(pidfd): ", strerror(err)));
    }
  }
  entries_[id] = Entry{pid, session_id, pidfd, std::move(wanted)};
  return absl::OkStatus();
}

size_t EngineWatcher::num_watches() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

void EngineWatcher::Drop(Entry& e) {
  if (e.pidfd >= 0) close(e.pidfd);  // also leaves the epoll set
  e.pidfd = -1;
}

std::vector<EngineWatcher::Entry> EngineWatcher::Collect(const std::vector<uint64_t>& ready,
                                                         bool sweep) {
  std::vector<Entry> exited;
  absl::MutexLock lock(&mu_);
  for (uint64_t id : ready) {
    auto it = entries_.find(id);
    if (it == entries_.end()) continue;
    Drop(it->second);
    exited.push_back(std::move(it->second));
    entries_.erase(it);
  }
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = it->second;
    const bool gone = e.pidfd < 0 && kill(static_cast<pid_t>(e.pid), 0) != 0 && errno == ESRCH;
    if (gone) {
      exited.push_back(std::move(e));
      entries_.erase(it++);
    } else if (sweep && !e.wanted()) {
      Drop(e);
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
  return exited;
}

void EngineWatcher::Loop() {
  int64_t last_sweep = NowMs();
  epoll_event events[32];
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    const int n = epoll_wait(epoll_fd_, events, 32, use_pidfd_ ? kPidfdTimeoutMs : kPollTimeoutMs);
    std::vector<uint64_t> ready;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kWakeId) {
        uint64_t drain;
        (void)!read(wake_fd_, &drain, sizeof(drain));
      } else {
        ready.push_back(events[i].data.u64);
      }
    }
    const bool sweep = NowMs() - last_sweep >= kSweepEveryMs;
    if (sweep) last_sweep = NowMs();
    for (const Entry& e : Collect(ready, sweep)) {
      if (e.wanted()) on_exit_(e.session_id, e.pid);
    }
  }
}

}  // namespace tutti::server

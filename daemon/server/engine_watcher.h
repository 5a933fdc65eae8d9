// Watches engine processes and reports each one's exit at once, so that its session ends and its
// memory mappings close as soon as it dies, not only when its keep-alives stop (docs/gpu.md: a
// dead engine's GPU memory may be freed while the daemon still maps it).
//
// Linux pidfds (pidfd_open) polled by one thread with epoll: the exit is seen within
// microseconds. Where the kernel lacks pidfds the thread checks kill(pid, 0) every 50 ms instead.
// The pid must be valid in the daemon's pid namespace.
//
// Thread-safety: Watch may be called from any thread. `on_exit` runs on the watcher's thread with
// no lock of the watcher held, once per watch whose process exited while still wanted.
#ifndef TUTTI_DAEMON_SERVER_ENGINE_WATCHER_H_
#define TUTTI_DAEMON_SERVER_ENGINE_WATCHER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tutti::server {

class EngineWatcher {
 public:
  using OnExit = std::function<void(uint64_t session_id, uint32_t pid)>;

  // Starts the watcher thread. INTERNAL if epoll or eventfd cannot be made.
  static absl::StatusOr<std::unique_ptr<EngineWatcher>> Create(OnExit on_exit);
  EngineWatcher(const EngineWatcher&) = delete;
  EngineWatcher& operator=(const EngineWatcher&) = delete;
  // Stops the thread; pending watches are dropped without calls.
  ~EngineWatcher();

  // Watches process `pid` for session `session_id` until it exits (then on_exit) or `wanted`
  // returns false (checked about once a second; then the watch is dropped silently).
  // INVALID_ARGUMENT when pid is 0 or no such process exists (already exited, or in another pid
  // namespace); the watch is not taken then.
  [[nodiscard]] absl::Status Watch(uint32_t pid, uint64_t session_id, std::function<bool()> wanted);

  // Watches in place (tests).
  size_t num_watches() const;
  // True when pidfds are in use, false when polling with kill(pid, 0).
  bool uses_pidfd() const { return use_pidfd_; }

 private:
  struct Entry {
    uint32_t pid = 0;
    uint64_t session_id = 0;
    int pidfd = -1;  // -1: polled with kill(pid, 0)
    std::function<bool()> wanted;
  };

  EngineWatcher(OnExit on_exit, int epoll_fd, int wake_fd, bool use_pidfd);
  void Loop();
  // Removes and returns the entries whose process exited (`ready` ids from epoll, plus polled
  // ones), and silently drops unwanted ones when `sweep`.
  std::vector<Entry> Collect(const std::vector<uint64_t>& ready, bool sweep);
  void Drop(Entry& e);

  const OnExit on_exit_;
  const int epoll_fd_;
  const int wake_fd_;
  const bool use_pidfd_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by watch id
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_ENGINE_WATCHER_H_

// A small fixed set of threads for the data path's CPU work that must not run on the thread
// leading a transfer: checksums of objects read (verification) and of objects to be written.
//
// Schedule queues one task (FIFO); ParallelFor splits [0, n) into tasks and also works on the
// calling thread, returning when every index has run. A pool of 0 threads runs everything inline
// on the caller (tests, tiny hosts).
//
// Thread-safety: every method may be called from any thread, including from a task.
// Destruction runs every queued task, then joins the threads; nothing may be scheduled then.
#ifndef TUTTI_DAEMON_DATAPATH_WORK_POOL_H_
#define TUTTI_DAEMON_DATAPATH_WORK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tutti::datapath {

class WorkPool {
 public:
  // `threads` workers named "<name>-<i>" (as /proc shows them, at most 15 characters).
  WorkPool(uint32_t threads, const std::string& name);
  ~WorkPool();
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  uint32_t threads() const { return static_cast<uint32_t>(workers_.size()); }

  // Runs `task` on a worker soon (inline, before returning, with 0 threads).
  void Schedule(std::function<void()> task);

  // Runs fn(i) for every i in [0, n), in chunks of `grain` indices, on the workers and the calling
  // thread; returns once all have run.
  void ParallelFor(size_t n, size_t grain, const std::function<void(size_t)>& fn);

  // A sensible default size: half the cores, 1 .. 8 (at 25 GB/s of reads the checks take about
  // four cores' worth of XXH3; spread over eight threads none of them is above half a core).
  static uint32_t DefaultThreads();

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_WORK_POOL_H_

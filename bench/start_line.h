// A start line for a benchmark's worker threads: each opens and fills what it needs, then
// arrives; the timed loops all start at the time the last one arrived, so no worker's set-up
// (allocating and pinning buffers, opening files) is inside any worker's timing.
//
// Thread-safety: Arrive is called once by each of the `n` workers, from any threads.
#ifndef TUTTI_BENCH_START_LINE_H_
#define TUTTI_BENCH_START_LINE_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace tutti::bench {

class StartLine {
 public:
  using Clock = std::chrono::steady_clock;
  explicit StartLine(size_t n) : waiting_(n) {}
  // Returns the common start time once all `n` have arrived; every worker must arrive, failed
  // ones included, or the others wait for ever.
  Clock::time_point Arrive() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--waiting_ == 0) {
      start_ = Clock::now();
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return waiting_ == 0; });
    }
    return start_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  size_t waiting_;
  Clock::time_point start_;
};

}  // namespace tutti::bench

#endif  // TUTTI_BENCH_START_LINE_H_

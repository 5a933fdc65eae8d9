// An injectable clock: leases, timeouts and expiry read time through it, so tests use ManualClock.
#ifndef TUTTI_COMMON_CLOCK_H_
#define TUTTI_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tutti {

// Thread-safe. NowMs() is monotonic milliseconds from an arbitrary origin.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowMs() const = 0;
  // Monotonic microseconds, for latency measurements; by default NowMs() * 1000 (a manual clock
  // moves in whole milliseconds).
  virtual int64_t NowUs() const { return NowMs() * 1000; }
  // The process-wide steady clock. Never null; lives forever.
  static Clock* Real();
};

class ManualClock : public Clock {
 public:
  explicit ManualClock(int64_t start_ms = 0) : now_ms_(start_ms) {}
  int64_t NowMs() const override { return now_ms_.load(); }
  void AdvanceMs(int64_t ms) { now_ms_.fetch_add(ms); }

 private:
  std::atomic<int64_t> now_ms_;
};

inline Clock* Clock::Real() {
  class SteadyClock : public Clock {
    int64_t NowMs() const override {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    }
    int64_t NowUs() const override {
      return std::chrono::duration_cast<std::chrono::microseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    }
  };
  static SteadyClock* clock = new SteadyClock();
  return clock;
}

}  // namespace tutti

#endif  // TUTTI_COMMON_CLOCK_H_

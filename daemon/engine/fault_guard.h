// Copies to and from memory that another process can take away.
//
// An engine's shared-memory object is a file the engine may shrink (ftruncate) at any time; the
// daemon's mapping of it then has pages without a file behind them, and touching one raises
// SIGBUS, which would kill the daemon and every other engine's session with it. Checking the size
// before a copy leaves a window; this closes it.
//
// A GuardedRange is one such mapping. GuardedCopy makes the range known to a process-wide SIGBUS
// handler for the length of one memcpy. A fault inside the range replaces the range's pages by
// anonymous memory (so the interrupted copy finishes harmlessly), marks the range faulted, and
// GuardedCopy returns false. A SIGBUS anywhere else keeps its default action (or goes to the
// handler installed before ours).
//
// Once faulted, a range stays faulted: its pages no longer show the file (reads give zeros,
// writes go nowhere), so every later GuardedCopy on it returns false as well, and bytes read by a
// copy that returned false must be discarded.
//
// Thread-safety: any number of threads may copy, over the same or different ranges, at once. The
// range's memory must stay mapped until the last copy has returned; the owner unmaps it.
#ifndef TUTTI_DAEMON_ENGINE_FAULT_GUARD_H_
#define TUTTI_DAEMON_ENGINE_FAULT_GUARD_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tutti::engine {

class GuardedRange {
 public:
  GuardedRange(uint8_t* base, uint64_t len) : base_(base), len_(len) {}
  GuardedRange(const GuardedRange&) = delete;
  GuardedRange& operator=(const GuardedRange&) = delete;

  bool contains(const void* p) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return b >= base_ && b < base_ + len_;
  }
  // True once a copy faulted: the mapping no longer shows the engine's memory.
  bool faulted() const { return faulted_.load(std::memory_order_acquire); }

 private:
  friend void OnGuardedFault(GuardedRange* range);
  uint8_t* const base_;
  const uint64_t len_;
  std::atomic<bool> faulted_{false};
};

// Installs the SIGBUS handler, once per process (later calls return the first call's result).
// INTERNAL if sigaction fails.
absl::Status InstallFaultGuard();

// memcpy(dst, src, n) where the bytes on one side lie in `range`. Returns false, without
// crashing, if the range was faulted before or faults during the copy. InstallFaultGuard must have
// succeeded.
[[nodiscard]] bool GuardedCopy(GuardedRange& range, void* dst, const void* src, size_t n);

}  // namespace tutti::engine

#endif  // TUTTI_DAEMON_ENGINE_FAULT_GUARD_H_

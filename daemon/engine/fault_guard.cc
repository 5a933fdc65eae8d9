#include "daemon/engine/fault_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace tutti::engine {

void OnGuardedFault(GuardedRange* range);

namespace {

// The range the current thread is copying over, if any. Set before each copy (which also makes
// the thread's TLS block exist before the handler reads it).
thread_local GuardedRange* t_active = nullptr;
struct sigaction g_previous;

void Handler(int sig, siginfo_t* info, void* context) {
  GuardedRange* range = t_active;
  if (range != nullptr && range->contains(info->si_addr)) {
    OnGuardedFault(range);
    return;  // the faulting access runs again, on anonymous pages now
  }
  // Not a guarded copy: what would have happened without us.
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    signal(SIGBUS, SIG_DFL);  // returning re-raises the fault, which now kills the process
  }
}

}  // namespace

void OnGuardedFault(GuardedRange* range) {
  // Marked before the pages change, so a thread that reads the new pages sees the mark after its
  // copy. mmap over a mapping is not on POSIX's async-signal-safe list but is one system call on
  // Linux (Wayland compositors guard client pools the same way).
  range->faulted_.store(true, std::memory_order_seq_cst);
  if (mmap(range->base_, range->len_, PROT_READ | PROT_WRITE,
           MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED) {
    signal(SIGBUS, SIG_DFL);  // cannot recover: die as without the guard
  }
}

absl::Status InstallFaultGuard() {
  static absl::Status* status = [] {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_sigaction = Handler;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &g_previous) != 0) {
      return new absl::Status(
          absl::InternalError(absl::StrCat("sigaction(SIGBUS): ", strerror(errno))));
    }
    return new absl::Status();
  }();
  return *status;
}

bool GuardedCopy(GuardedRange& range, void* dst, const void* src, size_t n) {
  if (range.faulted()) return false;
  t_active = &range;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_active = nullptr;
  return !range.faulted();
}

}  // namespace tutti::engine

// Process file descriptors (pidfd_open, pidfd_send_signal; Linux 5.3+): a handle on one process
// that a later process with the same pid is never taken for. Shared by the engine watcher (which
// waits on them) and EngineProcess (which asks whether the engine has exited).
//
// Thread-safety: plain system calls, no state.
#ifndef TUTTI_DAEMON_SERVER_PIDFD_H_
#define TUTTI_DAEMON_SERVER_PIDFD_H_

#include <sys/types.h>

namespace tutti::server {

// A new pidfd for process `pid` (close-on-exec, owned by the caller), or -1 with errno set (ESRCH:
// no such process; ENOSYS: a kernel without pidfds).
int PidfdOpen(pid_t pid);

// Whether the process of `pidfd` has exited: a signal 0 through it fails with ESRCH. False for a
// live process of another user (EPERM) and for pidfd < 0.
bool PidfdExited(int pidfd);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_PIDFD_H_

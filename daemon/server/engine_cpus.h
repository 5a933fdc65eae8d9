// The CPUs an engine process may run on, set against tuttid's own. A busy engine whose threads
// share CPUs with tuttid's I/O threads (io_uring's workers among them) waits behind them: beside
// tmpfs Retrieves under MPS a busy engine lost 6.6-12.9% of its throughput on shared CPUs and
// 2.8-4.6% on CPUs of its own (docs/operations.md, "MPS"). Attach reads it and logs an overlap, and
// admin Sessions (`tuttictl sessions`) reads it again at each call, so that an operator sees it
// without a benchmark.
//
// Thread-safety: the free functions keep no state; EngineProcess's methods are const and
// thread-safe.
#ifndef TUTTI_DAEMON_SERVER_ENGINE_CPUS_H_
#define TUTTI_DAEMON_SERVER_ENGINE_CPUS_H_

#include <sched.h>
#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace tutti::server {

struct CpuOverlap {
  std::string engine;  // the engine's CPUs as a list, e.g. "0-13,15"
  std::string tuttid;  // this process's
  int engine_cpus = 0;
  int shared = 0;  // CPUs in both sets
};

// The CPUs in `set` as a list of ranges ("0-3,8,10-11"; "" when empty).
std::string CpuList(const cpu_set_t& set);

// The affinity of process `engine_pid` (its main thread; a cgroup cpuset narrows it) against
// this process's main thread's. NOT_FOUND (with errno's text) when no such process is visible in
// tuttid's pid namespace; INTERNAL for another sched_getaffinity failure (a host of more than
// CPU_SETSIZE CPUs).
absl::StatusOr<CpuOverlap> EngineCpuOverlap(pid_t engine_pid);

// The engine process that attached a session, held by a pidfd (pidfd_open, Linux 5.3+) so that a
// later look at its CPUs reads that process, never one that has taken its pid since it exited.
// Where pidfds are not to be had, the pid alone (and a reused pid may then show another
// process's CPUs). Not copyable.
class EngineProcess {
 public:
  explicit EngineProcess(pid_t pid);
  // Tests: `pidfd` (owned; -1 for none) stands for the process that `pid` named at attach.
  EngineProcess(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  ~EngineProcess();
  EngineProcess(const EngineProcess&) = delete;
  EngineProcess& operator=(const EngineProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Its CPUs against this process's (EngineCpuOverlap). NOT_FOUND once it has exited, whatever
  // process has its pid now.
  absl::StatusOr<CpuOverlap> Cpus() const;

 private:
  bool Exited() const;  // the pidfd says the process has exited (false without a pidfd)

  const pid_t pid_;
  const int pidfd_;
};

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_ENGINE_CPUS_H_

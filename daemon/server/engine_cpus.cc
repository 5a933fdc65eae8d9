#include "daemon/server/engine_cpus.h"

#include <errno.h>
#include <unistd.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/server/pidfd.h"

namespace tutti::server {
namespace {

absl::Status AffinityOf(pid_t pid, cpu_set_t* set) {
  CPU_ZERO(set);
  if (sched_getaffinity(pid, sizeof(*set), set) == 0) return absl::OkStatus();
  const int e = errno;
  std::string what = absl::StrCat("sched_getaffinity(", pid, "): ", strerror(e));
  return e == ESRCH ? absl::NotFoundError(what) : absl::InternalError(what);
}

}  // namespace

std::string CpuList(const cpu_set_t& set) {
  std::string out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    absl::StrAppend(&out, out.empty() ? "" : ",", cpu);
    if (last > cpu) absl::StrAppend(&out, "-", last);
    cpu = last;
  }
  return out;
}

absl::StatusOr<CpuOverlap> EngineCpuOverlap(pid_t engine_pid) {
  cpu_set_t engine, tuttid, both;
  if (absl::Status s = AffinityOf(engine_pid, &engine); !s.ok()) return s;
  if (absl::Status s = AffinityOf(getpid(), &tuttid); !s.ok()) return s;
  CPU_AND(&both, &engine, &tuttid);
  return CpuOverlap{CpuList(engine), CpuList(tuttid), CPU_COUNT(&engine), CPU_COUNT(&both)};
}

EngineProcess::EngineProcess(pid_t pid) : pid_(pid), pidfd_(PidfdOpen(pid)) {}

EngineProcess::~EngineProcess() {
  if (pidfd_ >= 0) close(pidfd_);
}

bool EngineProcess::Exited() const { return PidfdExited(pidfd_); }

absl::StatusOr<CpuOverlap> EngineProcess::Cpus() const {
  const auto exited = [this] {
    return absl::NotFoundError(absl::StrCat("engine pid ", pid_, " has exited"));
  };
  if (Exited()) return exited();
  absl::StatusOr<CpuOverlap> o = EngineCpuOverlap(pid_);
  // Exited between the two looks: the pid may name another process by now.
  if (o.ok() && Exited()) return exited();
  return o;
}

}  // namespace tutti::server

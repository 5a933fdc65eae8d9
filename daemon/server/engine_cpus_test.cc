#include "daemon/server/engine_cpus.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "daemon/server/pidfd.h"
#include "gtest/gtest.h"

namespace tutti::server {
namespace {

cpu_set_t Set(std::initializer_list<int> cpus) {
  cpu_set_t s;
  CPU_ZERO(&s);
  for (int c : cpus) CPU_SET(c, &s);
  return s;
}

TEST(EngineCpusTest, ListsRanges) {
  EXPECT_EQ(CpuList(Set({})), "");
  EXPECT_EQ(CpuList(Set({0})), "0");
  EXPECT_EQ(CpuList(Set({0, 1, 2, 3, 8, 10, 11})), "0-3,8,10-11");
  EXPECT_EQ(CpuList(Set({5, 7, CPU_SETSIZE - 1})), "5,7," + std::to_string(CPU_SETSIZE - 1));
}

// A child held on one CPU: the engine's list is that CPU, shared with this process's set.
TEST(EngineCpusTest, SeesAnotherProcesssCpus) {
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  int first = 0;
  while (!CPU_ISSET(first, &mine)) ++first;
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const cpu_set_t one = Set({first});
    const char ok = sched_setaffinity(0, sizeof(one), &one) == 0 ? 'y' : 'n';
    (void)!write(pipefd[1], &ok, 1);
    pause();
    _exit(0);
  }
  close(pipefd[1]);
  char ok = 0;
  ASSERT_EQ(read(pipefd[0], &ok, 1), 1);
  close(pipefd[0]);
  ASSERT_EQ(ok, 'y');
  absl::StatusOr<CpuOverlap> o = EngineCpuOverlap(child);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->engine, std::to_string(first));
  EXPECT_EQ(o->engine_cpus, 1);
  EXPECT_EQ(o->shared, 1);
  EXPECT_EQ(o->tuttid, CpuList(mine));
}

TEST(EngineCpusTest, NoSuchProcessIsNotFound) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: the pid names no process now
  absl::StatusOr<CpuOverlap> o = EngineCpuOverlap(child);
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kNotFound) << o.status();
  EXPECT_NE(o.status().message().find("sched_getaffinity"), std::string::npos);
}

// A child that waits until killed; its pid.
pid_t Sleeper() {
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  return child;
}

TEST(EngineCpusTest, AProcessHeldReadsItsCpusUntilItExits) {
  const pid_t child = Sleeper();
  ASSERT_GT(child, 0);
  EngineProcess engine(child);
  EXPECT_EQ(engine.pid(), child);
  absl::StatusOr<CpuOverlap> alive = engine.Cpus();
  kill(child, SIGKILL);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  ASSERT_TRUE(alive.ok()) << alive.status();
  absl::StatusOr<CpuOverlap> gone = engine.Cpus();
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
}

// The pid names a live process, but not the one attached (whose pidfd says it exited): as after
// the engine exited and another process took its pid. The pid alone would read the other's CPUs.
TEST(EngineCpusTest, AnotherProcessWithTheEnginesPidIsNotTheEngine) {
  const pid_t attached = Sleeper();
  ASSERT_GT(attached, 0);
  const int pidfd = PidfdOpen(attached);
  kill(attached, SIGKILL);
  ASSERT_EQ(waitpid(attached, nullptr, 0), attached);
  if (pidfd < 0) GTEST_SKIP() << "no pidfd_open here: " << strerror(errno);
  const pid_t other = Sleeper();
  ASSERT_GT(other, 0);
  EngineProcess engine(other, pidfd);
  absl::StatusOr<CpuOverlap> o = engine.Cpus();
  absl::StatusOr<CpuOverlap> by_pid = EngineCpuOverlap(other);
  kill(other, SIGKILL);
  waitpid(other, nullptr, 0);
  EXPECT_TRUE(by_pid.ok()) << by_pid.status();
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kNotFound) << o.status();
  EXPECT_NE(o.status().message().find("has exited"), std::string::npos) << o.status();
}

}  // namespace
}  // namespace tutti::server

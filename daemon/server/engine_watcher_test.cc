#include "daemon/server/engine_watcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tutti::server {
namespace {

pid_t SpawnSleeper() {
  const pid_t pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  return pid;
}

struct Exits {
  absl::Mutex mu;
  std::vector<std::pair<uint64_t, uint32_t>> seen;
  bool WaitFor(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu);
    auto enough = [&]() { return seen.size() >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
};

TEST(EngineWatcherTest, ReportsAnExitAtOnce) {
  Exits exits;
  auto w = EngineWatcher::Create([&](uint64_t session, uint32_t pid) {
    absl::MutexLock lock(&exits.mu);
    exits.seen.emplace_back(session, pid);
  });
  ASSERT_TRUE(w.ok()) << w.status();
  const pid_t a = SpawnSleeper();
  const pid_t b = SpawnSleeper();
  ASSERT_TRUE((*w)->Watch(a, 11, [] { return true; }).ok());
  ASSERT_TRUE((*w)->Watch(b, 12, [] { return true; }).ok());
  EXPECT_EQ((*w)->num_watches(), 2u);
  const absl::Time killed = absl::Now();
  kill(a, SIGKILL);
  ASSERT_TRUE(exits.WaitFor(1, absl::Seconds(5)));
  // A pidfd reports at once; polling within its period.
  EXPECT_LT(absl::Now() - killed, absl::Milliseconds((*w)->uses_pidfd() ? 100 : 500));
  {
    absl::MutexLock lock(&exits.mu);
    ASSERT_EQ(exits.seen.size(), 1u);
    EXPECT_EQ(exits.seen[0], std::make_pair(uint64_t{11}, static_cast<uint32_t>(a)));
  }
  EXPECT_EQ((*w)->num_watches(), 1u);
  waitpid(a, nullptr, 0);
  kill(b, SIGKILL);
  waitpid(b, nullptr, 0);
  ASSERT_TRUE(exits.WaitFor(2, absl::Seconds(5)));
}

TEST(EngineWatcherTest, RefusesAMissingProcess) {
  auto w = EngineWatcher::Create([](uint64_t, uint32_t) {});
  ASSERT_TRUE(w.ok());
  const pid_t gone = SpawnSleeper();
  kill(gone, SIGKILL);
  waitpid(gone, nullptr, 0);
  EXPECT_EQ((*w)->Watch(gone, 1, [] { return true; }).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->Watch(0, 1, [] { return true; }).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->num_watches(), 0u);
}

TEST(EngineWatcherTest, UnwantedWatchesAreDroppedSilently) {
  std::atomic<int> calls{0};
  std::atomic<bool> wanted{true};
  auto w = EngineWatcher::Create([&](uint64_t, uint32_t) { ++calls; });
  ASSERT_TRUE(w.ok());
  const pid_t a = SpawnSleeper();
  ASSERT_TRUE((*w)->Watch(a, 5, [&] { return wanted.load(); }).ok());
  wanted = false;  // the session ended otherwise (Detach)
  for (int i = 0; i < 40 && (*w)->num_watches() > 0; ++i) absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ((*w)->num_watches(), 0u);
  kill(a, SIGKILL);
  waitpid(a, nullptr, 0);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(calls.load(), 0);
}

}  // namespace
}  // namespace tutti::server

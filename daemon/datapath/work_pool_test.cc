#include "daemon/datapath/work_pool.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

TEST(WorkPoolTest, ParallelForRunsEveryIndexOnceOnSeveralThreads) {
  WorkPool pool(3, "test");
  EXPECT_EQ(pool.threads(), 3u);
  std::vector<std::atomic<int>> runs(1000);
  absl::Mutex mu;
  std::set<std::thread::id> threads;
  pool.ParallelFor(runs.size(), 7, [&](size_t i) {
    runs[i].fetch_add(1);
    absl::MutexLock lock(&mu);
    threads.insert(std::this_thread::get_id());
    // Long enough that the workers take chunks too.
    absl::SleepFor(absl::Microseconds(20));
  });
  for (size_t i = 0; i < runs.size(); ++i) ASSERT_EQ(runs[i].load(), 1) << i;
  EXPECT_GT(threads.size(), 1u);
}

TEST(WorkPoolTest, ParallelForFinishesWhileEveryWorkerIsBlocked) {
  WorkPool pool(2, "test");
  absl::Notification release;
  std::atomic<int> blocked{0};
  for (int i = 0; i < 2; ++i) {
    pool.Schedule([&] {
      blocked.fetch_add(1);
      release.WaitForNotification();
    });
  }
  while (blocked.load() < 2) absl::SleepFor(absl::Milliseconds(1));
  std::atomic<int> sum{0};
  pool.ParallelFor(100, 1, [&](size_t i) { sum.fetch_add(static_cast<int>(i)); });
  EXPECT_EQ(sum.load(), 4950);  // the caller did it all
  release.Notify();
}

TEST(WorkPoolTest, ZeroThreadsRunsInline) {
  WorkPool pool(0, "test");
  const std::thread::id me = std::this_thread::get_id();
  bool ran = false;
  pool.Schedule([&] {
    EXPECT_EQ(std::this_thread::get_id(), me);
    ran = true;
  });
  EXPECT_TRUE(ran);
  int count = 0;
  pool.ParallelFor(10, 3, [&](size_t) { ++count; });
  EXPECT_EQ(count, 10);
}

TEST(WorkPoolTest, DestructionRunsQueuedTasks) {
  std::atomic<int> ran{0};
  {
    WorkPool pool(1, "test");
    for (int i = 0; i < 50; ++i) pool.Schedule([&] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 50);
}

TEST(WorkPoolTest, DefaultThreadsIsBounded) {
  EXPECT_GE(WorkPool::DefaultThreads(), 1u);
  EXPECT_LE(WorkPool::DefaultThreads(), 8u);
}

}  // namespace
}  // namespace tutti::datapath

#include "bench/worker_sampler.h"

#include <liburing.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"

namespace tutti::bench {
namespace {

TEST(ParseTaskStatTest, CommandRunsToTheLastParenthesis) {
  std::string comm;
  char state = 0;
  ASSERT_TRUE(ParseTaskStat("123 (iou-wrk-77) R 1 2 3", &comm, &state));
  EXPECT_EQ(comm, "iou-wrk-77");
  EXPECT_EQ(state, 'R');
  ASSERT_TRUE(ParseTaskStat("9 (a) b (c)) S 0", &comm, &state));
  EXPECT_EQ(comm, "a) b (c)");
  EXPECT_EQ(state, 'S');
  EXPECT_FALSE(ParseTaskStat("", &comm, &state));
  EXPECT_FALSE(ParseTaskStat("12 no parentheses S", &comm, &state));
  EXPECT_FALSE(ParseTaskStat("12 (cut)", &comm, &state));
}

// A read forced onto an io_uring worker that waits on an empty pipe: one worker alive, none
// runnable; the sampler counts it the same way.
TEST(WorkerSamplerTest, CountsAWaitingWorkerAsAliveNotRunnable) {
  io_uring ring;
  if (io_uring_queue_init(4, &ring, 0) != 0) GTEST_SKIP() << "no io_uring here";
  uint32_t alive = 0, runnable = 0;
  CountWorkers(&alive, &runnable);
  ASSERT_EQ(alive, 0u) << "no io_uring worker before the first async request";

  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  char byte = 0;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  io_uring_prep_read(sqe, fds[0], &byte, 1, 0);
  sqe->flags |= IOSQE_ASYNC;
  ASSERT_EQ(io_uring_submit(&ring), 1);

  // The worker starts, finds the pipe empty and sleeps (or arms a poll and idles).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  do {
    CountWorkers(&alive, &runnable);
    if (alive >= 1 && runnable == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (std::chrono::steady_clock::now() < deadline);
  EXPECT_GE(alive, 1u);
  EXPECT_EQ(runnable, 0u);

  WorkerSampler sampler(std::chrono::milliseconds(1));
  sampler.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const WorkerSamples s = sampler.Stop();
  EXPECT_GE(s.samples, 2u);
  EXPECT_GE(s.workers_seen, 1u);
  EXPECT_EQ(s.max_runnable, 0u);
  EXPECT_EQ(s.mean_runnable, 0.0);

  ASSERT_EQ(write(fds[1], "x", 1), 1);
  io_uring_cqe* cqe = nullptr;
  ASSERT_EQ(io_uring_wait_cqe(&ring, &cqe), 0);
  EXPECT_EQ(cqe->res, 1);
  EXPECT_EQ(byte, 'x');
  io_uring_cqe_seen(&ring, cqe);
  io_uring_queue_exit(&ring);
  close(fds[0]);
  close(fds[1]);
}

TEST(WorkerSamplerTest, StopWithoutStartAndRestart) {
  WorkerSampler sampler;
  EXPECT_EQ(sampler.Stop().samples, 0u);
  sampler.Start();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GE(sampler.Stop().samples, 1u);
  sampler.Start();  // a new count
  const WorkerSamples again = sampler.Stop();
  EXPECT_LE(again.samples, 2u);
}

}  // namespace
}  // namespace tutti::bench

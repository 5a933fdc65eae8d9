#include "daemon/datapath/work_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "absl/synchronization/blocking_counter.h"

namespace tutti::datapath {

WorkPool::WorkPool(uint32_t threads, const std::string& name) {
  workers_.reserve(threads);
  for (uint32_t i = 0; i < threads; ++i) {
    workers_.emplace_back([this] { Run(); });
    const std::string thread_name = (name + "-" + std::to_string(i)).substr(0, 15);
    pthread_setname_np(workers_.back().native_handle(), thread_name.c_str());
  }
}

WorkPool::~WorkPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

uint32_t WorkPool::DefaultThreads() {
  const uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  return std::clamp(cores / 2, 1u, 8u);
}

void WorkPool::Schedule(std::function<void()> task) {
  if (workers_.empty()) {
    task();
    return;
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void WorkPool::Run() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkPool* p)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stopping_ || !p->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping, and every queued task has run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

void WorkPool::ParallelFor(size_t n, size_t grain, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  const size_t chunks = (n + grain - 1) / grain;
  // Chunks are claimed from a shared counter by the helpers and by this thread, so the call ends
  // as soon as the work does, even when every worker is busy elsewhere.
  struct Shared {
    std::atomic<size_t> next{0};
  };
  auto shared = std::make_shared<Shared>();
  auto work = [shared, chunks, grain, n, &fn](absl::BlockingCounter* left) {
    for (size_t c; (c = shared->next.fetch_add(1)) < chunks;) {
      const size_t end = std::min(n, (c + 1) * grain);
      for (size_t i = c * grain; i < end; ++i) fn(i);
      left->DecrementCount();
    }
  };
  absl::BlockingCounter left(static_cast<int>(chunks));
  const size_t helpers = std::min<size_t>(workers_.size(), chunks - 1);
  for (size_t h = 0; h < helpers; ++h) Schedule([work, &left] { work(&left); });
  work(&left);
  left.Wait();
}

}  // namespace tutti::datapath

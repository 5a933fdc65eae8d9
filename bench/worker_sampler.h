// WorkerSampler: how many of this process's io_uring workers (threads named "iou-wrk-*") are
// runnable at once, sampled from /proc/self/task while a measured phase runs.
//
// Why: a read of a tmpfs file is a memory copy that never blocks, so how many such reads are
// being copied at once is how many io_uring workers are runnable (state R: running, or ready and
// waiting for a core). That count is what a machine with more cores could run in parallel, so it
// shows on a 2-core machine what limits a 16-core one (docs/gpu.md, "tmpfs reads").
//
// Contract: Start() begins sampling on a thread of its own every `period`; Stop() ends it and
// returns the figures over the samples taken since Start(). Start/Stop from one thread; Start()
// again after Stop() starts a new count. Sampling costs a directory scan and one small read per
// thread per sample; keep `period` at a millisecond or more.
#ifndef TUTTI_BENCH_WORKER_SAMPLER_H_
#define TUTTI_BENCH_WORKER_SAMPLER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

namespace tutti::bench {

struct WorkerSamples {
  uint64_t samples = 0;
  double mean_runnable = 0;  // io_uring workers in state R, averaged over the samples
  uint32_t max_runnable = 0;
  uint32_t workers_seen = 0;  // the most io_uring workers alive at one sample
};

// One /proc/<pid>/task/<tid>/stat line's command and state: false when it is not one.
bool ParseTaskStat(const std::string& stat, std::string* comm, char* state);

// Counts the io_uring workers of /proc/self/task and how many of them are in state R.
void CountWorkers(uint32_t* alive, uint32_t* runnable);

class WorkerSampler {
 public:
  explicit WorkerSampler(std::chrono::microseconds period = std::chrono::milliseconds(2))
      : period_(period) {}
  ~WorkerSampler() { Stop(); }
  WorkerSampler(const WorkerSampler&) = delete;
  WorkerSampler& operator=(const WorkerSampler&) = delete;

  void Start();
  WorkerSamples Stop();

 private:
  const std::chrono::microseconds period_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  WorkerSamples result_;  // written by thread_ only, read after joining it
};

}  // namespace tutti::bench

#endif  // TUTTI_BENCH_WORKER_SAMPLER_H_

#include "bench/worker_sampler.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

namespace tutti::bench {

bool ParseTaskStat(const std::string& stat, std::string* comm, char* state) {
  // "<tid> (<comm>) <state> ...": the command may hold spaces and parentheses, so it runs to
  // the last ')'.
  const size_t open = stat.find('(');
  const size_t close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open ||
      close + 2 >= stat.size()) {
    return false;
  }
  *comm = stat.substr(open + 1, close - open - 1);
  *state = stat[close + 2];
  return true;
}

namespace {

// The stat line of a task, or "" when the task is gone (an io_uring worker that exits between the
// directory listing and the read: the read fails with ESRCH, which an ifstream turns into an
// exception from underflow).
std::string ReadTaskStat(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof(buf));
  close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

}  // namespace

void CountWorkers(uint32_t* alive, uint32_t* runnable) {
  *alive = *runnable = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string stat = ReadTaskStat(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string comm;
    char state;
    if (!ParseTaskStat(stat, &comm, &state) || comm.rfind("iou-wrk", 0) != 0) continue;
    ++*alive;
    if (state == 'R') ++*runnable;
  }
  closedir(dir);
}

void WorkerSampler::Start() {
  Stop();
  result_ = {};
  stop_.store(false);
  thread_ = std::thread([this] {
    uint64_t sum = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
      uint32_t alive, runnable;
      CountWorkers(&alive, &runnable);
      ++result_.samples;
      sum += runnable;
      result_.max_runnable = std::max(result_.max_runnable, runnable);
      result_.workers_seen = std::max(result_.workers_seen, alive);
      std::this_thread::sleep_for(period_);
    }
    result_.mean_runnable = result_.samples ? double(sum) / double(result_.samples) : 0;
  });
}

WorkerSamples WorkerSampler::Stop() {
  if (!thread_.joinable()) return result_;
  stop_.store(true);
  thread_.join();
  return result_;
}

}  // namespace tutti::bench

// Reads of pool files on tmpfs done by threads of tuttid's own (pread), instead of io_uring's
// workers (UringOptions::memory_read_threads).
//
// A read from tmpfs is a memory copy that never blocks. io_uring hands such reads to its workers,
// and each read then waits for a worker to be woken and for the ring's thread to be woken for its
// completion. Here a fixed set of threads take reads from one queue, oldest first, and copy them
// with pread one after another: a thread that finds reads queued goes on without sleeping, so as
// many copies run at once as there are threads, and none waits for a wake-up while others queue.
//
// Each read's `finish` runs on the pool thread that did it, once its `req->result` is set (the
// bytes read, a short count at end of file, or -errno).
//
// Thread-safety: Post may be called from any thread, concurrently. Lifetime: destroying the pool
// does every read posted before, runs each `finish`, then joins the threads; every fd and buffer
// must stay valid until its read's `finish` has run.
#ifndef TUTTI_DAEMON_IO_MEMORY_READ_POOL_H_
#define TUTTI_DAEMON_IO_MEMORY_READ_POOL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/io/io_backend.h"

namespace tutti::io {

class MemoryReadPool {
 public:
  using Finish = void (*)(void* arg);

  // `threads` in [1, 64], named "<name>-<k>" (at most 15 bytes kept). INVALID_ARGUMENT for a
  // count out of range; INTERNAL if a thread cannot be started.
  static absl::StatusOr<std::unique_ptr<MemoryReadPool>> Create(uint32_t threads,
                                                                const std::string& name);
  ~MemoryReadPool();

  // Queues the read `req` (op kRead; already checked for alignment and bounds) of `fd`.
  void Post(int fd, IoRequest* req, Finish finish, void* arg);

  uint32_t threads() const { return static_cast<uint32_t>(threads_.size()); }
  // Reads done, and the most that were being copied at once since creation.
  uint64_t reads() const { return reads_.load(std::memory_order_relaxed); }
  uint32_t most_at_once() const { return most_at_once_.load(std::memory_order_relaxed); }

 private:
  struct Item {
    int fd;
    IoRequest* req;
    Finish finish;
    void* arg;
  };
  MemoryReadPool() = default;
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }
  void Run();
  static void Read(const Item& item);

  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint32_t> copying_{0};
  std::atomic<uint64_t> reads_{0};
  std::atomic<uint32_t> most_at_once_{0};
  std::vector<std::thread> threads_;
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_MEMORY_READ_POOL_H_

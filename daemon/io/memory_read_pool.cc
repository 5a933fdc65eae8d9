#include "daemon/io/memory_read_pool.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tutti::io {

absl::StatusOr<std::unique_ptr<MemoryReadPool>> MemoryReadPool::Create(uint32_t threads,
                                                                       const std::string& name) {
  if (threads < 1 || threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("io.memory_read_threads must be in [0, 64], got ", threads));
  }
  std::unique_ptr<MemoryReadPool> pool(new MemoryReadPool);
  for (uint32_t k = 0; k < threads; ++k) {
    try {
      pool->threads_.emplace_back([p = pool.get()] { p->Run(); });
    } catch (const std::system_error& e) {  // the destructor joins those started
      return absl::InternalError(absl::StrCat("starting memory read thread ", k, ": ", e.what()));
    }
    const std::string thread_name = absl::StrCat(name, "-", k).substr(0, 15);
    pthread_setname_np(pool->threads_.back().native_handle(), thread_name.c_str());
  }
  return pool;
}

MemoryReadPool::~MemoryReadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void MemoryReadPool::Post(int fd, IoRequest* req, Finish finish, void* arg) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Item{fd, req, finish, arg});
}

// Reads the whole request: pread may copy less than asked only at end of file (or when a signal
// interrupts it), so it goes on from there until the request is whole, the file ends or it fails.
void MemoryReadPool::Read(const Item& item) {
  IoRequest& r = *item.req;
  uint8_t* buf = static_cast<uint8_t*>(r.buf);
  uint32_t done = 0;
  while (done < r.len) {
    const ssize_t n = pread(item.fd, buf + done, r.len - done, static_cast<off_t>(r.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      r.result = -errno;
      return;
    }
    if (n == 0) break;  // end of file: a short read
    done += static_cast<uint32_t>(n);
  }
  r.result = done;
}

void MemoryReadPool::Run() {
  for (;;) {
    Item item;
    {
      absl::MutexLock lock(&mu_, absl::Condition(this, &MemoryReadPool::Ready));
      if (queue_.empty()) return;  // stopping, and nothing left
      item = queue_.front();
      queue_.pop_front();
    }
    const uint32_t now = copying_.fetch_add(1, std::memory_order_relaxed) + 1;
    uint32_t most = most_at_once_.load(std::memory_order_relaxed);
    while (now > most && !most_at_once_.compare_exchange_weak(most, now)) {
    }
    Read(item);
    copying_.fetch_sub(1, std::memory_order_relaxed);
    reads_.fetch_add(1, std::memory_order_relaxed);
    item.finish(item.arg);
  }
}

}  // namespace tutti::io

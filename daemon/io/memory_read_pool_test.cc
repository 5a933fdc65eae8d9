#include "daemon/io/memory_read_pool.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/io/aligned_buffer.h"
#include "gtest/gtest.h"

namespace tutti::io {
namespace {

constexpr uint32_t kChunk = 64 << 10;
constexpr uint32_t kChunks = 64;

// A file of kChunks x kChunk bytes, byte i = (i * 131 + i / 4096) & 0xff, opened for reading.
class MemoryReadPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    path_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/pool-XXXXXX";
    fd_ = mkstemp(path_.data());
    ASSERT_GE(fd_, 0) << std::strerror(errno);
    std::vector<uint8_t> bytes(uint64_t{kChunks} * kChunk);
    for (uint64_t i = 0; i < bytes.size(); ++i) bytes[i] = Byte(i);
    ASSERT_EQ(pwrite(fd_, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }
  void TearDown() override {
    if (fd_ >= 0) close(fd_);
    unlink(path_.c_str());
  }
  static uint8_t Byte(uint64_t i) { return static_cast<uint8_t>(i * 131 + i / 4096); }
  static bool Right(const uint8_t* buf, uint64_t offset, uint32_t len) {
    for (uint32_t i = 0; i < len; ++i) {
      if (buf[i] != Byte(offset + i)) return false;
    }
    return true;
  }

  std::string path_;
  int fd_ = -1;
};

struct Counted {
  std::atomic<int> finished{0};
};
void CountFinish(void* arg) { static_cast<Counted*>(arg)->finished.fetch_add(1); }

// Every read lands whole and right, its result the bytes read, and destroying the pool right
// after the posts still does them all and runs every finish.
TEST_F(MemoryReadPoolTest, ReadsLandWholeAndDestroyingDoesThemAll) {
  AlignedBuffer mem(uint64_t{kChunks} * kChunk);
  std::vector<IoRequest> reqs(kChunks);
  Counted counted;
  {
    auto pool = MemoryReadPool::Create(4, "test-mrd");
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ((*pool)->threads(), 4u);
    for (uint32_t k = 0; k < kChunks; ++k) {
      // Backwards, so no read is at the offset of its place in the queue.
      const uint64_t off = uint64_t{kChunks - 1 - k} * kChunk;
      reqs[k] = IoRequest{Op::kRead, 0, off, mem.data() + k * uint64_t{kChunk}, kChunk};
      (*pool)->Post(fd_, &reqs[k], CountFinish, &counted);
    }
  }
  EXPECT_EQ(counted.finished.load(), static_cast<int>(kChunks));
  for (const IoRequest& r : reqs) {
    ASSERT_EQ(r.result, kChunk) << r.offset;
    ASSERT_TRUE(Right(static_cast<uint8_t*>(r.buf), r.offset, kChunk)) << r.offset;
  }
}

// A read past the end of the file comes back short (the bytes there were), one of a bad
// descriptor with -EBADF; each still finishes.
TEST_F(MemoryReadPoolTest, ShortAndFailedReadsSayWhat) {
  AlignedBuffer mem(2 * kChunk);
  const uint64_t end = uint64_t{kChunks} * kChunk;
  IoRequest tail{Op::kRead, 0, end - 4096, mem.data(), kChunk};
  IoRequest bad{Op::kRead, 0, 0, mem.data() + kChunk, kChunk};
  Counted counted;
  {
    auto pool = MemoryReadPool::Create(2, "test-mrd");
    ASSERT_TRUE(pool.ok()) << pool.status();
    (*pool)->Post(fd_, &tail, CountFinish, &counted);
    (*pool)->Post(-1, &bad, CountFinish, &counted);
  }
  EXPECT_EQ(counted.finished.load(), 2);
  EXPECT_EQ(tail.result, 4096);
  EXPECT_TRUE(Right(mem.data(), end - 4096, 4096));
  EXPECT_EQ(bad.result, -EBADF);
}

// Two threads copy at once: the first read's finish holds its thread until the second read has
// finished, which only another thread can do (with one thread this waits out its 10 s and fails).
TEST_F(MemoryReadPoolTest, ThreadsReadAtOnce) {
  AlignedBuffer mem(2 * kChunk);
  IoRequest first{Op::kRead, 0, 0, mem.data(), kChunk};
  IoRequest second{Op::kRead, 0, kChunk, mem.data() + kChunk, kChunk};
  struct Latch {
    absl::Notification second_done;
    bool waited_out = false;
  } latch;
  auto pool = MemoryReadPool::Create(2, "test-mrd");
  ASSERT_TRUE(pool.ok()) << pool.status();
  (*pool)->Post(
      fd_, &first,
      [](void* arg) {
        auto* l = static_cast<Latch*>(arg);
        l->waited_out = !l->second_done.WaitForNotificationWithTimeout(absl::Seconds(10));
      },
      &latch);
  (*pool)->Post(
      fd_, &second, [](void* arg) { static_cast<Latch*>(arg)->second_done.Notify(); }, &latch);
  pool->reset();  // joins: both finished
  EXPECT_FALSE(latch.waited_out);
  EXPECT_TRUE(Right(mem.data(), 0, 2 * kChunk));
}

TEST(MemoryReadPoolCreate, RefusesCountsOutOfRange) {
  for (uint32_t bad : {0u, 65u}) {
    auto pool = MemoryReadPool::Create(bad, "test-mrd");
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(pool.status().message().find("io.memory_read_threads"), std::string::npos);
  }
}

}  // namespace
}  // namespace tutti::io

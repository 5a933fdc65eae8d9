#include "daemon/engine/fault_guard.h"

#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::engine {
namespace {

constexpr size_t kLen = 1 << 20;

// A shared mapping of a memory file that the test, playing the engine, can shrink.
class File {
 public:
  File() {
    fd_ = memfd_create("fault_guard_test", MFD_CLOEXEC);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, kLen), 0);
    base_ = static_cast<uint8_t*>(
        mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    EXPECT_NE(base_, MAP_FAILED);
    std::memset(base_, 0x5a, kLen);
  }
  ~File() {
    munmap(base_, kLen);
    close(fd_);
  }
  void Shrink() { ASSERT_EQ(ftruncate(fd_, 0), 0); }
  uint8_t* base() { return base_; }

 private:
  int fd_ = -1;
  uint8_t* base_ = nullptr;
};

TEST(FaultGuardTest, CopiesBothWaysWhileTheFileIsWhole) {
  ASSERT_TRUE(InstallFaultGuard().ok());
  File f;
  GuardedRange range(f.base(), kLen);
  std::vector<uint8_t> buf(kLen);
  ASSERT_TRUE(GuardedCopy(range, buf.data(), f.base(), kLen));
  EXPECT_EQ(buf, std::vector<uint8_t>(kLen, 0x5a));
  std::memset(buf.data(), 0x11, kLen);
  ASSERT_TRUE(GuardedCopy(range, f.base() + 4096, buf.data(), 4096));
  EXPECT_EQ(f.base()[4096], 0x11);
  EXPECT_EQ(f.base()[8191], 0x11);
  EXPECT_EQ(f.base()[8192], 0x5a);
  EXPECT_FALSE(range.faulted());
}

TEST(FaultGuardTest, ShrunkFileFailsTheCopyAndEveryLaterOneInsteadOfKilling) {
  ASSERT_TRUE(InstallFaultGuard().ok());
  File f;
  GuardedRange range(f.base(), kLen);
  f.Shrink();
  std::vector<uint8_t> buf(kLen, 0);
  EXPECT_FALSE(GuardedCopy(range, buf.data(), f.base(), kLen));  // read: SIGBUS caught
  EXPECT_TRUE(range.faulted());
  EXPECT_FALSE(GuardedCopy(range, f.base(), buf.data(), 64));  // and later writes refuse
}

TEST(FaultGuardTest, WriteIntoAShrunkFileIsCaughtToo) {
  ASSERT_TRUE(InstallFaultGuard().ok());
  File f;
  GuardedRange range(f.base(), kLen);
  f.Shrink();
  std::vector<uint8_t> buf(4096, 1);
  EXPECT_FALSE(GuardedCopy(range, f.base() + kLen - 4096, buf.data(), buf.size()));
  EXPECT_TRUE(range.faulted());
}

TEST(FaultGuardDeathTest, AFaultOutsideAGuardedCopyStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (!InstallFaultGuard().ok()) _exit(3);
        File f;
        GuardedRange range(f.base(), kLen);  // known, but not being copied over
        f.Shrink();
        volatile uint8_t v = f.base()[0];
        (void)v;
        _exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

}  // namespace
}  // namespace tutti::engine

#include "common/shm_region.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace tutti {
namespace {

bool NameExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(ShmRegionTest, CreateMapsAndDestructorUnlinks) {
  std::string name;
  {
    auto r = ShmRegion::Create("tutti-test", 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status();
    name = (*r)->name();
    EXPECT_EQ(name[0], '/');
    EXPECT_EQ(name.find('/', 1), std::string::npos);
    EXPECT_EQ((*r)->size(), 1u << 20);
    EXPECT_EQ((*r)->data()[12345], 0);
    (*r)->data()[12345] = 42;
    // Another mapping of the same name sees the write: it is shared memory.
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    void* p = mmap(nullptr, 1 << 20, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(p, MAP_FAILED);
    EXPECT_EQ(static_cast<uint8_t*>(p)[12345], 42);
    munmap(p, 1 << 20);
    EXPECT_TRUE(NameExists(name));
  }
  EXPECT_FALSE(NameExists(name));
}

TEST(ShmRegionTest, UnlinkKeepsMapping) {
  auto r = ShmRegion::Create("tutti-test", 4096);
  ASSERT_TRUE(r.ok());
  (*r)->Unlink();
  EXPECT_FALSE((*r)->linked());
  EXPECT_FALSE(NameExists((*r)->name()));
  (*r)->data()[0] = 1;  // still mapped
  (*r)->Unlink();       // idempotent
}

TEST(ShmRegionTest, NamesAreUnique) {
  auto a = ShmRegion::Create("tutti-test", 4096);
  auto b = ShmRegion::Create("tutti-test", 4096);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->name(), (*b)->name());
}

TEST(ShmRegionTest, BadArguments) {
  EXPECT_EQ(ShmRegion::Create("", 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Create("a/b", 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::Create("ok", 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShmRegionTest, SignalRemovesName) {
  // A child creates a region, then dies of SIGTERM: its handler must remove the name.
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ShmRegion::UnlinkOnFatalSignals();
    auto r = ShmRegion::Create("tutti-sig", 4096);
    if (!r.ok()) _exit(3);
    const std::string& n = (*r)->name();
    if (write(pipefd[1], n.data(), n.size()) != static_cast<ssize_t>(n.size())) _exit(4);
    close(pipefd[1]);
    for (;;) pause();
  }
  close(pipefd[1]);
  char buf[256];
  const ssize_t len = read(pipefd[0], buf, sizeof(buf));
  close(pipefd[0]);
  ASSERT_GT(len, 0);
  const std::string name(buf, len);
  EXPECT_TRUE(NameExists(name));
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_FALSE(NameExists(name));
}

}  // namespace
}  // namespace tutti

#include "common/file_system.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/fault_file_system.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

namespace fs = std::filesystem;

class FileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* t = std::getenv("TEST_TMPDIR");
    std::string tmpl = absl::StrCat(t != nullptr ? t : "/tmp", "/fs-XXXXXX");
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

void ExpectErrno(const absl::Status& s, int err, const std::string& what) {
  EXPECT_EQ(ErrnoOf(s), err) << s;
  EXPECT_EQ(s.code(),
            err == ENOSPC ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal)
      << s;
  EXPECT_EQ(s.message(), absl::StrCat(what, ": ", std::strerror(err)));
}

TEST_F(FileSystemTest, ErrnoStatusMapsENOSPCAndCarriesTheErrno) {
  ExpectErrno(ErrnoStatus("write /x", ENOSPC), ENOSPC, "write /x");
  ExpectErrno(ErrnoStatus("fdatasync /x", EIO), EIO, "fdatasync /x");
  EXPECT_EQ(ErrnoOf(absl::OkStatus()), 0);
  EXPECT_EQ(ErrnoOf(absl::InternalError("no errno")), 0);
}

TEST_F(FileSystemTest, PosixCreateAppendSyncReadBack) {
  FileSystem& posix = *PosixFileSystem();
  auto f = posix.Create(Path("a"), FileSystem::CreateMode::kExclusive);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Append("hello ").ok());
  ASSERT_TRUE((*f)->Append("world").ok());
  ASSERT_TRUE((*f)->Sync().ok());
  auto info = (*f)->Stat();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, 11u);
  EXPECT_EQ(info->nlink, 1u);
  EXPECT_EQ(*ReadFileToString(posix, Path("a")), "hello world");
  // Exclusive creation refuses an existing name; truncation empties it.
  ExpectErrno(posix.Create(Path("a"), FileSystem::CreateMode::kExclusive).status(), EEXIST,
              "create " + Path("a"));
  auto t = posix.Create(Path("a"), FileSystem::CreateMode::kTruncate);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Append("x").ok());
  EXPECT_EQ(*ReadFileToString(posix, Path("a")), "x");
  // Unlinked while open: nlink 0.
  ASSERT_TRUE(posix.Unlink(Path("a")).ok());
  EXPECT_EQ((*t)->Stat()->nlink, 0u);
}

TEST_F(FileSystemTest, PosixDirectoryOperations) {
  FileSystem& posix = *PosixFileSystem();
  for (const char* name : {"b", "a"}) {
    ASSERT_TRUE(posix.Create(Path(name), FileSystem::CreateMode::kTruncate).ok());
  }
  auto names = posix.ListDir(dir_);
  ASSERT_TRUE(names.ok()) << names.status();
  std::sort(names->begin(), names->end());
  EXPECT_EQ(*names, (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(posix.Rename(Path("a"), Path("b")).ok());
  ASSERT_TRUE(posix.SyncDir(dir_).ok());
  EXPECT_FALSE(fs::exists(Path("a")));
  auto st = posix.Stat(dir_);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->is_dir);
  EXPECT_FALSE(posix.Stat(Path("b"))->is_dir);
  ExpectErrno(posix.Stat(Path("a")).status(), ENOENT, "stat " + Path("a"));
  ExpectErrno(posix.Unlink(Path("a")), ENOENT, "unlink " + Path("a"));
  ExpectErrno(posix.Rename(Path("a"), Path("c")), ENOENT,
              absl::StrCat("rename ", Path("a"), " to ", Path("c")));
  ExpectErrno(posix.OpenForRead(Path("a")).status(), ENOENT, "open " + Path("a"));
  ExpectErrno(posix.ListDir(Path("none")).status(), ENOENT, "open dir " + Path("none"));
  ExpectErrno(posix.SyncDir(Path("none")), ENOENT, "open " + Path("none"));
}

TEST_F(FileSystemTest, PosixLockIsExclusiveAndKeepsTheHoldersContent) {
  FileSystem& posix = *PosixFileSystem();
  auto held = posix.Lock(Path("lock"), "123\n");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(*ReadFileToString(posix, Path("lock")), "123\n");
  auto second = posix.Lock(Path("lock"), "456\n");
  ExpectErrno(second.status(), EWOULDBLOCK, "flock " + Path("lock"));
  EXPECT_EQ(*ReadFileToString(posix, Path("lock")), "123\n");
  held->reset();
  auto third = posix.Lock(Path("lock"), "7\n");
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(*ReadFileToString(posix, Path("lock")), "7\n");
}

// A write the kernel cuts short (here at the file size limit) is continued; the write after it
// fails with the errno, leaving the prefix in the file.
TEST_F(FileSystemTest, PosixAppendContinuesShortWritesAndReportsTheError) {
  auto f = PosixFileSystem()->Create(Path("big"), FileSystem::CreateMode::kExclusive);
  ASSERT_TRUE(f.ok());
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 100;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status s = (*f)->Append(std::string(300, 'x'));
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, SIG_DFL);
  ExpectErrno(s, EFBIG, "write " + Path("big"));
  EXPECT_EQ(fs::file_size(Path("big")), 100u);
}

TEST_F(FileSystemTest, FaultFailsTheNthMatchingCallWithItsErrno) {
  FaultFileSystem faulty;
  faulty.Inject(FaultFileSystem::Fail(FaultFileSystem::Op::kSync, EIO).On("j.").Skip(1));
  auto other = faulty.Create(Path("other"), FileSystem::CreateMode::kExclusive);
  auto f = faulty.Create(Path("j.1"), FileSystem::CreateMode::kExclusive);
  ASSERT_TRUE(f.ok() && other.ok());
  EXPECT_TRUE((*other)->Sync().ok()) << "another path does not count";
  EXPECT_TRUE((*f)->Sync().ok()) << "skipped";
  ExpectErrno((*f)->Sync(), EIO, "fdatasync " + Path("j.1"));
  EXPECT_TRUE((*f)->Sync().ok()) << "fails once";
  EXPECT_EQ(faulty.calls(FaultFileSystem::Op::kSync), 4);
  EXPECT_EQ(faulty.failures(), 1);

  faulty.Inject(FaultFileSystem::Fail(FaultFileSystem::Op::kRename, EXDEV).Always());
  for (int i = 0; i < 3; ++i) {
    ExpectErrno(faulty.Rename(Path("j.1"), Path("j.2")), EXDEV, "rename " + Path("j.1"));
  }
  faulty.Clear();
  EXPECT_TRUE(faulty.Rename(Path("j.1"), Path("j.2")).ok());
  EXPECT_TRUE(fs::exists(Path("j.2")));
}

TEST_F(FileSystemTest, FaultShortWriteLeavesAPrefix) {
  FaultFileSystem faulty;
  auto f = faulty.Create(Path("f"), FileSystem::CreateMode::kExclusive);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append("0123").ok());
  faulty.Inject(FaultFileSystem::Fail(FaultFileSystem::Op::kAppend, ENOSPC).ShortWrite(3));
  ExpectErrno((*f)->Append("abcdef"), ENOSPC, "write " + Path("f"));
  EXPECT_EQ(*ReadFileToString(faulty, Path("f")), "0123abc");
  ASSERT_TRUE((*f)->Append("Z").ok());
  EXPECT_EQ(*ReadFileToString(*PosixFileSystem(), Path("f")), "0123abcZ");
}

}  // namespace
}  // namespace tutti

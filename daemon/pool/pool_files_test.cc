#include "daemon/pool/pool_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/fault_file_system.h"
#include "common/file_system.h"
#include "daemon/io/test_util.h"
#include "daemon/pool/endian.h"
#include "gtest/gtest.h"
#include "xxhash.h"

namespace tutti::pool {
namespace {

PoolLayout Layout(uint32_t files, uint32_t object_bytes = 65536, uint64_t per_file = 4 << 20,
                  uint32_t extent_slots = 0) {
  auto l = PoolLayout::Compute(per_file * files, files, object_bytes, 4, extent_slots);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

// Rewrites the superblock of `path` through `edit` (given the 4 KiB page), checksum updated.
void EditSuperblock(const std::string& path, const std::function<void(uint8_t*)>& edit) {
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  uint8_t page[4096];
  ASSERT_EQ(pread(fd, page, sizeof page, 0), 4096);
  edit(page);
  internal::Put64(page + 4088, XXH3_64bits(page, 4088));
  ASSERT_EQ(pwrite(fd, page, sizeof page, 0), 4096);
  close(fd);
}

bool Contains(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

class PoolFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    root_ = io::testing::MakeODirectDir("pool", &why);
    if (root_.empty()) GTEST_SKIP() << why;
  }
  void TearDown() override {
    if (!root_.empty()) io::testing::RemoveTree(root_);
  }

  // Creates (if needed) and returns directories root/<names...>.
  std::vector<std::string> Dirs(const std::vector<std::string>& names) {
    std::vector<std::string> out;
    for (const auto& n : names) {
      out.push_back(root_ + "/" + n);
      mkdir(out.back().c_str(), 0700);
    }
    return out;
  }

  std::string root_;
};

TEST_F(PoolFilesTest, CreatesPreallocatedFilesWithSuperblocks) {
  const auto dirs = Dirs({"a", "b"});
  const PoolLayout layout = Layout(2);
  std::map<std::string, uint64_t> last_progress;
  auto pool =
      OpenOrCreatePool(dirs, layout, [&](const std::string& path, uint64_t done, uint64_t total) {
        EXPECT_EQ(total, layout.file_bytes());
        last_progress[path] = done;
      });
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE(pool->created);
  ASSERT_EQ(pool->fds.size(), 2u);
  EXPECT_EQ(pool->paths[1], dirs[1] + "/tutti.pool");
  EXPECT_EQ(pool->UuidHex().size(), 32u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(fcntl(pool->fds[i], F_GETFL) & O_DIRECT, 0);
    struct stat st;
    ASSERT_EQ(fstat(pool->fds[i], &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), layout.file_bytes());
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, layout.file_bytes()) << "preallocated";
    EXPECT_EQ(last_progress[dirs[i] + "/tutti.pool.tmp"], layout.file_bytes());
    char magic[8];
    FILE* f = fopen(pool->paths[i].c_str(), "rb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(fread(magic, 1, 8, f), 8u);
    fclose(f);
    EXPECT_EQ(std::string(magic, 8), "TUTTIPOL");
  }
}

TEST_F(PoolFilesTest, ReopensTheSamePoolAndLocksIt) {
  const auto dirs = Dirs({"a", "b", "c"});
  std::string uuid;
  {
    auto pool = OpenOrCreatePool(dirs, Layout(3));
    ASSERT_TRUE(pool.ok()) << pool.status();
    uuid = pool->UuidHex();
    auto second = OpenOrCreatePool(dirs, Layout(3), nullptr, absl::Milliseconds(50));
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(second.status(), "in use")) << second.status();
  }
  auto again = OpenOrCreatePool(dirs, Layout(3));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->UuidHex(), uuid);
  std::vector<int> fds = again->TakeFds();
  EXPECT_EQ(fds.size(), 3u);
  EXPECT_TRUE(again->fds.empty());
  for (int fd : fds) close(fd);
}

TEST_F(PoolFilesTest, WaitsForAPreviousOwnerToLetGo) {
  const auto dirs = Dirs({"a"});
  auto first = OpenOrCreatePool(dirs, Layout(1));
  ASSERT_TRUE(first.ok()) << first.status();
  std::thread release([&] {
    absl::SleepFor(absl::Milliseconds(100));
    first = absl::StatusOr<PoolFiles>(PoolFiles());  // closes the fds: the lock goes
  });
  auto second = OpenOrCreatePool(dirs, Layout(1), nullptr, absl::Seconds(10));
  release.join();
  EXPECT_TRUE(second.ok()) << second.status();
}

TEST_F(PoolFilesTest, LayoutMismatchSaysWhatDiffersAndWhatToDo) {
  const auto dirs = Dirs({"a", "b"});
  ASSERT_TRUE(OpenOrCreatePool(dirs, Layout(2, 65536)).ok());
  auto other = OpenOrCreatePool(dirs, Layout(2, 32768));
  ASSERT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(other.status(), "object_bytes: pool 65536, configuration 32768"))
      << other.status();
  EXPECT_TRUE(Contains(other.status(), "move the pool files away")) << other.status();
  auto bigger = OpenOrCreatePool(dirs, Layout(2, 65536, 8 << 20));
  ASSERT_EQ(bigger.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(bigger.status(), "file_bytes: pool")) << bigger.status();
}

TEST_F(PoolFilesTest, ExtentSlotsAreStoredAndAMismatchIsRefused) {
  const auto dirs = Dirs({"a", "b"});
  // 7 MiB of frames per file, 4 x 4 KiB per slot: 224 extents of G = 2 or 112 of G = 4, the
  // same slots and file size; only the extents differ.
  const PoolLayout two = Layout(2, 4096, 8 << 20, 2);
  const PoolLayout four = Layout(2, 4096, 8 << 20, 4);
  ASSERT_EQ(two.extent_slots(), 2u);
  ASSERT_EQ(four.extent_slots(), 4u);
  ASSERT_EQ(two.num_slots(), four.num_slots());
  ASSERT_EQ(two.file_bytes(), four.file_bytes());
  ASSERT_TRUE(OpenOrCreatePool(dirs, two).ok());
  FILE* f = fopen((dirs[1] + "/tutti.pool").c_str(), "rb");
  ASSERT_NE(f, nullptr);
  uint8_t page[32];
  ASSERT_EQ(fread(page, 1, sizeof page, f), sizeof page);
  fclose(f);
  EXPECT_EQ(internal::Get32(page + 8), 2u) << "format version";
  EXPECT_EQ(internal::Get32(page + 28), 2u) << "extent slots at offset 28";
  auto other = OpenOrCreatePool(dirs, four);
  ASSERT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(other.status(), "extent_slots: pool 2, configuration 4")) << other.status();
  EXPECT_TRUE(Contains(other.status(), "pool.extent_slots")) << other.status();
  EXPECT_TRUE(OpenOrCreatePool(dirs, two).ok());
}

TEST_F(PoolFilesTest, FormatOnePoolIsRefusedWithWhatToDo) {
  const auto dirs = Dirs({"a"});
  ASSERT_TRUE(OpenOrCreatePool(dirs, Layout(1)).ok());
  const std::string path = dirs[0] + "/tutti.pool";
  // A format-1 superblock: version 1, offset 28 reserved (0), valid checksum.
  EditSuperblock(path, [](uint8_t* p) {
    internal::Put32(p + 8, 1);
    internal::Put32(p + 28, 0);
  });
  auto pool = OpenOrCreatePool(dirs, Layout(1));
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition) << pool.status();
  for (const char* text : {path.c_str(), "format version 1", "per-slot layout", "journal",
                           "checkpoint", "move the pool files", "delete them",
                           "creates a version-2 pool", "cached blocks are lost"}) {
    EXPECT_TRUE(Contains(pool.status(), text)) << text << ": " << pool.status();
  }
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0) << "left in place";
  EditSuperblock(path, [](uint8_t* p) { internal::Put32(p + 8, 3); });
  pool = OpenOrCreatePool(dirs, Layout(1));
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition) << pool.status();
  EXPECT_TRUE(Contains(pool.status(), "format version 3")) << pool.status();
}

TEST_F(PoolFilesTest, ReorderedOrMixedDirectoriesAreRefused) {
  const auto ab = Dirs({"a", "b"});
  const auto cd = Dirs({"c", "d"});
  ASSERT_TRUE(OpenOrCreatePool(ab, Layout(2)).ok());
  ASSERT_TRUE(OpenOrCreatePool(cd, Layout(2)).ok());
  auto reordered = OpenOrCreatePool({ab[1], ab[0]}, Layout(2));
  ASSERT_EQ(reordered.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(reordered.status(), "restore the order of pool.dirs")) << reordered.status();
  auto mixed = OpenOrCreatePool({ab[0], cd[1]}, Layout(2));
  ASSERT_EQ(mixed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(mixed.status(), "mixes two pools")) << mixed.status();
}

TEST_F(PoolFilesTest, MissingFileIsRefusedNotRecreated) {
  const auto dirs = Dirs({"a", "b"});
  ASSERT_TRUE(OpenOrCreatePool(dirs, Layout(2)).ok());
  ASSERT_EQ(unlink((dirs[1] + "/tutti.pool").c_str()), 0);
  auto pool = OpenOrCreatePool(dirs, Layout(2));
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(pool.status(), dirs[1] + "/tutti.pool are missing")) << pool.status();
  struct stat st;
  EXPECT_NE(stat((dirs[1] + "/tutti.pool").c_str(), &st), 0);
}

TEST_F(PoolFilesTest, TruncatedFileGetsItsSizeBackAndTooShortForASuperblockIsDataLoss) {
  const auto dirs = Dirs({"a"});
  const PoolLayout layout = Layout(1);
  ASSERT_TRUE(OpenOrCreatePool(dirs, layout).ok());
  const std::string path = dirs[0] + "/tutti.pool";
  ASSERT_EQ(truncate(path.c_str(), 3 << 20), 0);
  auto pool = OpenOrCreatePool(dirs, layout);
  ASSERT_TRUE(pool.ok()) << pool.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), layout.file_bytes()) << "size restored";
  pool = absl::InternalError("closed");  // release the lock
  ASSERT_EQ(truncate(path.c_str(), layout.file_bytes() + (1 << 20)), 0);
  pool = OpenOrCreatePool(dirs, layout);
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), layout.file_bytes()) << "never above the cap";
  pool = absl::InternalError("closed");
  ASSERT_EQ(truncate(path.c_str(), 100), 0);
  EXPECT_EQ(OpenOrCreatePool(dirs, layout).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(PoolFilesTest, CorruptSuperblock) {
  const auto dirs = Dirs({"a"});
  ASSERT_TRUE(OpenOrCreatePool(dirs, Layout(1)).ok());
  const std::string path = dirs[0] + "/tutti.pool";
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "\x07", 1, 20), 1);  // inside object_bytes
  auto pool = OpenOrCreatePool(dirs, Layout(1));
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kDataLoss) << pool.status();
  ASSERT_EQ(pwrite(fd, "XXXX", 4, 0), 4);  // magic
  close(fd);
  pool = OpenOrCreatePool(dirs, Layout(1));
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition) << pool.status();
  EXPECT_TRUE(Contains(pool.status(), "not a tutti pool file")) << pool.status();
}

TEST_F(PoolFilesTest, BadDirectories) {
  const auto dirs = Dirs({"a", "b"});
  EXPECT_EQ(OpenOrCreatePool({dirs[0]}, Layout(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenOrCreatePool({dirs[0], dirs[0]}, Layout(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto missing = OpenOrCreatePool({dirs[0], root_ + "/nope"}, Layout(2));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(missing.status(), root_ + "/nope")) << missing.status();
  struct stat st;
  EXPECT_NE(stat((dirs[0] + "/tutti.pool").c_str(), &st), 0) << "nothing created";
}

TEST_F(PoolFilesTest, NoSpaceIsResourceExhaustedAndLeavesNothing) {
  const auto dirs = Dirs({"a"});
  auto huge = PoolLayout::Compute(1ull << 50, 1, 1 << 20, 64);  // 1 PiB
  ASSERT_TRUE(huge.ok());
  auto pool = OpenOrCreatePool(dirs, *huge);
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kResourceExhausted) << pool.status();
  EXPECT_TRUE(Contains(pool.status(), dirs[0])) << pool.status();
  EXPECT_TRUE(Contains(pool.status(), std::to_string(huge->file_bytes()))) << pool.status();
  struct stat st;
  EXPECT_NE(stat((dirs[0] + "/tutti.pool.tmp").c_str(), &st), 0);
  EXPECT_NE(stat((dirs[0] + "/tutti.pool").c_str(), &st), 0);
}

TEST_F(PoolFilesTest, FailingSyncOfANewPoolFileIsReportedWithItsErrnoAndLeavesNothing) {
  const auto dirs = Dirs({"a", "b"});
  FaultFileSystem faulty;
  faulty.Inject(FaultFileSystem::Fail(FaultFileSystem::Op::kFsync, EIO).On("b/tutti.pool"));
  auto pool = OpenOrCreatePool(dirs, Layout(2), nullptr, absl::Seconds(5), &faulty);
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kInternal) << pool.status();
  EXPECT_EQ(ErrnoOf(pool.status()), EIO);
  EXPECT_TRUE(Contains(pool.status(), "fsync " + dirs[1] + "/tutti.pool.tmp")) << pool.status();
  EXPECT_EQ(faulty.failures(), 1);
  struct stat st;
  for (const std::string& dir : dirs) {
    EXPECT_NE(stat((dir + "/tutti.pool").c_str(), &st), 0) << dir;
    EXPECT_NE(stat((dir + "/tutti.pool.tmp").c_str(), &st), 0) << dir;
  }
  pool = OpenOrCreatePool(dirs, Layout(2), nullptr, absl::Seconds(5), &faulty);  // fault spent
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE(pool->created);
}

TEST_F(PoolFilesTest, FailingSyncWhileRestoringASizeIsReportedAndLosesNothing) {
  const auto dirs = Dirs({"a"});
  const PoolLayout layout = Layout(1);
  std::string uuid;
  {
    auto pool = OpenOrCreatePool(dirs, layout);
    ASSERT_TRUE(pool.ok()) << pool.status();
    uuid = pool->UuidHex();
  }
  // A block's bytes in the first MiB, then the file truncated behind them.
  const std::string path = dirs[0] + "/tutti.pool";
  const std::string block(8192, 'k');
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, block.data(), block.size(), 1 << 20), static_cast<ssize_t>(block.size()));
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
  ASSERT_EQ(truncate(path.c_str(), 3 << 20), 0);
  FaultFileSystem faulty;
  faulty.Inject(FaultFileSystem::Fail(FaultFileSystem::Op::kFsync, ENOSPC).On("tutti.pool"));
  auto pool = OpenOrCreatePool(dirs, layout, nullptr, absl::Seconds(5), &faulty);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(ErrnoOf(pool.status()), ENOSPC) << pool.status();
  EXPECT_TRUE(Contains(pool.status(), "fsync " + path)) << pool.status();
  // The next start, with the disk well again, finds the same pool, the block's bytes in place.
  pool = OpenOrCreatePool(dirs, layout, nullptr, absl::Seconds(5), &faulty);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_FALSE(pool->created);
  EXPECT_EQ(pool->UuidHex(), uuid);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), layout.file_bytes());
  std::string back(block.size(), '\0');
  const int rfd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(rfd, 0);
  ASSERT_EQ(pread(rfd, back.data(), back.size(), 1 << 20), static_cast<ssize_t>(back.size()));
  close(rfd);
  EXPECT_EQ(back, block);
}

TEST_F(PoolFilesTest, InterruptedCreationIsFinishedOrCleanedUp) {
  const auto dirs = Dirs({"a", "b"});
  std::string uuid;
  {
    auto pool = OpenOrCreatePool(dirs, Layout(2));
    ASSERT_TRUE(pool.ok());
    uuid = pool->UuidHex();
  }
  // As if the creator died after renaming a's file but before renaming b's.
  ASSERT_EQ(rename((dirs[1] + "/tutti.pool").c_str(), (dirs[1] + "/tutti.pool.tmp").c_str()), 0);
  auto pool = OpenOrCreatePool(dirs, Layout(2));
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_FALSE(pool->created);
  EXPECT_EQ(pool->UuidHex(), uuid);
  pool = absl::StatusOr<PoolFiles>(PoolFiles());  // release the locks

  // As if the creator died before any rename: temporary files only; a fresh pool is made.
  const auto fresh = Dirs({"c", "d"});
  for (const auto& d : fresh) {
    FILE* f = fopen((d + "/tutti.pool.tmp").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    fputs("partial", f);
    fclose(f);
  }
  auto made = OpenOrCreatePool(fresh, Layout(2));
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_TRUE(made->created);
}

TEST_F(PoolFilesTest, FilesystemWithoutODirectIsExplained) {
  struct stat st;
  if (stat("/dev/shm", &st) != 0) GTEST_SKIP() << "no /dev/shm";
  char tmpl[] = "/dev/shm/tutti-pool-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) GTEST_SKIP() << "cannot write /dev/shm";
  const std::string dir = tmpl;
  auto pool = OpenOrCreatePool({dir}, Layout(1));
  io::testing::RemoveTree(dir);
  if (pool.ok()) GTEST_SKIP() << "/dev/shm accepts O_DIRECT here";
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition) << pool.status();
  EXPECT_TRUE(Contains(pool.status(), "O_DIRECT")) << pool.status();
}

}  // namespace
}  // namespace tutti::pool

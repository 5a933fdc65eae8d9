// A FileSystem for tests that fails chosen operations deterministically: the Nth append, fdatasync,
// rename, ... on a matching path fails with a chosen errno, and an append can first write part of
// its data (a short write, as on a full disk). Everything else goes through to a base FileSystem
// (POSIX by default), so the files on disk are real and recovery can read them back.
//
// A failure looks exactly like one of PosixFileSystem (common/file_system.h): "<op> <path>:
// <errno text>", RESOURCE_EXHAUSTED for ENOSPC and INTERNAL otherwise, the errno as payload.
//
// Thread-safety: thread-safe (the faults and counters sit under one lock; the base must be
// thread-safe too). The files it returns keep a pointer to it: it must outlive them.
#ifndef TUTTI_COMMON_FAULT_FILE_SYSTEM_H_
#define TUTTI_COMMON_FAULT_FILE_SYSTEM_H_

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/file_system.h"

namespace tutti {

class FaultFileSystem : public FileSystem {
 public:
  // Every operation of the seam; a file's operations count under the path it was opened with.
  enum class Op {
    kOpenForRead,
    kRead,
    kCreate,
    kAppend,
    kSync,      // WritableFile::Sync (fdatasync)
    kFileStat,  // WritableFile::Stat and DirectFile::Stat (fstat)
    kStat,
    kListDir,
    kRename,  // matched on `from`
    kUnlink,
    kSyncDir,
    kLock,        // FileSystem::Lock and DirectFile::TryLock
    kOpenDirect,  // FileSystem::OpenDirect
    kReadAt,      // DirectFile::ReadAt (pread)
    kWriteAt,     // DirectFile::WriteAt (pwrite)
    kAllocate,    // DirectFile::Allocate (fallocate)
    kTruncate,    // DirectFile::Truncate (ftruncate)
    kFsync,       // DirectFile::Sync (fsync)
    kFreeBytes,   // DirectFile::FreeBytes (fstatvfs)
  };
  // What to fail; built as Fail(Op::kSync, EIO).On("journal.").Skip(1).
  struct Fault {
    Op op = Op::kAppend;
    int err = EIO;
    // Only calls on a path containing this ("" matches every path).
    std::string path_contains;
    // Matching calls let through before the first failure: 0 fails the next one.
    int skip = 0;
    // Matching calls that fail from then on; a negative count fails every later one.
    int times = 1;
    // kAppend only: write the first `short_write` bytes of the data (all of it if shorter) before
    // failing: a short write, leaving a partial record at the file's end.
    size_t short_write = 0;

    Fault& On(std::string path_part) {
      path_contains = std::move(path_part);
      return *this;
    }
    Fault& Skip(int n) {
      skip = n;
      return *this;
    }
    Fault& Times(int n) {
      times = n;
      return *this;
    }
    Fault& Always() { return Times(-1); }
    Fault& ShortWrite(size_t bytes) {
      short_write = bytes;
      return *this;
    }
  };
  // The next call of `op` (on any path) fails with `err`.
  static Fault Fail(Op op, int err = EIO) {
    Fault f;
    f.op = op;
    f.err = err;
    return f;
  }

  explicit FaultFileSystem(FileSystem* base = PosixFileSystem()) : base_(base) {}

  // Adds a fault; faults are checked in the order added, the first that fires wins.
  void Inject(Fault fault);
  // Removes every fault (the counters stay).
  void Clear();
  // Calls of `op` seen so far (on every path), failed ones included.
  int calls(Op op) const;
  // Faults fired so far.
  int failures() const;

  absl::StatusOr<std::unique_ptr<SequentialFile>> OpenForRead(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> Create(const std::string& path,
                                                       CreateMode how) override;
  absl::StatusOr<std::unique_ptr<DirectFile>> OpenDirect(const std::string& path,
                                                         bool create) override;
  absl::StatusOr<FileInfo> Stat(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Unlink(const std::string& path) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path,
                                                 std::string_view content) override;

  // Counts a call of `op` on `path`; returns the error to fail it with (OK: go through). On a
  // failing kAppend, `*short_write` is how many bytes to write first. For the file wrappers.
  absl::Status Check(Op op, const std::string& path, size_t* short_write = nullptr);

 private:
  FileSystem* const base_;
  mutable absl::Mutex mu_;
  std::vector<Fault> faults_ ABSL_GUARDED_BY(mu_);
  std::map<Op, int> calls_ ABSL_GUARDED_BY(mu_);
  int failures_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_FAULT_FILE_SYSTEM_H_

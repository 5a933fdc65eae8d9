// The file-system seam (after LevelDB's Env): the few operations the store's journal needs on its
// state directory, and those that create, check and size the pool files (daemon/pool/pool_files.h),
// behind an interface, so that tests can fail any one of them deterministically
// (common/fault_file_system.h) instead of reaching for RLIMIT_FSIZE or a full disk. The default,
// PosixFileSystem(), is plain POSIX and what the daemon uses. The pool's data path (block reads
// and writes, and their syncs) is the I/O backends' (daemon/io), on descriptors this seam hands
// over (DirectFile::ReleaseFd).
//
// Error semantics (every implementation): a failed operation returns a status whose message names
// the operation and the path and ends in the errno text ("fdatasync /s/journal.3: Input/output
// error"); its code is RESOURCE_EXHAUSTED for ENOSPC and INTERNAL for any other errno (what the
// journal has always reported), and the errno itself rides along as a payload: ErrnoOf() reads
// it (ENOENT from Stat is how a caller tells "absent" from "unreadable"). EINTR is retried, never
// returned. Nothing here logs.
//
// Paths are passed through as given (no normalisation). Files are closed by their destructors;
// close errors are ignored (every durable write is followed by Sync, whose error counts).
//
// Thread-safety: a FileSystem is thread-safe. A file object is used by one thread at a time.
#ifndef TUTTI_COMMON_FILE_SYSTEM_H_
#define TUTTI_COMMON_FILE_SYSTEM_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti {

// The status for `what` (an operation and its path) failing with `err` (an errno): the code
// mapping above, the message "<what>: <strerror(err)>", `err` as the payload.
absl::Status ErrnoStatus(const std::string& what, int err);
// The errno a status of this seam carries; 0 for OK or a status without one.
int ErrnoOf(const absl::Status& status);

// What Stat reports.
struct FileInfo {
  uint64_t dev = 0, ino = 0;
  uint64_t nlink = 0;  // 0: the file was unlinked while open
  uint64_t size = 0;
  bool is_dir = false;
};

// A file opened for reading from its start.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to `n` bytes into `buf`; returns how many (fewer than asked is not an error; 0 at the
  // end of the file).
  virtual absl::StatusOr<size_t> Read(char* buf, size_t n) = 0;
};

// A file opened for appending.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Writes all of `data` at the end of the file (short writes are continued). On error a prefix of
  // `data` may have been written: the file may end in a partial record.
  virtual absl::Status Append(std::string_view data) = 0;
  // fdatasync: every byte appended so far is on stable storage. After an error the kernel may
  // have dropped dirty pages of this file: what it holds is unknown, so write nothing more to it.
  virtual absl::Status Sync() = 0;
  // fstat of the open file (nlink 0 once its name was removed).
  virtual absl::StatusOr<FileInfo> Stat() = 0;
};

// A file read and written at offsets, opened O_RDWR | O_DIRECT (a pool file): the buffers, offsets
// and lengths of ReadAt and WriteAt must be aligned to the logical block size (4 KiB is).
// Closed by its destructor unless its descriptor was handed over.
class DirectFile {
 public:
  virtual ~DirectFile() = default;
  // pread: up to `n` bytes at `offset` into `buf`; returns how many (fewer only at the end).
  virtual absl::StatusOr<size_t> ReadAt(uint64_t offset, void* buf, size_t n) = 0;
  // pwrite of all `n` bytes at `offset` (a short write fails with EIO).
  virtual absl::Status WriteAt(uint64_t offset, const void* buf, size_t n) = 0;
  // fallocate (mode 0) of [offset, offset + len): the blocks are reserved and the size grows to
  // cover them. EOPNOTSUPP where the filesystem cannot.
  virtual absl::Status Allocate(uint64_t offset, uint64_t len) = 0;
  // ftruncate to `size` bytes.
  virtual absl::Status Truncate(uint64_t size) = 0;
  // fsync: the data written and the size and allocation are on stable storage. After an error
  // what the file holds is unknown: the caller reports it and does not count on the file.
  virtual absl::Status Sync() = 0;
  // fstat of the open file.
  virtual absl::StatusOr<FileInfo> Stat() = 0;
  // Bytes free to unprivileged users on the file's filesystem (fstatvfs: f_bavail x f_frsize).
  virtual absl::StatusOr<uint64_t> FreeBytes() = 0;
  // flock(LOCK_EX | LOCK_NB), held as long as the descriptor is open (also once handed over).
  // Another open file holding it: errno EWOULDBLOCK.
  virtual absl::Status TryLock() = 0;
  // Hands the descriptor over, to a caller that closes it (an I/O backend needs a kernel file);
  // this object must not be used afterwards, but to be destroyed.
  virtual int ReleaseFd() = 0;
};

// A held lock on a file (flock); released when destroyed.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

class FileSystem {
 public:
  enum class CreateMode {
    kExclusive,  // O_CREAT | O_EXCL: fails (EEXIST) if the name exists
    kTruncate,   // O_CREAT | O_TRUNC: an existing file is emptied
  };

  virtual ~FileSystem() = default;

  virtual absl::StatusOr<std::unique_ptr<SequentialFile>> OpenForRead(const std::string& path) = 0;
  // Creates `path` (mode 0600 before the umask) for appending. Neither the file nor its directory
  // entry is durable until Sync and SyncDir of its directory.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> Create(const std::string& path,
                                                               CreateMode how) = 0;
  // Opens `path` O_RDWR | O_DIRECT; with `create` it is created (O_CREAT | O_EXCL, mode 0600
  // before the umask), else it must exist. EINVAL: the filesystem does not support O_DIRECT.
  virtual absl::StatusOr<std::unique_ptr<DirectFile>> OpenDirect(const std::string& path,
                                                                 bool create) = 0;
  // stat (follows symlinks).
  virtual absl::StatusOr<FileInfo> Stat(const std::string& path) = 0;
  // The names in `dir`, but "." and "..", in no particular order.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // rename(2): atomic replacement of `to`. Durable after SyncDir of the directory.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  virtual absl::Status Unlink(const std::string& path) = 0;
  // fsync of the directory: the entries created, renamed or removed in it are durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // Opens or creates `path` (0644) and takes flock(LOCK_EX | LOCK_NB) on it, then replaces its
  // content by `content` (the holder's pid, say). If another open file holds the lock: errno
  // EWOULDBLOCK, and the file is left as the holder wrote it.
  virtual absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path,
                                                         std::string_view content) = 0;
};

// The POSIX implementation; process-wide, never destroyed.
FileSystem* PosixFileSystem();

// Reads all of `path` through `fs`.
absl::StatusOr<std::string> ReadFileToString(FileSystem& fs, const std::string& path);

}  // namespace tutti

#endif  // TUTTI_COMMON_FILE_SYSTEM_H_

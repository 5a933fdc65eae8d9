// Creating and opening the pool files: one pre-allocated file "tutti.pool" per directory (one
// directory per SSD), each starting with a 4 KiB superblock. Format: daemon/pool/FORMAT.md.
//
// Thread-safety: OpenOrCreatePool is thread-compatible (call it once, at start-up). A PoolFiles is
// a plain value; it is not safe to use one from two threads at once.
#ifndef TUTTI_DAEMON_POOL_POOL_FILES_H_
#define TUTTI_DAEMON_POOL_POOL_FILES_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/file_system.h"
#include "daemon/pool/layout.h"

namespace tutti::pool {

inline constexpr char kPoolFileName[] = "tutti.pool";

// The open pool. Holds its fds until TakeFds(); closes any it still holds when destroyed.
struct PoolFiles {
  PoolFiles() = default;
  PoolFiles(PoolFiles&& other) noexcept;
  PoolFiles& operator=(PoolFiles&& other) noexcept;
  ~PoolFiles();

  // Hands the fds over (e.g. to io::CreateIoBackend); this object holds none afterwards.
  std::vector<int> TakeFds();
  // The uuid as 32 lowercase hex digits.
  std::string UuidHex() const;

  // Opened O_RDWR | O_DIRECT, in the order of the directories, each locked with flock(LOCK_EX) for
  // as long as the fd stays open (with whoever TakeFds handed it to), so a second daemon cannot
  // open the same pool. The lock covers the pool files only, not the store's state directory.
  std::vector<int> fds;
  std::vector<std::string> paths;
  std::array<uint8_t, 16> uuid{};  // shared by every file of the pool
  bool created = false;            // true if this call created the pool
};

// Called while files are pre-allocated: `done` of `total` bytes of `path` so far. May be null.
using ProgressFn = std::function<void(const std::string& path, uint64_t done, uint64_t total)>;

// Opens the pool in `dirs` (one file per directory, in this order), creating it if none of the
// directories has a pool file. `layout` must have dirs.size() files.
// Creation writes each file as "tutti.pool.tmp" (fallocate'd to layout.file_bytes(), superblock
// written and fsync'ed), then renames them all and fsyncs the directories; an interrupted creation
// is finished or cleaned up by the next call.
// Errors:
//  - INVALID_ARGUMENT: dirs empty, repeated, or not layout.num_files() of them.
//  - FAILED_PRECONDITION: a directory is missing; its filesystem lacks O_DIRECT; some directories
//    have a pool file and others not; a file is locked by another process; or the superblocks do
//    not match `layout` or each other (the message says which fields differ and what to do).
//  - RESOURCE_EXHAUSTED: a filesystem lacks the space to create a file (names the directory and
//    bytes needed) or to restore a truncated one.
//  - DATA_LOSS: a superblock is corrupt, or a file is too short to hold one.
//  - INTERNAL: another system call failed (with its errno text; ENOSPC from one is
//    RESOURCE_EXHAUSTED). Every error of a system call carries its errno (ErrnoOf,
//    common/file_system.h).
// A file whose superblock is intact but whose size differs from it (truncated or grown) is not an
// error: its size is restored (logged as an error); blocks in a lost tail then fail verification.
// A file locked by another process is retried for up to `lock_wait` first: a previous daemon that
// was just killed releases its lock only once the kernel has torn down its io_uring rings.
// Every file operation goes through `fs` (common/file_system.h; tests pass a FaultFileSystem),
// which must outlive the call; the fds it hands back are the kernel's.
absl::StatusOr<PoolFiles> OpenOrCreatePool(const std::vector<std::string>& dirs,
                                           const PoolLayout& layout,
                                           const ProgressFn& progress = nullptr,
                                           absl::Duration lock_wait = absl::Seconds(5),
                                           FileSystem* fs = PosixFileSystem());

}  // namespace tutti::pool

#endif  // TUTTI_DAEMON_POOL_POOL_FILES_H_

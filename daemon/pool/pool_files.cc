#include "daemon/pool/pool_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/pool/superblock.h"

namespace tutti::pool {
namespace {

constexpr char kTmpSuffix[] = ".tmp";
constexpr uint64_t kPreallocChunk = 1ull << 30;

absl::Status Errno(const std::string& what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

// Owns one fd until released.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ScopedFd(ScopedFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

absl::StatusOr<ScopedFd> OpenDirect(const std::string& path, int extra_flags) {
  const int fd = open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC | extra_flags, 0600);
  if (fd >= 0) return ScopedFd(fd);
  if (errno == EINVAL) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", path,
                     " with O_DIRECT: its filesystem does not support it (tmpfs?); "
                     "put the pool on a local disk filesystem such as ext4 or xfs"));
  }
  return Errno(absl::StrCat("open ", path), errno);
}

// Takes an exclusive flock on `fd`, retrying for up to `wait` while another process holds it.
absl::Status Lock(int fd, const std::string& path, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return Errno(absl::StrCat("flock ", path), errno);
    if (absl::Now() >= deadline) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is in use by another process (another tuttid on the same pool?)"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::OkStatus();
}

absl::StatusOr<Superblock> ReadSuperblock(int fd, const std::string& path) {
  io::AlignedBuffer page(kSuperblockBytes);
  const ssize_t n = pread(fd, page.data(), kSuperblockBytes, 0);
  if (n < 0) return Errno(absl::StrCat("read superblock of ", path), errno);
  if (n != static_cast<ssize_t>(kSuperblockBytes)) {
    return absl::DataLossError(absl::StrCat(path, " is ", n,
                                            " bytes: too short for a superblock "
                                            "(truncated); move the pool files away"));
  }
  return DecodeSuperblock(page.data(), path);
}

absl::Status WriteSuperblock(int fd, const Superblock& sb, const std::string& path) {
  io::AlignedBuffer page(kSuperblockBytes);
  EncodeSuperblock(sb, page.data());
  const ssize_t n = pwrite(fd, page.data(), kSuperblockBytes, 0);
  if (n != static_cast<ssize_t>(kSuperblockBytes)) {
    return Errno(absl::StrCat("write superblock of ", path), n < 0 ? errno : EIO);
  }
  if (fsync(fd) != 0) return Errno(absl::StrCat("fsync ", path), errno);
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  ScopedFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return Errno(absl::StrCat("open ", dir), errno);
  if (fsync(fd.get()) != 0) return Errno(absl::StrCat("fsync ", dir), errno);
  return absl::OkStatus();
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

absl::Status CheckSpace(int fd, const std::string& dir, uint64_t bytes) {
  struct statvfs vfs;
  if (fstatvfs(fd, &vfs) != 0) return Errno(absl::StrCat("statvfs ", dir), errno);
  const uint64_t avail = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  if (avail >= bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "pool dir ", dir, ": the pool file needs ", bytes, " bytes but the filesystem has ", avail,
      " free; free space there or lower pool.capacity_bytes"));
}

absl::Status Preallocate(int fd, const std::string& dir, const std::string& path, uint64_t total,
                         const ProgressFn& progress) {
  RETURN_IF_ERROR(CheckSpace(fd, dir, total));
  for (uint64_t off = 0; off < total; off += kPreallocChunk) {
    const uint64_t len = std::min(kPreallocChunk, total - off);
    if (fallocate(fd, 0, static_cast<off_t>(off), static_cast<off_t>(len)) != 0) {
      if (errno == ENOSPC) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "pool dir ", dir, ": no space to pre-allocate ", total,
            " bytes for the pool file; free space there or lower pool.capacity_bytes"));
      }
      if (errno != EOPNOTSUPP || off != 0) return Errno(absl::StrCat("fallocate ", path), errno);
      log::Get("pool")->warn("{}: fallocate unsupported; the pool file stays sparse", path);
      if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
        return Errno(absl::StrCat("ftruncate ", path), errno);
      }
      break;
    }
    if (progress) progress(path, off + len, total);
  }
  return absl::OkStatus();
}

std::string PathIn(const std::string& dir) { return absl::StrCat(dir, "/", kPoolFileName); }

absl::Status CheckDirs(const std::vector<std::string>& dirs, const PoolLayout& layout) {
  if (dirs.empty()) return absl::InvalidArgumentError("pool.dirs: no directory");
  if (dirs.size() != layout.num_files()) {
    return absl::InvalidArgumentError(absl::StrCat("pool.dirs has ", dirs.size(),
                                                   " directories; the layout has ",
                                                   layout.num_files(), " files"));
  }
  for (size_t i = 0; i < dirs.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (dirs[i] == dirs[j]) {
        return absl::InvalidArgumentError(absl::StrCat("pool.dirs lists ", dirs[i], " twice"));
      }
    }
    struct stat st;
    if (stat(dirs[i].c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool dir ", dirs[i],
                       " does not exist or is not a directory: create it (one per SSD, "
                       "on that SSD's filesystem) or fix pool.dirs"));
    }
  }
  return absl::OkStatus();
}

// Finishes a creation interrupted between renames, and removes other leftover temporary files.
absl::Status RecoverTmpFiles(const std::vector<std::string>& dirs) {
  std::array<uint8_t, 16> uuid{};
  bool have_uuid = false;
  for (const std::string& dir : dirs) {
    if (!Exists(PathIn(dir))) continue;
    auto fd = OpenDirect(PathIn(dir), 0);
    if (!fd.ok()) continue;  // reported by the open that follows
    if (auto sb = ReadSuperblock(fd->get(), PathIn(dir)); sb.ok()) {
      uuid = sb->uuid;
      have_uuid = true;
      break;
    }
  }
  for (uint32_t i = 0; i < dirs.size(); ++i) {
    const std::string final_path = PathIn(dirs[i]);
    const std::string tmp = final_path + kTmpSuffix;
    if (!Exists(tmp)) continue;
    ASSIGN_OR_RETURN(ScopedFd fd, OpenDirect(tmp, 0));
    // Held by a process creating the pool right now?
    RETURN_IF_ERROR(Lock(fd.get(), tmp, absl::ZeroDuration()));
    bool finish = false;
    if (have_uuid && !Exists(final_path)) {
      auto sb = ReadSuperblock(fd.get(), tmp);
      finish = sb.ok() && sb->uuid == uuid && sb->file_index == i;
    }
    if (finish) {
      if (rename(tmp.c_str(), final_path.c_str()) != 0) return Errno("rename " + tmp, errno);
      RETURN_IF_ERROR(FsyncDir(dirs[i]));
      log::Get("pool")->warn("{}: finished an interrupted pool creation", final_path);
    } else {
      log::Get("pool")->warn("{}: removing a leftover from an interrupted pool creation", tmp);
      if (unlink(tmp.c_str()) != 0) return Errno("unlink " + tmp, errno);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolFiles> CreatePool(const std::vector<std::string>& dirs, const PoolLayout& layout,
                                     const ProgressFn& progress) {
  ASSIGN_OR_RETURN(const auto uuid, NewUuid());
  std::vector<std::string> tmps;
  std::vector<ScopedFd> fds;
  absl::Status status;
  for (uint32_t i = 0; i < dirs.size() && status.ok(); ++i) {
    tmps.push_back(PathIn(dirs[i]) + kTmpSuffix);
    auto fd = OpenDirect(tmps.back(), O_CREAT | O_EXCL);
    if (!fd.ok()) {
      tmps.pop_back();
      status = fd.status();
      break;
    }
    fds.push_back(*std::move(fd));
    const int fd_now = fds.back().get();
    status = Lock(fd_now, tmps.back(), absl::ZeroDuration());
    if (status.ok()) {
      status = Preallocate(fd_now, dirs[i], tmps.back(), layout.file_bytes(), progress);
    }
    if (status.ok()) {
      status = WriteSuperblock(fd_now, FromLayout(layout, i, uuid), tmps.back());
    }
  }
  if (!status.ok()) {
    for (const std::string& tmp : tmps) unlink(tmp.c_str());
    return status;
  }
  PoolFiles pool;
  for (uint32_t i = 0; i < dirs.size(); ++i) {
    pool.paths.push_back(PathIn(dirs[i]));
    if (rename(tmps[i].c_str(), pool.paths[i].c_str()) != 0) {
      return Errno("rename " + tmps[i], errno);
    }
  }
  for (uint32_t i = 0; i < dirs.size(); ++i) {
    RETURN_IF_ERROR(FsyncDir(dirs[i]));
    pool.fds.push_back(fds[i].release());
  }
  pool.uuid = uuid;
  pool.created = true;
  return pool;
}

// Opens and checks file `i` against `want` (the layout) and `uuid` (of file 0), if given.
// A pool file whose superblock is intact but whose size is wrong (truncated by an operator or a
// broken tool, or grown) gets its size back, so the daemon keeps serving everything else. Blocks
// that lay in a lost tail read back as zeros there: their checksums fail, so they are misses,
// counted as verification errors, never served.
absl::Status RestoreSize(int fd, const std::string& path, uint64_t have, uint64_t want) {
  log::Get("pool")->error(
      "{} is {} bytes but its superblock says {} ({}); restoring its size. Blocks stored in the "
      "lost range will be misses.",
      path, have, want, have < want ? "truncated" : "grown");
  if (ftruncate(fd, static_cast<off_t>(want)) != 0) {
    return Errno(absl::StrCat("ftruncate ", path, " back to ", want, " bytes"), errno);
  }
  if (have < want &&
      fallocate(fd, 0, static_cast<off_t>(have), static_cast<off_t>(want - have)) != 0) {
    const int err = errno;
    if (err == ENOSPC) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no space to restore ", path, " to ", want, " bytes: free ", want - have, " bytes"));
    }
    return Errno(absl::StrCat("fallocate ", path), err);
  }
  return fsync(fd) == 0 ? absl::OkStatus() : Errno(absl::StrCat("fsync ", path), errno);
}

absl::StatusOr<ScopedFd> OpenOne(const std::string& path, uint32_t i, const Superblock& want,
                                 const std::array<uint8_t, 16>* uuid, absl::Duration lock_wait,
                                 Superblock* have) {
  ASSIGN_OR_RETURN(ScopedFd fd, OpenDirect(path, 0));
  RETURN_IF_ERROR(Lock(fd.get(), path, lock_wait));
  ASSIGN_OR_RETURN(*have, ReadSuperblock(fd.get(), path));
  if (const std::string diff = LayoutDifferences(*have, want); !diff.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " was created for another pool layout (", diff,
        "). Restore pool.capacity_bytes, "
        "pool.object_bytes, pool.max_objects, pool.extent_slots and pool.dirs to the values the pool was created "
        "with, or move the pool files away (their cached blocks are lost) to start an empty pool"));
  }
  if (have->file_index != i) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is file ", have->file_index, " of its pool but pool.dirs lists its directory as ",
        i, ": restore the order of pool.dirs"));
  }
  if (uuid != nullptr && have->uuid != *uuid) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " belongs to pool ", Hex(have->uuid),
                     ", the first directory's file to pool ", Hex(*uuid),
                     ": pool.dirs mixes two pools; restore one pool's directories, or move the "
                     "pool files away to start an empty pool"));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Errno(absl::StrCat("fstat ", path), errno);
  if (static_cast<uint64_t>(st.st_size) != have->file_bytes) {
    RETURN_IF_ERROR(RestoreSize(fd.get(), path, static_cast<uint64_t>(st.st_size), have->file_bytes));
  }
  return fd;
}

absl::StatusOr<PoolFiles> OpenPool(const std::vector<std::string>& dirs, const PoolLayout& layout,
                                   absl::Duration lock_wait) {
  PoolFiles pool;
  Superblock first;
  for (uint32_t i = 0; i < dirs.size(); ++i) {
    pool.paths.push_back(PathIn(dirs[i]));
    Superblock have;
    const Superblock want = FromLayout(layout, i, {});
    ASSIGN_OR_RETURN(ScopedFd fd, OpenOne(pool.paths[i], i, want, i == 0 ? nullptr : &first.uuid,
                                          lock_wait, &have));
    if (i == 0) first = have;
    pool.fds.push_back(fd.release());
  }
  pool.uuid = first.uuid;
  return pool;
}

}  // namespace

PoolFiles::PoolFiles(PoolFiles&& other) noexcept { *this = std::move(other); }

PoolFiles& PoolFiles::operator=(PoolFiles&& other) noexcept {
  for (int fd : fds) close(fd);
  fds = std::exchange(other.fds, {});
  paths = std::move(other.paths);
  uuid = other.uuid;
  created = other.created;
  return *this;
}

PoolFiles::~PoolFiles() {
  for (int fd : fds) close(fd);
}

std::vector<int> PoolFiles::TakeFds() { return std::exchange(fds, {}); }

std::string PoolFiles::UuidHex() const { return Hex(uuid); }

absl::StatusOr<PoolFiles> OpenOrCreatePool(const std::vector<std::string>& dirs,
                                           const PoolLayout& layout, const ProgressFn& progress,
                                           absl::Duration lock_wait) {
  RETURN_IF_ERROR(CheckDirs(dirs, layout));
  RETURN_IF_ERROR(RecoverTmpFiles(dirs));
  std::vector<std::string> present, missing;
  for (const std::string& dir : dirs) {
    (Exists(PathIn(dir)) ? present : missing).push_back(PathIn(dir));
  }
  if (present.empty()) return CreatePool(dirs, layout, progress);
  if (missing.empty()) return OpenPool(dirs, layout, lock_wait);
  return absl::FailedPreconditionError(absl::StrCat(
      "pool files ", absl::StrJoin(missing, ", "), " are missing while ",
      absl::StrJoin(present, ", "),
      " exist: if an SSD is not mounted, mount it; if a directory "
      "was added to pool.dirs, restore the old list or move the pool files away to start an "
      "empty pool"));
}

}  // namespace tutti::pool

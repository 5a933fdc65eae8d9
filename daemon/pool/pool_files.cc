#include "daemon/pool/pool_files.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

using File = std::unique_ptr<DirectFile>;

// `s` (a failure of the file-system seam) reworded as `what` failing, its errno kept.
absl::Status Reword(const std::string& what, const absl::Status& s) {
  const int err = ErrnoOf(s);
  return err != 0 ? ErrnoStatus(what, err) : s;
}

absl::StatusOr<File> OpenDirect(FileSystem& fs, const std::string& path, bool create) {
  absl::StatusOr<File> file = fs.OpenDirect(path, create);
  if (file.ok() || ErrnoOf(file.status()) != EINVAL) return file;
  return absl::FailedPreconditionError(
      absl::StrCat("cannot open ", path,
                   " with O_DIRECT: its filesystem does not support it (tmpfs?); "
                   "put the pool on a local disk filesystem such as ext4 or xfs"));
}

// Takes an exclusive flock on `file`, retrying for up to `wait` while another process holds it.
absl::Status Lock(DirectFile& file, const std::string& path, absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  for (;;) {
    const absl::Status s = file.TryLock();
    if (s.ok()) return s;
    if (ErrnoOf(s) != EWOULDBLOCK) return s;
    if (absl::Now() >= deadline) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is in use by another process (another tuttid on the same pool?)"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<Superblock> ReadSuperblock(DirectFile& file, const std::string& path) {
  io::AlignedBuffer page(kSuperblockBytes);
  absl::StatusOr<size_t> n = file.ReadAt(0, page.data(), kSuperblockBytes);
  if (!n.ok()) return Reword(absl::StrCat("read superblock of ", path), n.status());
  if (*n != kSuperblockBytes) {
    return absl::DataLossError(absl::StrCat(path, " is ", *n,
                                            " bytes: too short for a superblock "
                                            "(truncated); move the pool files away"));
  }
  return DecodeSuperblock(page.data(), path);
}

absl::Status WriteSuperblock(DirectFile& file, const Superblock& sb, const std::string& path) {
  io::AlignedBuffer page(kSuperblockBytes);
  EncodeSuperblock(sb, page.data());
  if (absl::Status s = file.WriteAt(0, page.data(), kSuperblockBytes); !s.ok()) {
    return Reword(absl::StrCat("write superblock of ", path), s);
  }
  return file.Sync();
}

bool Exists(FileSystem& fs, const std::string& path) { return fs.Stat(path).ok(); }

absl::Status CheckSpace(DirectFile& file, const std::string& dir, uint64_t bytes) {
  absl::StatusOr<uint64_t> avail = file.FreeBytes();
  if (!avail.ok()) return Reword(absl::StrCat("statvfs ", dir), avail.status());
  if (*avail >= bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "pool dir ", dir, ": the pool file needs ", bytes, " bytes but the filesystem has ", *avail,
      " free; free space there or lower pool.capacity_bytes"));
}

absl::Status Preallocate(DirectFile& file, const std::string& dir, const std::string& path,
                         uint64_t total, const ProgressFn& progress) {
  RETURN_IF_ERROR(CheckSpace(file, dir, total));
  for (uint64_t off = 0; off < total; off += kPreallocChunk) {
    const uint64_t len = std::min(kPreallocChunk, total - off);
    if (absl::Status s = file.Allocate(off, len); !s.ok()) {
      const int err = ErrnoOf(s);
      if (err == ENOSPC) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "pool dir ", dir, ": no space to pre-allocate ", total,
            " bytes for the pool file; free space there or lower pool.capacity_bytes"));
      }
      if (err != EOPNOTSUPP || off != 0) return s;
      log::Get("pool")->warn("{}: fallocate unsupported; the pool file stays sparse", path);
      RETURN_IF_ERROR(file.Truncate(total));
      break;
    }
    if (progress) progress(path, off + len, total);
  }
  return absl::OkStatus();
}

std::string PathIn(const std::string& dir) { return absl::StrCat(dir, "/", kPoolFileName); }

absl::Status CheckDirs(FileSystem& fs, const std::vector<std::string>& dirs,
                       const PoolLayout& layout) {
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
    const absl::StatusOr<FileInfo> st = fs.Stat(dirs[i]);
    if (!st.ok() || !st->is_dir) {
      return absl::FailedPreconditionError(
          absl::StrCat("pool dir ", dirs[i],
                       " does not exist or is not a directory: create it (one per SSD, "
                       "on that SSD's filesystem) or fix pool.dirs"));
    }
  }
  return absl::OkStatus();
}

// Finishes a creation interrupted between renames, and removes other leftover temporary files.
absl::Status RecoverTmpFiles(FileSystem& fs, const std::vector<std::string>& dirs) {
  std::array<uint8_t, 16> uuid{};
  bool have_uuid = false;
  for (const std::string& dir : dirs) {
    if (!Exists(fs, PathIn(dir))) continue;
    auto file = OpenDirect(fs, PathIn(dir), false);
    if (!file.ok()) continue;  // reported by the open that follows
    if (auto sb = ReadSuperblock(**file, PathIn(dir)); sb.ok()) {
      uuid = sb->uuid;
      have_uuid = true;
      break;
    }
  }
  for (uint32_t i = 0; i < dirs.size(); ++i) {
    const std::string final_path = PathIn(dirs[i]);
    const std::string tmp = final_path + kTmpSuffix;
    if (!Exists(fs, tmp)) continue;
    ASSIGN_OR_RETURN(File file, OpenDirect(fs, tmp, false));
    // Held by a process creating the pool right now?
    RETURN_IF_ERROR(Lock(*file, tmp, absl::ZeroDuration()));
    bool finish = false;
    if (have_uuid && !Exists(fs, final_path)) {
      auto sb = ReadSuperblock(*file, tmp);
      finish = sb.ok() && sb->uuid == uuid && sb->file_index == i;
    }
    if (finish) {
      RETURN_IF_ERROR(fs.Rename(tmp, final_path));
      RETURN_IF_ERROR(fs.SyncDir(dirs[i]));
      log::Get("pool")->warn("{}: finished an interrupted pool creation", final_path);
    } else {
      log::Get("pool")->warn("{}: removing a leftover from an interrupted pool creation", tmp);
      RETURN_IF_ERROR(fs.Unlink(tmp));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolFiles> CreatePool(FileSystem& fs, const std::vector<std::string>& dirs,
                                     const PoolLayout& layout, const ProgressFn& progress) {
  ASSIGN_OR_RETURN(const auto uuid, NewUuid());
  std::vector<std::string> tmps;
  std::vector<File> files;
  absl::Status status;
  for (uint32_t i = 0; i < dirs.size() && status.ok(); ++i) {
    tmps.push_back(PathIn(dirs[i]) + kTmpSuffix);
    auto file = OpenDirect(fs, tmps.back(), true);
    if (!file.ok()) {
      tmps.pop_back();
      status = file.status();
      break;
    }
    files.push_back(*std::move(file));
    DirectFile& now = *files.back();
    status = Lock(now, tmps.back(), absl::ZeroDuration());
    if (status.ok()) {
      status = Preallocate(now, dirs[i], tmps.back(), layout.file_bytes(), progress);
    }
    if (status.ok()) {
      status = WriteSuperblock(now, FromLayout(layout, i, uuid), tmps.back());
    }
  }
  if (!status.ok()) {
    for (const std::string& tmp : tmps) (void)fs.Unlink(tmp);
    return status;
  }
  PoolFiles pool;
  for (uint32_t i = 0; i < dirs.size(); ++i) {
    pool.paths.push_back(PathIn(dirs[i]));
    RETURN_IF_ERROR(fs.Rename(tmps[i], pool.paths[i]));
  }
  for (uint32_t i = 0; i < dirs.size(); ++i) {
    RETURN_IF_ERROR(fs.SyncDir(dirs[i]));
    pool.fds.push_back(files[i]->ReleaseFd());
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
absl::Status RestoreSize(DirectFile& file, const std::string& path, uint64_t have, uint64_t want) {
  log::Get("pool")->error(
      "{} is {} bytes but its superblock says {} ({}); restoring its size. Blocks stored in the "
      "lost range will be misses.",
      path, have, want, have < want ? "truncated" : "grown");
  if (absl::Status s = file.Truncate(want); !s.ok()) {
    return Reword(absl::StrCat("ftruncate ", path, " back to ", want, " bytes"), s);
  }
  if (have < want) {
    if (absl::Status s = file.Allocate(have, want - have); !s.ok()) {
      if (ErrnoOf(s) == ENOSPC) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "no space to restore ", path, " to ", want, " bytes: free ", want - have, " bytes"));
      }
      return s;
    }
  }
  return file.Sync();
}

absl::StatusOr<File> OpenOne(FileSystem& fs, const std::string& path, uint32_t i,
                             const Superblock& want, const std::array<uint8_t, 16>* uuid,
                             absl::Duration lock_wait, Superblock* have) {
  ASSIGN_OR_RETURN(File file, OpenDirect(fs, path, false));
  RETURN_IF_ERROR(Lock(*file, path, lock_wait));
  ASSIGN_OR_RETURN(*have, ReadSuperblock(*file, path));
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
  ASSIGN_OR_RETURN(const FileInfo st, file->Stat());
  if (st.size != have->file_bytes) {
    RETURN_IF_ERROR(RestoreSize(*file, path, st.size, have->file_bytes));
  }
  return file;
}

absl::StatusOr<PoolFiles> OpenPool(FileSystem& fs, const std::vector<std::string>& dirs,
                                   const PoolLayout& layout, absl::Duration lock_wait) {
  PoolFiles pool;
  Superblock first;
  for (uint32_t i = 0; i < dirs.size(); ++i) {
    pool.paths.push_back(PathIn(dirs[i]));
    Superblock have;
    const Superblock want = FromLayout(layout, i, {});
    ASSIGN_OR_RETURN(File file, OpenOne(fs, pool.paths[i], i, want,
                                        i == 0 ? nullptr : &first.uuid, lock_wait, &have));
    if (i == 0) first = have;
    pool.fds.push_back(file->ReleaseFd());
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
                                           absl::Duration lock_wait, FileSystem* fs) {
  RETURN_IF_ERROR(CheckDirs(*fs, dirs, layout));
  RETURN_IF_ERROR(RecoverTmpFiles(*fs, dirs));
  std::vector<std::string> present, missing;
  for (const std::string& dir : dirs) {
    (Exists(*fs, PathIn(dir)) ? present : missing).push_back(PathIn(dir));
  }
  if (present.empty()) return CreatePool(*fs, dirs, layout, progress);
  if (missing.empty()) return OpenPool(*fs, dirs, layout, lock_wait);
  return absl::FailedPreconditionError(absl::StrCat(
      "pool files ", absl::StrJoin(missing, ", "), " are missing while ",
      absl::StrJoin(present, ", "),
      " exist: if an SSD is not mounted, mount it; if a directory "
      "was added to pool.dirs, restore the old list or move the pool files away to start an "
      "empty pool"));
}

}  // namespace tutti::pool

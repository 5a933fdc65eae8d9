#include "common/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/unique_fd.h"

namespace tutti {
namespace {

constexpr char kErrnoPayload[] = "tutti/errno";

FileInfo ToInfo(const struct stat& st) {
  FileInfo info;
  info.dev = st.st_dev;
  info.ino = st.st_ino;
  info.nlink = st.st_nlink;
  info.size = static_cast<uint64_t>(st.st_size);
  info.is_dir = S_ISDIR(st.st_mode);
  return info;
}

class PosixSequentialFile : public SequentialFile {
 public:
  PosixSequentialFile(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  absl::StatusOr<size_t> Read(char* buf, size_t n) override {
    for (;;) {
      const ssize_t r = read(fd_.get(), buf, n);
      if (r >= 0) return static_cast<size_t>(r);
      if (errno != EINTR) return ErrnoStatus(absl::StrCat("read ", path_), errno);
    }
  }

 private:
  UniqueFd fd_;
  std::string path_;
};

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  absl::Status Append(std::string_view data) override {
    while (!data.empty()) {
      const ssize_t n = write(fd_.get(), data.data(), data.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return ErrnoStatus(absl::StrCat("write ", path_), n < 0 ? errno : EIO);
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    while (fdatasync(fd_.get()) != 0) {
      if (errno != EINTR) return ErrnoStatus(absl::StrCat("fdatasync ", path_), errno);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<FileInfo> Stat() override {
    struct stat st;
    if (fstat(fd_.get(), &st) != 0) return ErrnoStatus(absl::StrCat("fstat ", path_), errno);
    return ToInfo(st);
  }

 private:
  UniqueFd fd_;
  std::string path_;
};

class PosixDirectFile : public DirectFile {
 public:
  PosixDirectFile(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  absl::StatusOr<size_t> ReadAt(uint64_t offset, void* buf, size_t n) override {
    size_t done = 0;
    while (done < n) {
      const ssize_t r = pread(fd_.get(), static_cast<char*>(buf) + done, n - done,
                              static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return ErrnoStatus(absl::StrCat("read ", path_), errno);
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    return done;
  }
  absl::Status WriteAt(uint64_t offset, const void* buf, size_t n) override {
    for (;;) {
      const ssize_t w = pwrite(fd_.get(), buf, n, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      if (w == static_cast<ssize_t>(n)) return absl::OkStatus();
      return ErrnoStatus(absl::StrCat("write ", path_), w < 0 ? errno : EIO);
    }
  }
  absl::Status Allocate(uint64_t offset, uint64_t len) override {
    while (fallocate(fd_.get(), 0, static_cast<off_t>(offset), static_cast<off_t>(len)) != 0) {
      if (errno != EINTR) return ErrnoStatus(absl::StrCat("fallocate ", path_), errno);
    }
    return absl::OkStatus();
  }
  absl::Status Truncate(uint64_t size) override {
    while (ftruncate(fd_.get(), static_cast<off_t>(size)) != 0) {
      if (errno != EINTR) return ErrnoStatus(absl::StrCat("ftruncate ", path_), errno);
    }
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    while (fsync(fd_.get()) != 0) {
      if (errno != EINTR) return ErrnoStatus(absl::StrCat("fsync ", path_), errno);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<FileInfo> Stat() override {
    struct stat st;
    if (fstat(fd_.get(), &st) != 0) return ErrnoStatus(absl::StrCat("fstat ", path_), errno);
    return ToInfo(st);
  }
  absl::StatusOr<uint64_t> FreeBytes() override {
    struct statvfs vfs;
    if (fstatvfs(fd_.get(), &vfs) != 0) return ErrnoStatus(absl::StrCat("statvfs ", path_), errno);
    return uint64_t{vfs.f_bavail} * vfs.f_frsize;
  }
  absl::Status TryLock() override {
    while (flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EINTR) return ErrnoStatus(absl::StrCat("flock ", path_), errno);
    }
    return absl::OkStatus();
  }
  int ReleaseFd() override { return fd_.release(); }

 private:
  UniqueFd fd_;
  std::string path_;
};

class PosixFileLock : public FileLock {
 public:
  explicit PosixFileLock(UniqueFd fd) : fd_(std::move(fd)) {}

 private:
  UniqueFd fd_;  // closing it releases the lock
};

class Posix : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<SequentialFile>> OpenForRead(const std::string& path) override {
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoStatus(absl::StrCat("open ", path), errno);
    return std::make_unique<PosixSequentialFile>(std::move(fd), path);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> Create(const std::string& path,
                                                       CreateMode how) override {
    const int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC |
                      (how == CreateMode::kExclusive ? O_EXCL : O_TRUNC);
    UniqueFd fd(open(path.c_str(), flags, 0600));
    if (!fd.valid()) return ErrnoStatus(absl::StrCat("create ", path), errno);
    return std::make_unique<PosixWritableFile>(std::move(fd), path);
  }

  absl::StatusOr<std::unique_ptr<DirectFile>> OpenDirect(const std::string& path,
                                                         bool create) override {
    const int flags = O_RDWR | O_DIRECT | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0);
    UniqueFd fd(open(path.c_str(), flags, 0600));
    if (!fd.valid()) return ErrnoStatus(absl::StrCat("open ", path), errno);
    return std::make_unique<PosixDirectFile>(std::move(fd), path);
  }

  absl::StatusOr<FileInfo> Stat(const std::string& path) override {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return ErrnoStatus(absl::StrCat("stat ", path), errno);
    return ToInfo(st);
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus(absl::StrCat("open dir ", dir), errno);
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* e = readdir(d)) {
      const std::string_view name = e->d_name;
      if (name != "." && name != "..") names.emplace_back(name);
    }
    const int err = errno;
    closedir(d);
    if (err != 0) return ErrnoStatus(absl::StrCat("read dir ", dir), err);
    return names;
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) == 0) return absl::OkStatus();
    return ErrnoStatus(absl::StrCat("rename ", from, " to ", to), errno);
  }

  absl::Status Unlink(const std::string& path) override {
    if (unlink(path.c_str()) == 0) return absl::OkStatus();
    return ErrnoStatus(absl::StrCat("unlink ", path), errno);
  }

  absl::Status SyncDir(const std::string& dir) override {
    UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoStatus(absl::StrCat("open ", dir), errno);
    while (fsync(fd.get()) != 0) {
      if (errno != EINTR) return ErrnoStatus(absl::StrCat("fsync ", dir), errno);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<FileLock>> Lock(const std::string& path,
                                                 std::string_view content) override {
    UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoStatus(absl::StrCat("open ", path), errno);
    while (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EINTR) return ErrnoStatus(absl::StrCat("flock ", path), errno);
    }
    errno = 0;
    if (ftruncate(fd.get(), 0) != 0 || pwrite(fd.get(), content.data(), content.size(), 0) !=
                                           static_cast<ssize_t>(content.size())) {
      return ErrnoStatus(absl::StrCat("write ", path), errno != 0 ? errno : EIO);
    }
    return std::make_unique<PosixFileLock>(std::move(fd));
  }
};

}  // namespace

absl::Status ErrnoStatus(const std::string& what, int err) {
  const std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  absl::Status s = err == ENOSPC ? absl::ResourceExhaustedError(msg) : absl::InternalError(msg);
  s.SetPayload(kErrnoPayload, absl::Cord(absl::StrCat(err)));
  return s;
}

int ErrnoOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kErrnoPayload);
  int err = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &err)) return 0;
  return err;
}

FileSystem* PosixFileSystem() {
  static FileSystem* const fs = new Posix();
  return fs;
}

absl::StatusOr<std::string> ReadFileToString(FileSystem& fs, const std::string& path) {
  auto file = fs.OpenForRead(path);
  if (!file.ok()) return file.status();
  std::string out;
  char buf[64 << 10];
  for (;;) {
    auto n = (*file)->Read(buf, sizeof(buf));
    if (!n.ok()) return n.status();
    if (*n == 0) return out;
    out.append(buf, *n);
  }
}

}  // namespace tutti

#include "common/fault_file_system.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tutti {
namespace {

using Op = FaultFileSystem::Op;

// The operation's name in an error message, as PosixFileSystem words it.
const char* OpName(Op op) {
  switch (op) {
    case Op::kOpenForRead:
      return "open";
    case Op::kRead:
      return "read";
    case Op::kCreate:
      return "create";
    case Op::kAppend:
      return "write";
    case Op::kSync:
      return "fdatasync";
    case Op::kFileStat:
      return "fstat";
    case Op::kStat:
      return "stat";
    case Op::kListDir:
      return "open dir";
    case Op::kRename:
      return "rename";
    case Op::kUnlink:
      return "unlink";
    case Op::kSyncDir:
      return "fsync";
    case Op::kLock:
      return "flock";
    case Op::kOpenDirect:
      return "open";
    case Op::kReadAt:
      return "read";
    case Op::kWriteAt:
      return "write";
    case Op::kAllocate:
      return "fallocate";
    case Op::kTruncate:
      return "ftruncate";
    case Op::kFsync:
      return "fsync";
    case Op::kFreeBytes:
      return "statvfs";
  }
  return "?";
}

class FaultSequentialFile : public SequentialFile {
 public:
  FaultSequentialFile(FaultFileSystem* fs, std::string path, std::unique_ptr<SequentialFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}
  absl::StatusOr<size_t> Read(char* buf, size_t n) override {
    RETURN_IF_ERROR(fs_->Check(Op::kRead, path_));
    return base_->Read(buf, n);
  }

 private:
  FaultFileSystem* const fs_;
  const std::string path_;
  std::unique_ptr<SequentialFile> base_;
};

class FaultWritableFile : public WritableFile {
 public:
  FaultWritableFile(FaultFileSystem* fs, std::string path, std::unique_ptr<WritableFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}
  absl::Status Append(std::string_view data) override {
    size_t keep = 0;
    absl::Status s = fs_->Check(Op::kAppend, path_, &keep);
    if (s.ok()) return base_->Append(data);
    if (keep > 0) RETURN_IF_ERROR(base_->Append(data.substr(0, std::min(keep, data.size()))));
    return s;
  }
  absl::Status Sync() override {
    RETURN_IF_ERROR(fs_->Check(Op::kSync, path_));
    return base_->Sync();
  }
  absl::StatusOr<FileInfo> Stat() override {
    RETURN_IF_ERROR(fs_->Check(Op::kFileStat, path_));
    return base_->Stat();
  }

 private:
  FaultFileSystem* const fs_;
  const std::string path_;
  std::unique_ptr<WritableFile> base_;
};

class FaultDirectFile : public DirectFile {
 public:
  FaultDirectFile(FaultFileSystem* fs, std::string path, std::unique_ptr<DirectFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}
  absl::StatusOr<size_t> ReadAt(uint64_t offset, void* buf, size_t n) override {
    RETURN_IF_ERROR(fs_->Check(Op::kReadAt, path_));
    return base_->ReadAt(offset, buf, n);
  }
  absl::Status WriteAt(uint64_t offset, const void* buf, size_t n) override {
    RETURN_IF_ERROR(fs_->Check(Op::kWriteAt, path_));
    return base_->WriteAt(offset, buf, n);
  }
  absl::Status Allocate(uint64_t offset, uint64_t len) override {
    RETURN_IF_ERROR(fs_->Check(Op::kAllocate, path_));
    return base_->Allocate(offset, len);
  }
  absl::Status Truncate(uint64_t size) override {
    RETURN_IF_ERROR(fs_->Check(Op::kTruncate, path_));
    return base_->Truncate(size);
  }
  absl::Status Sync() override {
    RETURN_IF_ERROR(fs_->Check(Op::kFsync, path_));
    return base_->Sync();
  }
  absl::StatusOr<FileInfo> Stat() override {
    RETURN_IF_ERROR(fs_->Check(Op::kFileStat, path_));
    return base_->Stat();
  }
  absl::StatusOr<uint64_t> FreeBytes() override {
    RETURN_IF_ERROR(fs_->Check(Op::kFreeBytes, path_));
    return base_->FreeBytes();
  }
  absl::Status TryLock() override {
    RETURN_IF_ERROR(fs_->Check(Op::kLock, path_));
    return base_->TryLock();
  }
  int ReleaseFd() override { return base_->ReleaseFd(); }

 private:
  FaultFileSystem* const fs_;
  const std::string path_;
  std::unique_ptr<DirectFile> base_;
};

}  // namespace

void FaultFileSystem::Inject(Fault fault) {
  absl::MutexLock lock(&mu_);
  faults_.push_back(std::move(fault));
}

void FaultFileSystem::Clear() {
  absl::MutexLock lock(&mu_);
  faults_.clear();
}

int FaultFileSystem::calls(Op op) const {
  absl::MutexLock lock(&mu_);
  const auto it = calls_.find(op);
  return it == calls_.end() ? 0 : it->second;
}

int FaultFileSystem::failures() const {
  absl::MutexLock lock(&mu_);
  return failures_;
}

absl::Status FaultFileSystem::Check(Op op, const std::string& path, size_t* short_write) {
  absl::MutexLock lock(&mu_);
  ++calls_[op];
  for (Fault& f : faults_) {
    if (f.op != op || f.times == 0 || path.find(f.path_contains) == std::string::npos) continue;
    if (f.skip > 0) {
      --f.skip;
      continue;
    }
    if (f.times > 0) --f.times;
    ++failures_;
    if (short_write != nullptr) *short_write = f.short_write;
    return ErrnoStatus(absl::StrCat(OpName(op), " ", path), f.err);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SequentialFile>> FaultFileSystem::OpenForRead(
    const std::string& path) {
  RETURN_IF_ERROR(Check(Op::kOpenForRead, path));
  ASSIGN_OR_RETURN(auto file, base_->OpenForRead(path));
  return std::make_unique<FaultSequentialFile>(this, path, std::move(file));
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultFileSystem::Create(const std::string& path,
                                                                      CreateMode how) {
  RETURN_IF_ERROR(Check(Op::kCreate, path));
  ASSIGN_OR_RETURN(auto file, base_->Create(path, how));
  return std::make_unique<FaultWritableFile>(this, path, std::move(file));
}

absl::StatusOr<std::unique_ptr<DirectFile>> FaultFileSystem::OpenDirect(const std::string& path,
                                                                         bool create) {
  RETURN_IF_ERROR(Check(Op::kOpenDirect, path));
  ASSIGN_OR_RETURN(auto file, base_->OpenDirect(path, create));
  return std::make_unique<FaultDirectFile>(this, path, std::move(file));
}

absl::StatusOr<FileInfo> FaultFileSystem::Stat(const std::string& path) {
  RETURN_IF_ERROR(Check(Op::kStat, path));
  return base_->Stat(path);
}

absl::StatusOr<std::vector<std::string>> FaultFileSystem::ListDir(const std::string& dir) {
  RETURN_IF_ERROR(Check(Op::kListDir, dir));
  return base_->ListDir(dir);
}

absl::Status FaultFileSystem::Rename(const std::string& from, const std::string& to) {
  RETURN_IF_ERROR(Check(Op::kRename, from));
  return base_->Rename(from, to);
}

absl::Status FaultFileSystem::Unlink(const std::string& path) {
  RETURN_IF_ERROR(Check(Op::kUnlink, path));
  return base_->Unlink(path);
}

absl::Status FaultFileSystem::SyncDir(const std::string& dir) {
  RETURN_IF_ERROR(Check(Op::kSyncDir, dir));
  return base_->SyncDir(dir);
}

absl::StatusOr<std::unique_ptr<FileLock>> FaultFileSystem::Lock(const std::string& path,
                                                                std::string_view content) {
  RETURN_IF_ERROR(Check(Op::kLock, path));
  return base_->Lock(path, content);
}

}  // namespace tutti

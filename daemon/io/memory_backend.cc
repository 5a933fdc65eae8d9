#include "daemon/io/memory_backend.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "daemon/io/request_check.h"

namespace tutti::io {

using Page = std::array<uint8_t, kAlignment>;

struct MemoryDisk::File {
  absl::flat_hash_map<uint64_t, std::unique_ptr<Page>> pages;  // visible contents, by page index
  // Pages written since the last Sync -> their durable contents (nullptr: never written before).
  absl::flat_hash_map<uint64_t, std::unique_ptr<Page>> unsynced;
  uint32_t fail_reads = 0, fail_writes = 0, fail_syncs = 0;
  int read_error = 0, write_error = 0, sync_error = 0;
  uint32_t short_reads = 0, short_bytes = 0;
  Counts counts;
};

MemoryDisk::MemoryDisk(std::vector<uint64_t> sizes) : sizes_(std::move(sizes)) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < sizes_.size(); ++i) files_.push_back(std::make_unique<File>());
}

MemoryDisk::~MemoryDisk() = default;

absl::StatusOr<std::shared_ptr<MemoryDisk>> MemoryDisk::Create(std::vector<uint64_t> file_sizes) {
  if (file_sizes.empty()) return absl::InvalidArgumentError("memory disk: no files");
  for (size_t i = 0; i < file_sizes.size(); ++i) {
    if (file_sizes[i] == 0 || file_sizes[i] % kAlignment != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory disk: file ", i, " size ", file_sizes[i],
                       " is not a positive multiple of ", kAlignment));
    }
  }
  return std::shared_ptr<MemoryDisk>(new MemoryDisk(std::move(file_sizes)));
}

void MemoryDisk::FailNext(uint32_t file, Op op, uint32_t count, int error) {
  absl::MutexLock lock(&mu_);
  File& f = *files_[file];
  (op == Op::kRead ? f.fail_reads : f.fail_writes) = count;
  (op == Op::kRead ? f.read_error : f.write_error) = error;
}

void MemoryDisk::ShortenNextReads(uint32_t file, uint32_t count, uint32_t bytes) {
  absl::MutexLock lock(&mu_);
  files_[file]->short_reads = count;
  files_[file]->short_bytes = bytes;
}

void MemoryDisk::FailNextSync(uint32_t file, uint32_t count, int error) {
  absl::MutexLock lock(&mu_);
  files_[file]->fail_syncs = count;
  files_[file]->sync_error = error;
}

void MemoryDisk::Corrupt(uint32_t file, uint64_t offset, uint64_t len, uint8_t mask) {
  absl::MutexLock lock(&mu_);
  File& f = *files_[file];
  for (uint64_t pos = offset; pos < offset + len; ++pos) {
    const uint64_t index = pos / kAlignment;
    auto flip = [&](std::unique_ptr<Page>& page) {
      if (page == nullptr) page = std::make_unique<Page>(Page{});
      (*page)[pos % kAlignment] ^= mask;
    };
    flip(f.pages[index]);
    auto it = f.unsynced.find(index);
    if (it != f.unsynced.end()) flip(it->second);
  }
}

void MemoryDisk::PowerCut() {
  absl::MutexLock lock(&mu_);
  powered_off_ = true;
}

void MemoryDisk::Restart(CrashMode mode, uint64_t seed) {
  absl::MutexLock lock(&mu_);
  std::mt19937_64 rng(seed);
  for (auto& file : files_) {
    // Decide in page order, so a seed always tears the same way.
    std::vector<uint64_t> indexes;
    for (const auto& [index, old] : file->unsynced) indexes.push_back(index);
    std::sort(indexes.begin(), indexes.end());
    for (uint64_t index : indexes) {
      const bool keep_new = mode == CrashMode::kTear && (rng() & 1) != 0;
      if (keep_new) continue;
      std::unique_ptr<Page>& old = file->unsynced[index];
      if (old == nullptr) {
        file->pages.erase(index);
      } else {
        file->pages[index] = std::move(old);
      }
    }
    file->unsynced.clear();
  }
  powered_off_ = false;
}

void MemoryDisk::SimulateCrash(CrashMode mode, uint64_t seed) {
  PowerCut();
  Restart(mode, seed);
}

std::string MemoryDisk::Peek(uint32_t file, uint64_t offset, uint64_t len) const {
  std::string out(len, '\0');
  absl::MutexLock lock(&mu_);
  const File& f = *files_[file];
  for (uint64_t done = 0; done < len;) {
    const uint64_t pos = offset + done;
    const uint64_t in_page = pos % kAlignment;
    const uint64_t n = std::min<uint64_t>(kAlignment - in_page, len - done);
    auto it = f.pages.find(pos / kAlignment);
    if (it != f.pages.end()) std::memcpy(&out[done], it->second->data() + in_page, n);
    done += n;
  }
  return out;
}

uint64_t MemoryDisk::UnsyncedPages(uint32_t file) const {
  absl::MutexLock lock(&mu_);
  return files_[file]->unsynced.size();
}

MemoryDisk::Counts MemoryDisk::counts(uint32_t file) const {
  absl::MutexLock lock(&mu_);
  return files_[file]->counts;
}

void MemoryDisk::ReadPages(File& f, uint64_t offset, uint8_t* out, uint64_t len) {
  for (uint64_t done = 0; done < len; done += kAlignment) {
    auto it = f.pages.find((offset + done) / kAlignment);
    if (it == f.pages.end()) {
      std::memset(out + done, 0, kAlignment);
    } else {
      std::memcpy(out + done, it->second->data(), kAlignment);
    }
  }
}

void MemoryDisk::WritePages(File& f, uint64_t offset, const uint8_t* in, uint64_t len) {
  for (uint64_t done = 0; done < len; done += kAlignment) {
    const uint64_t index = (offset + done) / kAlignment;
    std::unique_ptr<Page>& page = f.pages[index];
    if (!f.unsynced.contains(index)) {
      f.unsynced[index] = page == nullptr ? nullptr : std::make_unique<Page>(*page);
    }
    if (page == nullptr) page = std::make_unique<Page>();
    std::memcpy(page->data(), in + done, kAlignment);
  }
}

void MemoryDisk::Apply(IoRequest& r) {
  if (!internal::IsValidRequest(r, sizes_)) {
    r.result = -EINVAL;
    return;
  }
  absl::MutexLock lock(&mu_);
  File& f = *files_[r.file];
  const bool read = r.op == Op::kRead;
  uint32_t& fail = read ? f.fail_reads : f.fail_writes;
  if (powered_off_ || fail > 0) {
    r.result = powered_off_ ? -EIO : -(read ? f.read_error : f.write_error);
    if (!powered_off_) --fail;
    ++f.counts.faults;
    return;
  }
  uint8_t* buf = static_cast<uint8_t*>(r.buf);
  if (read) {
    uint32_t len = r.len;
    if (f.short_reads > 0) {
      --f.short_reads;
      ++f.counts.faults;
      len = std::min(len, f.short_bytes);
    }
    ReadPages(f, r.offset, buf, len);
    r.result = len;
    ++f.counts.reads;
    f.counts.bytes_read += len;
  } else {
    WritePages(f, r.offset, buf, r.len);
    r.result = r.len;
    ++f.counts.writes;
    f.counts.bytes_written += r.len;
  }
}

absl::Status MemoryDisk::Sync(uint32_t file) {
  if (file >= sizes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Sync: no file ", file));
  }
  absl::MutexLock lock(&mu_);
  File& f = *files_[file];
  if (powered_off_) {
    return absl::InternalError(absl::StrCat("fdatasync(file ", file, "): powered off"));
  }
  if (f.fail_syncs > 0) {
    --f.fail_syncs;
    ++f.counts.faults;
    return absl::InternalError(
        absl::StrCat("fdatasync(file ", file, "): ", std::strerror(f.sync_error)));
  }
  f.unsynced.clear();
  ++f.counts.syncs;
  return absl::OkStatus();
}

// --- MemoryBackend ---

MemoryBackend::MemoryBackend(std::shared_ptr<MemoryDisk> disk) : disk_(std::move(disk)) {
  worker_ = std::thread([this] { Run(); });
}

MemoryBackend::~MemoryBackend() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    paused_ = false;
  }
  worker_.join();
}

absl::StatusOr<std::unique_ptr<MemoryBackend>> MemoryBackend::Create(
    std::vector<uint64_t> file_sizes) {
  auto disk = MemoryDisk::Create(std::move(file_sizes));
  if (!disk.ok()) return disk.status();
  return CreateOn(*std::move(disk));
}

std::unique_ptr<MemoryBackend> MemoryBackend::CreateOn(std::shared_ptr<MemoryDisk> disk) {
  return std::unique_ptr<MemoryBackend>(new MemoryBackend(std::move(disk)));
}

absl::Status MemoryBackend::RegisterBuffer(absl::Span<uint8_t> region) {
  if (region.empty()) return absl::InvalidArgumentError("RegisterBuffer: empty region");
  absl::MutexLock lock(&mu_);
  if (registered_) {
    return absl::FailedPreconditionError("RegisterBuffer: a buffer is already registered");
  }
  registered_ = true;
  return absl::OkStatus();
}

void MemoryBackend::Submit(absl::Span<IoRequest> batch, std::function<void()> done) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(Job{batch, std::move(done)});
}

absl::Status MemoryBackend::Sync(uint32_t file) { return disk_->Sync(file); }

void MemoryBackend::SetPaused(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_ = paused;
}

size_t MemoryBackend::queued_batches() const {
  absl::MutexLock lock(&mu_);
  return jobs_.size() + running_;
}

void MemoryBackend::Run() {
  for (;;) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](MemoryBackend* b) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return (!b->jobs_.empty() && !b->paused_) || (b->stopping_ && b->jobs_.empty());
          },
          this));
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
      ++running_;
    }
    for (IoRequest& r : job.batch) disk_->Apply(r);
    if (job.done) job.done();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace tutti::io

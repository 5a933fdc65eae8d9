// The "memory" I/O backend: pool files in host memory, with fault injection and crash simulation,
// so that store and crash tests run anywhere and fast.
//
// Two pieces:
//  - MemoryDisk holds the files' bytes and the faults. It can outlive any backend over it, so a
//    test can "restart" a store on the same disk: PowerCut(), drop the old store, Restart(), open
//    a new one.
//  - MemoryBackend is the IoBackend over a MemoryDisk. It completes batches in submission order on
//    one worker thread (so `done` always runs on a backend thread, as the interface promises),
//    and a batch's requests in their order. It checks requests exactly like the uring backend
//    (alignment, bounds, file index -> -EINVAL).
//
// Volatility: a write is visible to reads at once but is durable only after Sync(file) (like a
// drive's write cache). A crash (Restart) drops every page written since its file's last Sync, or
// with kTear keeps a random subset of those 4 KiB pages (seeded, deterministic), as a power cut
// can.
//
// Storage is sparse (4 KiB pages allocated on first write; unwritten pages read as zeros), so large
// pools cost only what is written.
//
// Thread-safety: every method of both classes is thread-safe.
#ifndef TUTTI_DAEMON_IO_MEMORY_BACKEND_H_
#define TUTTI_DAEMON_IO_MEMORY_BACKEND_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/io/io_backend.h"

namespace tutti::io {

class MemoryDisk {
 public:
  // Files of `file_sizes` bytes each, zero-filled. INVALID_ARGUMENT if there is no file or a size
  // is zero or not a multiple of kAlignment.
  static absl::StatusOr<std::shared_ptr<MemoryDisk>> Create(std::vector<uint64_t> file_sizes);
  ~MemoryDisk();

  uint32_t num_files() const { return static_cast<uint32_t>(sizes_.size()); }
  uint64_t file_size(uint32_t file) const { return sizes_[file]; }

  // --- Faults. Each applies to operations that start after the call. `file` must be valid. ---
  // The next `count` operations `op` on `file` complete with -`error` and move no bytes.
  void FailNext(uint32_t file, Op op, uint32_t count, int error);
  // The next `count` reads of `file` move only min(len, `bytes`) bytes (`bytes` a 4 KiB multiple);
  // `result` reports the short count.
  void ShortenNextReads(uint32_t file, uint32_t count, uint32_t bytes);
  // The next `count` Syncs of `file` fail with `error` (and make nothing durable).
  void FailNextSync(uint32_t file, uint32_t count, int error);
  // XORs every byte of [offset, offset + len) with `mask`, in the visible and in the durable
  // contents (media corruption: it survives a crash). The range must lie within the file.
  void Corrupt(uint32_t file, uint64_t offset, uint64_t len, uint8_t mask = 0xff);

  // --- Crashes. ---
  // From now until Restart, every read and write completes with -EIO and every Sync fails: the
  // machine is off. Use it to stop a store in its tracks before dropping it.
  void PowerCut();
  enum class CrashMode { kDropUnsynced, kTear };
  // Brings the disk back as after a power cut at this instant: pages written since their file's
  // last Sync are dropped (kDropUnsynced) or each independently kept or dropped (kTear, chosen by
  // `seed`). Clears PowerCut. Call with no batch in flight.
  void Restart(CrashMode mode = CrashMode::kDropUnsynced, uint64_t seed = 0);
  // PowerCut() then Restart().
  void SimulateCrash(CrashMode mode = CrashMode::kDropUnsynced, uint64_t seed = 0);

  // --- Inspection, bypassing faults and volatility rules. ---
  // The visible bytes of [offset, offset + len); the range must lie within the file.
  std::string Peek(uint32_t file, uint64_t offset, uint64_t len) const;
  // Pages of `file` written since its last Sync.
  uint64_t UnsyncedPages(uint32_t file) const;

  struct Counts {
    uint64_t reads = 0, writes = 0, syncs = 0, bytes_read = 0, bytes_written = 0, faults = 0;
  };
  Counts counts(uint32_t file) const;

  // Used by MemoryBackend: performs one checked request (sets r.result) / one Sync.
  void Apply(IoRequest& r);
  absl::Status Sync(uint32_t file);

 private:
  struct File;
  explicit MemoryDisk(std::vector<uint64_t> sizes);
  void ReadPages(File& f, uint64_t offset, uint8_t* out, uint64_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WritePages(File& f, uint64_t offset, const uint8_t* in, uint64_t len)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<uint64_t> sizes_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<File>> files_ ABSL_GUARDED_BY(mu_);
  bool powered_off_ ABSL_GUARDED_BY(mu_) = false;
};

class MemoryBackend final : public IoBackend {
 public:
  // A backend over a fresh disk of `file_sizes` (see MemoryDisk::Create for errors).
  static absl::StatusOr<std::unique_ptr<MemoryBackend>> Create(std::vector<uint64_t> file_sizes);
  // A backend over `disk`, which it shares (the disk lives as long as its last owner).
  static std::unique_ptr<MemoryBackend> CreateOn(std::shared_ptr<MemoryDisk> disk);
  // Completes every submitted batch (runs each `done`), then stops the worker. If paused, resumes.
  ~MemoryBackend() override;

  std::string_view name() const override { return "memory"; }
  uint32_t num_files() const override { return disk_->num_files(); }
  uint64_t file_size(uint32_t file) const override { return disk_->file_size(file); }
  // Accepts any non-empty region (there is nothing to pin); FAILED_PRECONDITION on a second call.
  [[nodiscard]] absl::Status RegisterBuffer(absl::Span<uint8_t> region) override;
  void Submit(absl::Span<IoRequest> batch, std::function<void()> done) override;
  // INVALID_ARGUMENT for a bad index; INTERNAL for an injected failure or while powered off.
  [[nodiscard]] absl::Status Sync(uint32_t file) override;

  // While paused, submitted batches wait (none completes) until SetPaused(false): lets a test look
  // at a caller with I/O in flight.
  void SetPaused(bool paused);
  // Batches submitted and not yet completed.
  size_t queued_batches() const;

  MemoryDisk& disk() { return *disk_; }
  const std::shared_ptr<MemoryDisk>& shared_disk() const { return disk_; }

 private:
  struct Job {
    absl::Span<IoRequest> batch;
    std::function<void()> done;
  };
  explicit MemoryBackend(std::shared_ptr<MemoryDisk> disk);
  void Run();

  const std::shared_ptr<MemoryDisk> disk_;
  mutable absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  size_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_MEMORY_BACKEND_H_

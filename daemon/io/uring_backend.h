// The "uring" I/O backend: io_uring over O_DIRECT pool files, one ring and one owner thread per
// file.
//
// Submit() splits a batch by file and posts each part to that file's ring owner (uring_owner.h:
// one ring and one owner thread per file, handed work through a mutex-guarded mailbox). The owner
// keeps up to `queue_depth` requests in flight on its ring, issuing them in the order they
// arrived (which class goes first is the scheduler's policy, daemon/datapath/scheduler.h; the one
// exception is the tmpfs read cap, UringOptions::memory_read_workers), submits everything it has
// prepared with one io_uring_enter, reaps all available completions at once, and runs a batch's
// `done` when the last part of the batch finishes. The pool files are registered with each ring
// (IOSQE_FIXED_FILE); a buffer registered through RegisterBuffer is used with IORING_OP_READ_FIXED
// / WRITE_FIXED for requests that lie inside it.
//
// Pool files on tmpfs: see UringOptions::memory_read_workers and memory_read_rings.
//
// Short transfers: a transfer that moves fewer bytes than asked (a 4 KiB multiple) is retried once
// for the remainder; if that is short too, `result` holds the bytes moved so far. Errors are
// -errno.
//
// Latency note: while requests are in flight the owner thread sleeps in the kernel until a
// completion arrives. A batch posted then wakes it at once when only writes are in flight (a read
// behind a long write starts now), and otherwise starts with the next completion (uring_owner.h).
//
// Thread-safety: as IoBackend. Each ring is touched only by its owner thread (uring_owner.h).
#ifndef TUTTI_DAEMON_IO_URING_BACKEND_H_
#define TUTTI_DAEMON_IO_URING_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/io/io_backend.h"

namespace tutti::io {

struct UringOptions {
  uint32_t queue_depth = 64;  // requests in flight per file, 1 .. 4096
  // Pool files on tmpfs only (reads there are memory copies that never block, which io_uring
  // runs one after another on a single worker per file): reads are issued as IOSQE_ASYNC, at most
  // this many in flight per file, so as many io_uring workers copy at once (io_uring's own cap on
  // workers was seen not to hold). 1 (plain submission) .. 64. Other files ignore it. Writes
  // queued behind reads that this cap holds back are issued meanwhile (one of the two places a
  // backend issues out of arrival order, memory_read_rings the other; issue_queue.h says why that
  // is safe and why it stays).
  uint32_t memory_read_workers = 16;
  // Pool files on tmpfs only: the rings (each with its own owner thread, and so its own io_uring
  // workers) a file's reads are spread over, round-robin by request; the file's writes stay on
  // its first ring, and memory_read_workers is shared out between the rings. With one ring, the
  // reads one io_uring_enter submits at once may all wake the same idle worker (io_uring wakes
  // the first idle one it finds, which stays idle until it runs), so fewer workers copy than
  // reads are in flight; each ring has workers of its own. Reads and writes of a file on
  // different rings may then be issued in either order, which is safe for the reason the
  // memory_read_workers pass is (issue_queue.h). 1 (one ring per file) .. 16.
  uint32_t memory_read_rings = 1;
};

// Counts since creation, summed over files. Approximate while I/O is running.
struct UringCounters {
  uint64_t fixed_buffer_ops = 0;  // issued as READ_FIXED / WRITE_FIXED
  uint64_t plain_buffer_ops = 0;  // issued as READ / WRITE
  uint64_t short_retries = 0;     // remainders re-issued after a short transfer
  uint64_t enter_calls = 0;       // io_uring_enter system calls (submit and/or wait)
  uint64_t in_flight_sum = 0;     // requests in flight at each of those calls, summed:
                                  // in_flight_sum / enter_calls is the mean queue depth kept
  uint64_t memory_files = 0;      // files on tmpfs read by up to memory_read_workers workers
  uint64_t max_memory_reads_in_flight = 0;  // most reads in flight at once on one ring of them
  uint64_t memory_read_rings = 0;           // rings over tmpfs files that have issued a read
};

class UringBackend final : public IoBackend {
 public:
  // Takes ownership of `fds` (pool files opened with O_DIRECT, in pool order; regular files or
  // block devices) in every case: they are closed on error and when the backend is destroyed. File
  // sizes are read once, here (fstat, or BLKGETSIZE64 for a block device). Errors: INVALID_ARGUMENT
  // for no fds or a queue depth or memory option out of range; the errno text for a file that
  // cannot be sized or duplicated for another ring;
  // UNAVAILABLE if io_uring cannot be set up (kernel too old, or disabled by
  // /proc/sys/kernel/io_uring_disabled, or a seccomp filter).
  static absl::StatusOr<std::unique_ptr<UringBackend>> Create(std::vector<int> fds,
                                                              const UringOptions& options);
  // Waits for every submitted batch to complete (each `done` runs), stops the threads, closes fds.
  ~UringBackend() override;

  std::string_view name() const override { return "uring"; }
  uint32_t num_files() const override { return static_cast<uint32_t>(sizes_.size()); }
  uint64_t file_size(uint32_t file) const override { return sizes_[file]; }

  // Registers `region` with every ring (split into io_uring's 1 GiB pieces), all or nothing.
  // FAILED_PRECONDITION once a buffer is registered; RESOURCE_EXHAUSTED when the kernel refuses to
  // pin the memory (it charges RLIMIT_MEMLOCK once per ring, so once per file, or
  // memory_read_rings times for a tmpfs file, unless the process has CAP_IPC_LOCK); INTERNAL
  // otherwise. After an error nothing is registered, I/O keeps working with plain reads
  // and writes, and the call may be retried. May be called while I/O is in flight.
  // Back `region` with huge pages (AlignedBuffer(bytes, HugePages::kPrefer)): with 4 KiB pages a
  // transfer reaches the device in as many segments as its pages are physically scattered, which
  // cost 10-25% of 32 KiB random-read throughput on a virtio disk (bench/io_bench.cc).
  [[nodiscard]] absl::Status RegisterBuffer(absl::Span<uint8_t> region) override;
  void Submit(absl::Span<IoRequest> batch, std::function<void()> done) override;
  // fdatasync on the calling thread. INVALID_ARGUMENT for a bad index; INTERNAL on failure.
  [[nodiscard]] absl::Status Sync(uint32_t file) override;

  UringCounters counters() const;
  // tutti_io_uring_*: counters() as families.
  void RegisterStats(stats::Registry* registry) const override;

 private:
  class FileQueue;
  // One pool file: its rings, rings_[first, first + count) (the first takes its writes), and
  // where its next read goes.
  struct File {
    uint32_t first = 0;
    uint32_t count = 1;
    std::atomic<uint32_t> next_read{0};
  };
  explicit UringBackend(std::vector<uint64_t> sizes);

  std::vector<uint64_t> sizes_;
  std::vector<std::unique_ptr<FileQueue>> rings_;  // every file's, in file order
  std::unique_ptr<File[]> files_;                  // sizes_.size() of them
  std::atomic<bool> buffer_registered_{false};
};

// CreateUringBackend is UringBackend::Create, returned through the interface.
absl::StatusOr<std::unique_ptr<IoBackend>> CreateUringBackend(std::vector<int> fds,
                                                              const UringOptions& options = {});

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_URING_BACKEND_H_

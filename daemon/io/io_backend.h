// The I/O backend seam: every byte between the daemon and its pool files goes through one of these.
//
// Implementations: "uring" (io_uring, O_DIRECT, one ring and one owner thread per pool file),
// "uring_cmd" (NVMe passthrough commands through io_uring on the namespaces' char devices), "nvme"
// (tuttid's own NVMe driver over vfio, daemon/io/nvme), "gds" (cuFile), and "memory" (files in
// host memory, with fault injection and crash simulation, for tests), listed in
// backend_registry.h. Start-up opens one with OpenIoBackend (io_factory.h), which applies the one
// fallback rule (backend_choice.h) when the configured one cannot run here; CreateIoBackend
// makes one by name without it. The per-device scheduler (daemon/datapath/scheduler.h) is what
// orders reads before writes across the daemon's requests; it hands a backend its work.
//
// Thread-safety: Submit, Execute and Sync may be called from any thread, concurrently. Each
// backend owns its queues (one owner thread per pool file or device for "uring", "uring_cmd",
// "gds" and "nvme"; one worker for "memory"); other threads hand them work by message.
#ifndef TUTTI_DAEMON_IO_IO_BACKEND_H_
#define TUTTI_DAEMON_IO_IO_BACKEND_H_

#include <cstdint>
#include <functional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace tutti::stats {
class Registry;
}  // namespace tutti::stats

namespace tutti::io {

inline constexpr uint32_t kAlignment = 4096;

enum class Op : uint8_t { kRead, kWrite };

// Where a request's buffer (IoRequest::buf) lives.
enum class MemoryKind : uint8_t { kHost, kDevice };

// One transfer. `offset`, `len` and `buf` must be multiples of kAlignment (O_DIRECT).
struct IoRequest {
  Op op = Op::kRead;
  uint32_t file = 0;    // index of the pool file, < num_files()
  uint64_t offset = 0;  // byte offset in that file
  void* buf = nullptr;  // caller-owned; must stay valid until the batch completes
  uint32_t len = 0;
  // Out: bytes transferred (== len on success; less on a short transfer) or -errno.
  int64_t result = 0;
};

class IoBackend {
 public:
  virtual ~IoBackend() = default;

  // The backend's name as configured ("uring", "memory").
  virtual std::string_view name() const = 0;
  virtual uint32_t num_files() const = 0;
  // Size in bytes of `file`.
  virtual uint64_t file_size(uint32_t file) const = 0;

  // Whether requests' buffers may be `kind` memory: what the backend can read into and write
  // from. Every backend today takes host memory only ("gds" included: tuttid's staging is pinned
  // host memory, docs/nvme.md); one that can move bytes straight into device memory (a GPUDirect
  // path) answers true for kDevice, and the datapath may then give it device staging
  // (datapath::MemoryKind) instead of asking which backend it is.
  virtual bool ReadsInto(MemoryKind kind) const { return kind == MemoryKind::kHost; }

  // Registers `region` as the staging memory most requests will use, so the backend can pin and
  // pre-map it (io_uring fixed buffers). Call at most once, before the first Submit; `region` must
  // outlive the backend. Requests outside the region still work, more slowly. Returns an error if
  // registration failed; the backend stays usable without it.
  [[nodiscard]] virtual absl::Status RegisterBuffer(absl::Span<uint8_t> region) = 0;

  // Starts every request of `batch` and returns at once. When all of them have completed (each
  // one's `result` set), `done` runs once, on a backend thread: keep it short. `batch` (the span's
  // memory) and every buffer must stay valid until `done` runs. A file's requests are issued in the
  // order they arrived (a plain executor: the per-device scheduler, daemon/datapath/scheduler.h,
  // is what puts reads before writes). The exceptions are "uring"'s on tmpfs files only: a cap on
  // reads in flight, which lets later writes pass the reads it holds
  // (UringOptions::memory_read_workers; issue_queue.h says why it stays), and, where a file's reads
  // are spread over several rings (UringOptions::memory_read_rings), its reads and writes in either
  // order, which is safe for the same reason. Requests in flight together may complete in any
  // order. Invalid requests (unaligned, out of range, bad file index) complete with -EINVAL.
  virtual void Submit(absl::Span<IoRequest> batch, std::function<void()> done) = 0;

  // Submit, then wait for completion. Returns when every request's `result` is set.
  void Execute(absl::Span<IoRequest> batch);

  // Registers the backend's own counters (families named tutti_io_<backend>_*, docs/metrics.md)
  // in `registry`, read from the backend at each collection. Call at most once; the backend must
  // outlive every collection of `registry`. Backends with no counters of their own register none.
  virtual void RegisterStats(stats::Registry* registry) const { (void)registry; }

  // Makes every write to `file` that completed before this call durable (fdatasync).
  // Returns an error (INTERNAL with the errno text) if the sync failed: treat those writes as lost.
  [[nodiscard]] virtual absl::Status Sync(uint32_t file) = 0;
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_IO_BACKEND_H_

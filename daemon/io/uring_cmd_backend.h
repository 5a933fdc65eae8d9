// The "uring_cmd" I/O backend: io_uring NVMe passthrough (IORING_OP_URING_CMD with
// NVME_URING_CMD_IO) on the kernel's NVMe generic char devices (/dev/ngXnY), for hosts that keep
// the kernel's nvme driver but want tuttid's I/O to skip the block layer. Each namespace is one
// pool "file": byte offset o of the file is LBA o / lba_size of the namespace (the pool on a raw
// namespace: daemon/pool/FORMAT.md).
//
// Structure and contracts are those of the "uring" backend (uring_backend.h), with the same ring
// owner (uring_owner.h): one ring and one owner thread per namespace; Submit splits a batch by
// namespace and posts each part to its owner; the owner keeps up to `queue_depth` commands in
// flight, issuing them in arrival order (the scheduler orders reads and writes), submits all it
// prepared with one io_uring_enter, reaps every completion at once, and runs a batch's `done` when
// its last part finishes. Rings are set up with IORING_SETUP_SQE128 | IORING_SETUP_CQE32 (an NVMe
// command does not fit a 64-byte SQE); the namespaces are registered files; a buffer given to
// RegisterBuffer is registered in pieces of 256 KiB (more where it would take more than io_uring's
// 16384 buffers) and used through IORING_URING_CMD_FIXED, commands cut at piece boundaries: Linux
// 6.1 refuses (EINVAL) a fixed-buffer command whose registered buffer has more pages from the
// command's start to its end than the queue has segments. Should the kernel still refuse one, that
// command is re-issued with a plain buffer, as are all later ones on that namespace (logged once,
// counted in fixed_buffer_refusals).
//
// A request larger than the namespace's largest transfer (MDTS, capped by
// UringCmdOptions::max_transfer_bytes) is split into several commands; it completes when the last
// one does, with `len` or the first error. NVMe has no short transfers. Errors: -errno for a
// request the kernel refused, and for a command the controller failed the errno of
// nvme_cmd::StatusToErrno (-ERANGE for an LBA out of range, -EIO for media errors, ...); each
// controller error is logged (rate-limited) with its NVMe status (SCT, SC, DNR), the namespace,
// the opcode and the LBAs.
//
// Sync sends an NVMe Flush (a synchronous passthrough ioctl on the calling thread) when the
// controller reports a volatile write cache (Identify Controller VWC), and does nothing otherwise:
// a completed write is then already durable.
//
// Privileges: on kernels before 6.2 every NVMe passthrough command needs CAP_SYS_ADMIN; from 6.2
// I/O commands need only write access to the char device, but Identify (admin) still needs
// CAP_SYS_ADMIN unless the kernel allows it for the opener.
//
// Thread-safety: as IoBackend. Each ring is touched only by its owner thread (uring_owner.h).
#ifndef TUTTI_DAEMON_IO_URING_CMD_BACKEND_H_
#define TUTTI_DAEMON_IO_URING_CMD_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/io/io_backend.h"

namespace tutti::io {

struct UringCmdOptions {
  uint32_t queue_depth = 64;               // commands in flight per namespace, 1 .. 4096
  uint32_t max_transfer_bytes = 256 << 10;  // cap on one command (a multiple of 4096); the
                                            // controller's MDTS may lower it further
  // Tests only: bytes served past each namespace's end, so that requests there pass the backend's
  // range check and reach the controller's own (an out-of-range LBA error). 0 in production.
  uint64_t test_extra_bytes = 0;
};

// What Create found out about one namespace.
struct NamespaceInfo {
  std::string device;  // the char device's path, e.g. "/dev/ng0n1"
  uint32_t nsid = 0;
  uint32_t lba_bytes = 0;
  uint64_t bytes = 0;  // namespace capacity
  bool volatile_write_cache = false;
  uint32_t max_transfer_bytes = 0;
};

// Counts since creation, summed over namespaces. Approximate while I/O is running.
struct UringCmdCounters {
  uint64_t commands = 0;          // NVMe I/O commands issued
  uint64_t fixed_buffer_ops = 0;  // of them, with IORING_URING_CMD_FIXED
  uint64_t controller_errors = 0; // completions with a non-zero NVMe status
  uint64_t fixed_buffer_refusals = 0;  // fixed-buffer commands the kernel refused, re-issued plain
  uint64_t flushes = 0;           // NVMe Flush commands sent by Sync
};

// Opens `paths` (NVMe generic char devices) O_RDWR, in order. NOT_FOUND for a missing path,
// PERMISSION_DENIED when it may not be opened, FAILED_PRECONDITION for a path that is not a char
// device (the message suggests /dev/ngXnY for a block device /dev/nvmeXnY), INTERNAL for any other
// errno. On error no fd stays open; on success the caller owns the fds.
absl::StatusOr<std::vector<int>> OpenPassthroughDevices(const std::vector<std::string>& paths);

class UringCmdBackend final : public IoBackend {
 public:
  // Takes ownership of `fds` (from OpenPassthroughDevices, in pool order) in every case: they are
  // closed on error and when the backend is destroyed. Reads each namespace's geometry (NVMe
  // Identify Namespace and Controller through NVME_IOCTL_ADMIN_CMD). Errors: INVALID_ARGUMENT for
  // no fds or an option out of range; FAILED_PRECONDITION for an fd that is not an NVMe namespace
  // or a namespace this backend cannot use (metadata, LBA size); PERMISSION_DENIED when the kernel
  // refuses the passthrough (CAP_SYS_ADMIN); UNAVAILABLE when io_uring cannot run NVMe
  // passthrough here (no SQE128/CQE32 rings or no IORING_OP_URING_CMD: kernels before 5.19, or
  // io_uring disabled). Messages name the device.
  static absl::StatusOr<std::unique_ptr<UringCmdBackend>> Create(std::vector<int> fds,
                                                                 const UringCmdOptions& options);
  // Waits for every submitted batch to complete (each `done` runs), stops the threads, closes fds.
  ~UringCmdBackend() override;

  std::string_view name() const override { return "uring_cmd"; }
  uint32_t num_files() const override { return static_cast<uint32_t>(sizes_.size()); }
  // The namespace's capacity in bytes (plus UringCmdOptions::test_extra_bytes).
  uint64_t file_size(uint32_t file) const override { return sizes_[file]; }
  const NamespaceInfo& info(uint32_t file) const { return infos_[file]; }

  // As UringBackend::RegisterBuffer: all rings or none; FAILED_PRECONDITION once registered,
  // RESOURCE_EXHAUSTED when the kernel refuses to pin it (RLIMIT_MEMLOCK), INTERNAL otherwise.
  [[nodiscard]] absl::Status RegisterBuffer(absl::Span<uint8_t> region) override;
  // Requests must also be aligned to the namespace's LBA size (always so for 4 KiB-aligned ones).
  void Submit(absl::Span<IoRequest> batch, std::function<void()> done) override;
  // NVMe Flush if the controller has a volatile write cache, else nothing. INVALID_ARGUMENT for a
  // bad index; INTERNAL with the errno or the NVMe status if the flush failed.
  [[nodiscard]] absl::Status Sync(uint32_t file) override;

  UringCmdCounters counters() const;
  // tutti_io_uring_cmd_*: counters() as families.
  void RegisterStats(stats::Registry* registry) const override;

 private:
  class NamespaceQueue;
  UringCmdBackend() = default;

  std::vector<uint64_t> sizes_;
  std::vector<NamespaceInfo> infos_;
  std::vector<std::unique_ptr<NamespaceQueue>> queues_;
  // Bytes of the next command of a request at `buf` with `left` bytes to go: at most `max`, and
  // ending at the registered region's next piece boundary when `buf` lies in it.
  uint32_t ChunkBytes(const uint8_t* buf, uint32_t left, uint32_t max) const;

  std::atomic<bool> buffer_registered_{false};
  std::atomic<const uint8_t*> region_base_{nullptr};  // set once RegisterBuffer succeeded
  std::atomic<uint64_t> region_len_{0}, piece_bytes_{0};
  std::atomic<uint64_t> flushes_{0};
};

}  // namespace tutti::io

#endif  // TUTTI_DAEMON_IO_URING_CMD_BACKEND_H_

// tuttid's NVMe controller driver (CPU side): bring-up over the hardware seam (device.h), the
// admin queue, Identify, I/O queue pairs (queue_pair.h), descriptors for registered DMA regions,
// Abort, controller reset with re-creation of the queues, and orderly shutdown.
//
// Bring-up (Create): CC.EN = 0 and wait for CSTS.RDY = 0 (timeout CAP.TO); admin queue (AQA, ASQ,
// ACQ); CC.EN = 1 with 4 KiB pages and 64/16-byte entries, wait for RDY = 1; Identify controller
// and namespace; Set Features (Number of Queues); create the I/O CQ/SQ pairs.
//
// Errors are absl::Status naming the controller, the command and the NVMe status in words:
// DEADLINE_EXCEEDED (a register wait or admin command timed out), UNAVAILABLE (CSTS.CFS: the
// controller is fatal -- Reset), FAILED_PRECONDITION (the controller refused a field: invalid
// field/opcode/namespace/queue id/size, or an unsupported page size), INTERNAL (other statuses).
//
// Thread-safety: Create, Reset, Shutdown and the destructor change every queue pair: call them
// while no other thread is inside a QueuePair call (a queue pair's own owner may call Reset; it
// does so itself from Poll when a timed-out command cannot be aborted). Abort, AdminCommand,
// Fatal and the accessors are safe from any thread (the admin queue is under a mutex; it is the
// control plane, not the I/O path). Each QueuePair has one owner thread (queue_pair.h).
#ifndef TUTTI_DAEMON_IO_NVME_CONTROLLER_H_
#define TUTTI_DAEMON_IO_NVME_CONTROLLER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "daemon/io/nvme/descriptors.h"
#include "daemon/io/nvme/device.h"
#include "daemon/io/nvme/queue.h"
#include "daemon/io/nvme/spec.h"

namespace tutti::io::nvme {

class QueuePair;

struct ControllerOptions {
  std::string name = "nvme0";  // log and error prefix
  uint32_t nsid = 1;
  uint32_t io_queues = 1;         // queue pairs wanted (fewer if the controller grants fewer)
  uint32_t io_queue_depth = 256;  // entries per queue (at most CAP.MQES + 1)
  uint32_t admin_queue_depth = 32;
  uint32_t max_transfer = 128 * 1024;  // bytes per command, further limited by Identify MDTS
  bool use_sgl = true;                 // use SGLs where the controller supports them
  int64_t admin_timeout_ms = 5000;
  int64_t io_timeout_ms = 5000;  // per command, from submission (queue_pair.h)
  Clock* clock = nullptr;        // timeouts and register waits; null: Clock::Real()
};

struct ControllerInfo {
  std::string serial, model, firmware;  // Identify SN, MN, FR, trailing spaces removed
  uint32_t version = 0;                 // VS
  uint32_t max_queue_entries = 0;       // CAP.MQES + 1
  uint32_t doorbell_stride = 0;         // CAP.DSTRD
  uint32_t ready_timeout_ms = 0;        // CAP.TO
  uint32_t mdts_bytes = 0;              // Identify MDTS as bytes; 0: no limit
  uint32_t num_namespaces = 0;          // Identify NN
  bool volatile_write_cache = false;    // Identify VWC bit 0
  bool sgl = false;                     // Identify SGLS [1:0] != 0
};

struct NamespaceInfo {
  uint32_t nsid = 0;
  uint64_t blocks = 0;     // NSZE
  uint32_t lba_shift = 0;  // LBADS of the format in use
  uint32_t lba_size() const { return 1u << lba_shift; }
};

class Controller {
 public:
  // Brings the controller up (see above). `regs` and `dma` must outlive the result.
  static absl::StatusOr<std::unique_ptr<Controller>> Create(const ControllerOptions& options,
                                                            RegisterSpace* regs, DmaAllocator* dma);
  // Shuts down (Shutdown) if that was not done.
  ~Controller();

  const ControllerInfo& info() const { return info_; }
  const NamespaceInfo& ns() const { return ns_; }
  const ControllerOptions& options() const { return options_; }
  // Bytes per command the driver allows: min(options.max_transfer, MDTS).
  uint32_t max_transfer() const { return desc_options_.max_transfer; }
  bool uses_sgl() const { return desc_options_.use_sgl; }

  uint32_t num_queue_pairs() const { return static_cast<uint32_t>(queue_pairs_.size()); }
  // Queue pair i (qid i + 1), owned by the controller; valid until it is destroyed.
  QueuePair* queue_pair(uint32_t i) { return queue_pairs_[i].get(); }

  // Builds the descriptors (SGL or PRP, as the controller allows) for `buffer`, which must
  // outlive the result; the result must not outlive the controller. See descriptors.h.
  absl::StatusOr<std::unique_ptr<RegisteredRegion>> Register(const DmaBuffer& buffer);

  // Sends Abort for command `cid` of SQ `sqid`. OK with *aborted set to whether the controller
  // says it aborted it (the command then completes with "Command Abort Requested"); errors as
  // for any admin command.
  [[nodiscard]] absl::Status Abort(uint16_t sqid, uint16_t cid, bool* aborted);

  // Controller reset: disable, fail every in-flight I/O command with -EIO (-ETIMEDOUT for those
  // that timed out), admin queue again, enable, re-create the I/O queue pairs on the same memory.
  // Requests not yet submitted stay queued and go out afterwards. On failure the controller is
  // unusable: every later I/O completes with -EIO.
  [[nodiscard]] absl::Status Reset();
  uint64_t resets() const;

  // Orderly shutdown: delete the I/O queues, CC.SHN = normal, wait for CSTS.SHST = complete. The
  // controller is then left for the kernel driver to take back; I/O afterwards completes -EIO.
  [[nodiscard]] absl::Status Shutdown();

  // CSTS.CFS is set (the controller needs a reset).
  bool Fatal() const;

  // Runs one admin command and waits for it; returns its completion DW0. `what` names it in errors.
  absl::StatusOr<uint32_t> AdminCommand(Sqe sqe, absl::string_view what);

 private:
  friend class QueuePair;
  Controller(const ControllerOptions& options, RegisterSpace* regs, DmaAllocator* dma);
  absl::Status Init();
  absl::Status Disable();
  absl::Status Enable();
  absl::Status WaitReady(bool ready, absl::string_view what);
  absl::Status IdentifyController();
  absl::Status IdentifyNamespace();
  absl::Status CreateQueuePairs(uint32_t wanted);
  absl::Status CreateIoQueues(QueuePair* qp);
  absl::StatusOr<Cqe> AdminLocked(Sqe sqe, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RingDoorbell(volatile uint32_t* direct, uint32_t offset, uint32_t value);
  absl::Status Refused(absl::string_view what, uint16_t status) const;

  const ControllerOptions options_;
  RegisterSpace* const regs_;
  DmaAllocator* const dma_;
  Clock* const clock_;
  uint64_t cap_ = 0;
  ControllerInfo info_;
  NamespaceInfo ns_;
  DescriptorOptions desc_options_;
  std::unique_ptr<DmaBuffer> admin_sq_mem_, admin_cq_mem_, identify_mem_;
  std::vector<std::unique_ptr<QueuePair>> queue_pairs_;
  bool usable_ = false;  // false after a failed reset or a shutdown
  bool shut_down_ = false;
  uint32_t granted_queues_ = 0;

  mutable absl::Mutex mu_;  // the admin queue
  QueueRing admin_ ABSL_GUARDED_BY(mu_);
  uint16_t next_admin_cid_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t resets_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tutti::io::nvme

#endif  // TUTTI_DAEMON_IO_NVME_CONTROLLER_H_

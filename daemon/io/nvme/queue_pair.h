// The CPU driver of one NVMe I/O queue pair: submits batches of reads and writes, polls their
// completions by phase bit, enforces per-command timeouts (timeout -> Abort -> if that fails or
// the command still does not complete, controller reset), and reports each request's result.
//
// THE RULE: one owner thread per queue pair. Only that thread calls Submit, Poll, Execute and
// Flush; other threads hand it work by message. Nothing here locks (debug builds assert the rule).
// The ring bookkeeping is queue.h's, shared with GPU-initiated submission (bench/nvme_gpu).
#ifndef TUTTI_DAEMON_IO_NVME_QUEUE_PAIR_H_
#define TUTTI_DAEMON_IO_NVME_QUEUE_PAIR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/io/nvme/controller.h"
#include "daemon/io/nvme/descriptors.h"
#include "daemon/io/nvme/queue.h"

namespace tutti::io::nvme {

enum class NvmeOp : uint8_t { kRead, kWrite, kFlush };

// One command. The caller owns it; it must stay valid (not move) until `done`.
struct NvmeRequest {
  NvmeOp op = NvmeOp::kRead;
  uint64_t lba = 0;
  uint32_t blocks = 0;                       // LBAs (bytes = blocks * lba_size)
  const RegisteredRegion* region = nullptr;  // where the data lands / comes from
  uint64_t offset = 0;                       // byte offset in the region
  // Out. result: bytes transferred, or -errno (status_text.h StatusToErrno; -ETIMEDOUT for a
  // command that timed out and was aborted or reset away; -EIO for one lost to a reset or a
  // controller that is down; -EINVAL for a request that cannot be encoded). status: the NVMe
  // status (SCT << 8 | SC) when the controller returned one, else 0.
  int64_t result = 0;
  uint16_t status = 0;
  bool done = false;
};

class QueuePair {
 public:
  uint16_t qid() const { return ring_.qid; }
  // Commands in flight at most: depth - 1.
  uint32_t depth() const { return depth_; }
  // Submitted to the controller and not yet completed / queued here waiting for a free slot.
  size_t in_flight() const { return in_flight_; }
  size_t waiting() const { return waiting_.size(); }

  // Queues every request of `batch` (done = false) and submits as many as the ring has slots for,
  // ringing the doorbell once; the rest go out from Poll as slots free up. A request that cannot
  // be encoded (bad region extent, too long for max_transfer, zero blocks) completes at once with
  // -EINVAL. Returns at once.
  void Submit(absl::Span<NvmeRequest> batch);

  // Reaps completions (any order), submits waiting requests, and handles timeouts. Returns the
  // number of requests that completed during the call.
  size_t Poll();

  // Submit, then Poll until every request of `batch` is done.
  void Execute(absl::Span<NvmeRequest> batch);

  // Flush (NVM opcode 0) when the controller has a volatile write cache, waiting for it; OK at
  // once without sending anything when it has none. INTERNAL naming the NVMe status (or the errno)
  // on failure: treat writes completed before the call as not durable.
  [[nodiscard]] absl::Status Flush();

  // The ring, for a GPU-side owner that takes the queue over (read only here).
  const QueueRing& ring() const { return ring_; }
  uint64_t sq_iova() const { return sq_mem_->iova(); }
  uint64_t cq_iova() const { return cq_mem_->iova(); }

 private:
  friend class Controller;
  struct Tracker {
    NvmeRequest* request = nullptr;
    int64_t submitted_ms = 0;
    int64_t abort_ms = 0;
    bool abort_sent = false;
  };

  QueuePair(Controller* controller, uint16_t qid, uint32_t depth, std::unique_ptr<DmaBuffer> sq,
            std::unique_ptr<DmaBuffer> cq);
  void ResetRing();         // after (re)creation: zeroed CQ, tail = head = 0, phase 1
  void FailInFlight();      // every tracked command: -ETIMEDOUT if it timed out, else -EIO
  void FailAll(int error);  // in flight and waiting
  void Pump();
  bool Encode(NvmeRequest* r, uint16_t cid, Sqe* e) const;
  void Complete(uint16_t cid, uint16_t status);
  void Finish(NvmeRequest* r, int64_t result, uint16_t status);
  void CheckTimeouts();
  void Recover(const char* why);
  void AssertOwner();

  Controller* const controller_;
  const uint32_t depth_;
  const std::unique_ptr<DmaBuffer> sq_mem_, cq_mem_;
  volatile uint32_t* sq_doorbell_;  // direct doorbell pointers, or null: RegisterSpace::Write32
  volatile uint32_t* cq_doorbell_;
  uint32_t sq_doorbell_offset_, cq_doorbell_offset_;
  QueueRing ring_;
  std::vector<Tracker> trackers_;  // by CID
  std::vector<uint16_t> free_cids_;
  std::deque<NvmeRequest*> waiting_;
  size_t in_flight_ = 0;
  std::thread::id owner_;
};

}  // namespace tutti::io::nvme

#endif  // TUTTI_DAEMON_IO_NVME_QUEUE_PAIR_H_

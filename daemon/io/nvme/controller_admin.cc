// The controller's admin queue, I/O queue creation, Abort, reset and shutdown.
#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/io/nvme/controller.h"
#include "daemon/io/nvme/queue_pair.h"
#include "daemon/io/nvme/status_text.h"

namespace tutti::io::nvme {

void Controller::RingDoorbell(volatile uint32_t* direct, uint32_t offset, uint32_t value) {
  if (direct != nullptr) {
    PublishDoorbell(direct, value);
  } else {
    regs_->Write32(offset, value);
  }
}

absl::Status Controller::Refused(absl::string_view what, uint16_t status) const {
  std::string msg = absl::StrCat(options_.name, ": ", what, " failed: ", StatusText(status));
  switch (status) {
    case kStatusInvalidOpcode:
    case kStatusInvalidField:
    case kStatusInvalidNamespace:
    case kStatusInvalidQueueId:
    case kStatusInvalidQueueSize:
    case kStatusInvalidCqId:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::StatusOr<uint32_t> Controller::AdminCommand(Sqe sqe, absl::string_view what) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Cqe c, AdminLocked(sqe, what));
  uint16_t status = CqeStatus(c.dw3);
  if (status != kStatusSuccess) return Refused(what, status);
  return c.dw0;
}

// Submits `sqe` with a fresh CID and polls the admin CQ until its completion arrives (others are
// stale completions of commands that timed out, and are dropped), the timeout passes, or the
// controller turns fatal.
absl::StatusOr<Cqe> Controller::AdminLocked(Sqe sqe, absl::string_view what) {
  if (Fatal()) {
    return absl::UnavailableError(
        absl::StrCat(options_.name, ": ", what, ": controller fatal status (CSTS.CFS) set"));
  }
  const uint16_t cid = next_admin_cid_++;
  sqe.cdw0 = (sqe.cdw0 & 0xffff) | (static_cast<uint32_t>(cid) << 16);
  if (!SqPush(&admin_.sq, sqe)) {
    return absl::ResourceExhaustedError(absl::StrCat(options_.name, ": ", what, ": admin SQ full"));
  }
  RingDoorbell(admin_.sq.doorbell, SqTailDoorbell(0, info_.doorbell_stride), admin_.sq.tail);
  const int64_t deadline = clock_->NowMs() + options_.admin_timeout_ms;
  for (uint32_t spins = 0;; ++spins) {
    Cqe c;
    while (CqPeek(admin_.cq, &c)) {
      CqPop(&admin_, c);
      RingDoorbell(admin_.cq.doorbell, CqHeadDoorbell(0, info_.doorbell_stride), admin_.cq.head);
      if (CqeCid(c.dw3) == cid) return c;
    }
    if (clock_->NowMs() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(options_.name, ": ", what,
                                                      " (admin) timed out after ",
                                                      options_.admin_timeout_ms, " ms"));
    }
    if (spins % 1024 == 1023 && Fatal()) {
      return absl::UnavailableError(absl::StrCat(
          options_.name, ": ", what, ": controller fatal status (CSTS.CFS) while waiting"));
    }
    std::this_thread::yield();
  }
}

absl::Status Controller::CreateQueuePairs(uint32_t wanted) {
  Sqe e = {};
  e.cdw0 = Cdw0(kAdminSetFeatures, 0, kPsdtPrp);
  e.cdw10 = kFeatureNumberOfQueues;
  e.cdw11 = (wanted - 1) | ((wanted - 1) << 16);
  ASSIGN_OR_RETURN(uint32_t granted, AdminCommand(e, "Set Features (Number of Queues)"));
  granted_queues_ = std::min({wanted, (granted & 0xffff) + 1, (granted >> 16) + 1});
  const uint32_t depth = std::min(options_.io_queue_depth, info_.max_queue_entries);
  for (uint32_t i = queue_pairs_.size(); i < granted_queues_; ++i) {
    ASSIGN_OR_RETURN(auto sq, dma_->Allocate(depth * sizeof(Sqe)));
    ASSIGN_OR_RETURN(auto cq, dma_->Allocate(depth * sizeof(Cqe)));
    queue_pairs_.push_back(std::unique_ptr<QueuePair>(
        new QueuePair(this, static_cast<uint16_t>(i + 1), depth, std::move(sq), std::move(cq))));
  }
  for (auto& qp : queue_pairs_) RETURN_IF_ERROR(CreateIoQueues(qp.get()));
  return absl::OkStatus();
}

// Create I/O Completion Queue, then Create I/O Submission Queue bound to it (physically
// contiguous, interrupts off: completions are polled).
absl::Status Controller::CreateIoQueues(QueuePair* qp) {
  qp->ResetRing();
  const uint32_t size_field = (qp->depth() - 1) << 16;
  Sqe cq = {};
  cq.cdw0 = Cdw0(kAdminCreateIoCq, 0, kPsdtPrp);
  cq.dptr[0] = qp->cq_iova();
  cq.cdw10 = qp->qid() | size_field;
  cq.cdw11 = kQueuePhysicallyContiguous;
  RETURN_IF_ERROR(AdminCommand(cq, absl::StrCat("Create I/O CQ ", qp->qid())).status());
  Sqe sq = {};
  sq.cdw0 = Cdw0(kAdminCreateIoSq, 0, kPsdtPrp);
  sq.dptr[0] = qp->sq_iova();
  sq.cdw10 = qp->qid() | size_field;
  sq.cdw11 = kQueuePhysicallyContiguous | (static_cast<uint32_t>(qp->qid()) << 16);
  return AdminCommand(sq, absl::StrCat("Create I/O SQ ", qp->qid())).status();
}

absl::Status Controller::Abort(uint16_t sqid, uint16_t cid, bool* aborted) {
  Sqe e = {};
  e.cdw0 = Cdw0(kAdminAbort, 0, kPsdtPrp);
  e.cdw10 = sqid | (static_cast<uint32_t>(cid) << 16);
  ASSIGN_OR_RETURN(uint32_t dw0,
                   AdminCommand(e, absl::StrCat("Abort (SQ ", sqid, " CID ", cid, ")")));
  *aborted = (dw0 & 1) == 0;
  return absl::OkStatus();
}

absl::Status Controller::Reset() {
  auto logger = log::Get("nvme");
  logger->warn("{}: controller reset (CSTS 0x{:x})", options_.name, regs_->Read32(kRegCsts));
  usable_ = false;
  absl::Status s = Disable();
  for (auto& qp : queue_pairs_) qp->FailInFlight();
  if (s.ok()) s = Enable();
  if (s.ok()) s = CreateQueuePairs(static_cast<uint32_t>(queue_pairs_.size()));
  if (s.ok() && granted_queues_ < queue_pairs_.size()) {
    s = absl::InternalError(absl::StrCat(options_.name, ": after reset the controller grants ",
                                         granted_queues_, " queue pairs, not ",
                                         queue_pairs_.size()));
  }
  {
    absl::MutexLock lock(&mu_);
    ++resets_;
  }
  if (!s.ok()) {
    logger->error("{}: reset failed, controller unusable: {}", options_.name, s.ToString());
    for (auto& qp : queue_pairs_) qp->FailAll(EIO);
    return s;
  }
  usable_ = true;
  logger->info("{}: reset done, {} queue pair(s) re-created", options_.name, queue_pairs_.size());
  return absl::OkStatus();
}

absl::Status Controller::Shutdown() {
  shut_down_ = true;
  bool was_usable = usable_;
  usable_ = false;
  for (auto& qp : queue_pairs_) qp->FailAll(EIO);
  if (was_usable && !Fatal()) {  // delete the I/O queues: SQs first, then their CQs
    for (auto& qp : queue_pairs_) {
      for (uint8_t op : {kAdminDeleteIoSq, kAdminDeleteIoCq}) {
        Sqe e = {};
        e.cdw0 = Cdw0(op, 0, kPsdtPrp);
        e.cdw10 = qp->qid();
        absl::Status s = AdminCommand(e, absl::StrCat(op == kAdminDeleteIoSq ? "Delete I/O SQ "
                                                                             : "Delete I/O CQ ",
                                                      qp->qid()))
                             .status();
        if (!s.ok()) log::Get("nvme")->warn("{}", s.ToString());
      }
    }
  }
  uint32_t cc = regs_->Read32(kRegCc);
  regs_->Write32(kRegCc, (cc & ~kCcShnMask) | kCcShnNormal);
  const int64_t deadline = clock_->NowMs() + std::max<uint32_t>(info_.ready_timeout_ms, 500);
  while ((regs_->Read32(kRegCsts) & kCstsShstMask) != kCstsShstComplete) {
    if (clock_->NowMs() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(options_.name, ": shutdown: CSTS.SHST not complete within ",
                       info_.ready_timeout_ms, " ms; CSTS 0x", absl::Hex(regs_->Read32(kRegCsts))));
    }
    std::this_thread::yield();
  }
  log::Get("nvme")->info("{}: shut down", options_.name);
  return absl::OkStatus();
}

}  // namespace tutti::io::nvme

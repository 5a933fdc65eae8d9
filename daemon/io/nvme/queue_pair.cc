#include "daemon/io/nvme/queue_pair.h"

#include <cassert>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/io/nvme/status_text.h"

namespace tutti::io::nvme {

QueuePair::QueuePair(Controller* controller, uint16_t qid, uint32_t depth,
                     std::unique_ptr<DmaBuffer> sq, std::unique_ptr<DmaBuffer> cq)
    : controller_(controller),
      depth_(depth),
      sq_mem_(std::move(sq)),
      cq_mem_(std::move(cq)),
      trackers_(depth) {
  const uint32_t stride = controller->info().doorbell_stride;
  sq_doorbell_offset_ = SqTailDoorbell(qid, stride);
  cq_doorbell_offset_ = CqHeadDoorbell(qid, stride);
  sq_doorbell_ = controller->regs_->DoorbellAddress(sq_doorbell_offset_);
  cq_doorbell_ = controller->regs_->DoorbellAddress(cq_doorbell_offset_);
  ring_.qid = qid;
  ring_.sq = SubmissionRing{reinterpret_cast<Sqe*>(sq_mem_->host()), sq_doorbell_, depth};
  ring_.cq = CompletionRing{reinterpret_cast<Cqe*>(cq_mem_->host()), cq_doorbell_, depth};
  for (uint32_t cid = depth; cid-- > 0;) free_cids_.push_back(static_cast<uint16_t>(cid));
}

void QueuePair::AssertOwner() {
#ifndef NDEBUG
  if (owner_ == std::thread::id()) owner_ = std::this_thread::get_id();
  assert(owner_ == std::this_thread::get_id() && "a QueuePair has one owner thread");
#endif
}

void QueuePair::ResetRing() {
  std::memset(cq_mem_->host(), 0, cq_mem_->size());
  ::tutti::io::nvme::ResetRing(&ring_);
}

void QueuePair::Submit(absl::Span<NvmeRequest> batch) {
  AssertOwner();
  for (NvmeRequest& r : batch) {
    r.done = false;
    r.result = 0;
    r.status = 0;
    if (!controller_->usable_) {
      Finish(&r, -EIO, 0);
    } else {
      waiting_.push_back(&r);
    }
  }
  Pump();
}

bool QueuePair::Encode(NvmeRequest* r, uint16_t cid, Sqe* e) const {
  const uint32_t nsid = controller_->ns().nsid;
  if (r->op == NvmeOp::kFlush) {
    *e = BuildFlush(cid, nsid);
    return true;
  }
  if (r->region == nullptr) return false;
  uint8_t opcode = r->op == NvmeOp::kRead ? kNvmRead : kNvmWrite;
  return BuildReadWrite(opcode, cid, nsid, r->lba, r->blocks, controller_->ns().lba_shift,
                        r->region->descriptor(), r->offset, e);
}

// Moves waiting requests into the SQ while it has slots; one doorbell write for all of them.
void QueuePair::Pump() {
  bool pushed = false;
  const int64_t now = controller_->clock_->NowMs();
  while (!waiting_.empty() && !free_cids_.empty() && SqFreeSlots(ring_.sq) > 0) {
    NvmeRequest* r = waiting_.front();
    waiting_.pop_front();
    uint16_t cid = free_cids_.back();
    Sqe e;
    if (!Encode(r, cid, &e)) {
      Finish(r, -EINVAL, 0);
      continue;
    }
    free_cids_.pop_back();
    trackers_[cid] = Tracker{r, now, 0, false};
    SqPush(&ring_.sq, e);
    ++in_flight_;
    pushed = true;
  }
  if (pushed) controller_->RingDoorbell(sq_doorbell_, sq_doorbell_offset_, ring_.sq.tail);
}

size_t QueuePair::Poll() {
  AssertOwner();
  size_t completed = 0;
  Cqe c;
  while (CqPeek(ring_.cq, &c)) {
    CqPop(&ring_, c);
    uint16_t cid = CqeCid(c.dw3);
    if (cid < depth_ && trackers_[cid].request != nullptr) {
      Complete(cid, CqeStatus(c.dw3));
      ++completed;
    } else {
      TUTTI_LOG_EVERY_N_SEC(log::Get("nvme"), spdlog::level::warn, 1.0,
                            "{} q{}: completion for unknown CID {} dropped",
                            controller_->options_.name, qid(), cid);
    }
  }
  if (completed > 0) controller_->RingDoorbell(cq_doorbell_, cq_doorbell_offset_, ring_.cq.head);
  Pump();
  if (in_flight_ > 0) CheckTimeouts();
  return completed;
}

void QueuePair::Complete(uint16_t cid, uint16_t status) {
  Tracker& t = trackers_[cid];
  NvmeRequest* r = t.request;
  bool timed_out = t.abort_sent;
  t = Tracker{};
  free_cids_.push_back(cid);
  --in_flight_;
  int64_t result;
  if (status == kStatusSuccess) {
    result = r->op == NvmeOp::kFlush
                 ? 0
                 : static_cast<int64_t>(r->blocks) << controller_->ns().lba_shift;
  } else {
    result = timed_out ? -ETIMEDOUT : -StatusToErrno(status);
    TUTTI_LOG_EVERY_N_SEC(log::Get("nvme"), spdlog::level::err, 1.0,
                          "{} q{}: {} LBA {} x {}: {} -> {}", controller_->options_.name, qid(),
                          r->op == NvmeOp::kRead    ? "read"
                          : r->op == NvmeOp::kWrite ? "write"
                                                    : "flush",
                          r->lba, r->blocks, StatusText(status),
                          std::strerror(static_cast<int>(-result)));
  }
  Finish(r, result, status);
}

void QueuePair::Finish(NvmeRequest* r, int64_t result, uint16_t status) {
  r->result = result;
  r->status = status;
  r->done = true;
}

// A command past its timeout gets an Abort; one whose Abort cannot be sent, or that still has not
// completed a timeout after its Abort, costs a controller reset. A fatal controller is reset at
// once.
void QueuePair::CheckTimeouts() {
  const int64_t now = controller_->clock_->NowMs();
  const int64_t timeout = controller_->options_.io_timeout_ms;
  for (uint16_t cid = 0; cid < depth_; ++cid) {
    Tracker& t = trackers_[cid];
    if (t.request == nullptr) continue;
    if (t.abort_sent) {
      if (now - t.abort_ms >= timeout) return Recover("no completion after Abort");
      continue;
    }
    if (now - t.submitted_ms < timeout) continue;
    if (controller_->Fatal()) return Recover("controller fatal status (CSTS.CFS)");
    log::Get("nvme")->warn("{} q{}: CID {} (LBA {}) timed out after {} ms; aborting",
                           controller_->options_.name, qid(), cid, t.request->lba, timeout);
    t.abort_sent = true;
    t.abort_ms = now;
    bool aborted = false;
    absl::Status s = controller_->Abort(qid(), cid, &aborted);
    if (!s.ok()) return Recover(s.ToString().c_str());
    if (!aborted) {
      log::Get("nvme")->warn(
          "{} q{}: CID {} not aborted by the controller; waiting one more timeout",
          controller_->options_.name, qid(), cid);
    }
  }
}

void QueuePair::Recover(const char* why) {
  log::Get("nvme")->error("{} q{}: resetting the controller: {}", controller_->options_.name, qid(),
                          why);
  absl::Status s = controller_->Reset();
  (void)s;  // Reset logs its failure and fails every request itself
}

void QueuePair::FailInFlight() {
  for (uint16_t cid = 0; cid < depth_; ++cid) {
    Tracker& t = trackers_[cid];
    if (t.request == nullptr) continue;
    Finish(t.request, t.abort_sent ? -ETIMEDOUT : -EIO, 0);
    t = Tracker{};
    free_cids_.push_back(cid);
  }
  in_flight_ = 0;
}

void QueuePair::FailAll(int error) {
  FailInFlight();
  for (NvmeRequest* r : waiting_) Finish(r, -error, 0);
  waiting_.clear();
}

void QueuePair::Execute(absl::Span<NvmeRequest> batch) {
  Submit(batch);
  for (;;) {
    bool all = true;
    for (const NvmeRequest& r : batch) all &= r.done;
    if (all) return;
    if (Poll() == 0) std::this_thread::yield();
  }
}

absl::Status QueuePair::Flush() {
  if (!controller_->info().volatile_write_cache) return absl::OkStatus();
  NvmeRequest flush;
  flush.op = NvmeOp::kFlush;
  Execute(absl::MakeSpan(&flush, 1));
  if (flush.result == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(controller_->options_.name, " q", qid(), ": Flush failed: ",
                   flush.status != 0 ? StatusText(flush.status)
                                     : std::strerror(static_cast<int>(-flush.result))));
}

}  // namespace tutti::io::nvme

// GpuQueue::Read and the recovery of a queue the kernel gave up on (gpu_queue.h).
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "bench/nvme_gpu/gpu_queue.h"
#include "gpu/cuda_status.h"

namespace tutti::io::nvme::gpu {

absl::Status GpuQueue::Validate(const GpuPlan& plan, uint64_t engine_bytes) const {
  const uint32_t lba_shift = controller_->ns().lba_shift;
  for (size_t i = 0; i < plan.ios.size(); ++i) {
    const GpuReadIo& io = plan.ios[i];
    const uint64_t bytes = static_cast<uint64_t>(io.blocks) << lba_shift;
    bool ok = io.layer < plan.num_layers &&
              uint64_t{io.first_piece} + io.num_pieces <= plan.pieces.size();
    for (uint32_t k = 0; ok && k < io.num_pieces; ++k) {
      const GpuPiece& p = plan.pieces[io.first_piece + k];
      ok = (p.src_offset | p.len | p.dst_offset) % 16 == 0 &&
           uint64_t{p.src_offset} + p.len <= bytes && p.dst_offset <= engine_bytes &&
           p.len <= engine_bytes - p.dst_offset;
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GpuQueue: plan I/O ", i, " (LBA ", io.slba, " x ", io.blocks, ", layer ", io.layer,
          "): its layer must be < ", plan.num_layers, " and its pieces 16-byte aligned, inside ",
          "its ", bytes, " bytes and the ", engine_bytes, " bytes of engine memory"));
    }
  }
  return absl::OkStatus();
}

// One device allocation: ios | pieces | layer_remaining | layer_failed. Results: host-mapped.
absl::Status GpuQueue::Upload(const GpuPlan& plan) {
  std::vector<uint32_t> remaining(plan.num_layers, 0);
  for (const GpuReadIo& io : plan.ios) ++remaining[io.layer];
  const size_t ios = plan.ios.size() * sizeof(GpuReadIo);
  const size_t pieces = plan.pieces.size() * sizeof(GpuPiece);
  const size_t layers = plan.num_layers * sizeof(uint32_t);
  const size_t bytes = ios + pieces + 2 * layers;
  if (bytes > plan_capacity_) {
    if (plan_dev_ != nullptr) cudaFree(plan_dev_);
    plan_dev_ = nullptr;
    plan_capacity_ = 0;
    CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&plan_dev_), bytes));
    plan_capacity_ = bytes;
  }
  std::vector<uint8_t> host(bytes, 0);
  std::memcpy(host.data(), plan.ios.data(), ios);
  std::memcpy(host.data() + ios, plan.pieces.data(), pieces);
  std::memcpy(host.data() + ios + pieces, remaining.data(), layers);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(plan_dev_, host.data(), bytes, cudaMemcpyHostToDevice));
  if (plan.ios.size() > results_capacity_) {
    if (results_ != nullptr) cudaFreeHost(results_);
    results_ = nullptr;
    results_capacity_ = 0;
    CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&results_),
                                       plan.ios.size() * sizeof(GpuIoResult), cudaHostAllocMapped));
    results_capacity_ = plan.ios.size();
  }
  std::fill(results_, results_ + plan.ios.size(), GpuIoResult{});
  *summary_ = GpuReadSummary{};
  return absl::OkStatus();
}

GpuReadParams GpuQueue::Params(const GpuPlan& plan, uint8_t* engine, uint32_t* ready_words,
                               uint32_t ticket) const {
  GpuReadParams p = base_;
  const size_t ios = plan.ios.size() * sizeof(GpuReadIo);
  const size_t pieces = plan.pieces.size() * sizeof(GpuPiece);
  p.ios = reinterpret_cast<const GpuReadIo*>(plan_dev_);
  p.num_ios = static_cast<uint32_t>(plan.ios.size());
  p.pieces = reinterpret_cast<const GpuPiece*>(plan_dev_ + ios);
  p.layer_remaining = reinterpret_cast<uint32_t*>(plan_dev_ + ios + pieces);
  p.layer_failed = p.layer_remaining + plan.num_layers;
  p.num_layers = plan.num_layers;
  p.engine = engine;
  p.ready_words = ready_words;
  p.ticket = ticket;
  void* results = nullptr;
  if (results_ != nullptr) (void)cudaHostGetDevicePointer(&results, results_, 0);
  p.results = static_cast<GpuIoResult*>(results);
  return p;
}

absl::StatusOr<GpuReadOutcome> GpuQueue::Read(const GpuPlan& plan, uint8_t* engine,
                                              uint64_t engine_bytes, uint32_t* ready_words,
                                              uint32_t ticket, cudaStream_t stream) {
  RETURN_IF_ERROR(Validate(plan, engine_bytes));
  if (controller_->resets() != resets_seen_) {  // the queue was re-created: empty rings
    *state_ = GpuRingState{};
    resets_seen_ = controller_->resets();
  }
  RETURN_IF_ERROR(Upload(plan));
  CUDA_RETURN_IF_ERROR(LaunchGpuRead(Params(plan, engine, ready_words, ticket), stream));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  GpuReadOutcome out;
  out.ios.assign(results_, results_ + plan.ios.size());
  out.summary = *summary_;
  out.layer_ready.assign(plan.num_layers, true);
  for (size_t i = 0; i < plan.ios.size(); ++i) {
    if (out.ios[i].state != kGpuIoDone) out.layer_ready[plan.ios[i].layer] = false;
  }
  if (out.summary.gave_up) RETURN_IF_ERROR(Recover(&out));
  return out;
}

// The host owns the queue again (the kernel has ended). Abort every timed-out command; if the
// controller aborts them all and their completions arrive, the rings carry on from where the
// kernel left them; otherwise reset the controller (the rings start empty).
absl::Status GpuQueue::Recover(GpuReadOutcome* outcome) {
  auto logger = log::Get("nvme");
  QueueRing ring = qp_->ring();  // host addresses of the same rings and doorbells
  ring.sq.tail = state_->sq_tail;
  ring.sq.head = state_->sq_head;
  ring.cq.head = state_->cq_head;
  ring.cq.phase = state_->cq_phase;
  std::vector<uint16_t> waiting;
  for (const GpuIoResult& r : outcome->ios) {
    if (r.state == kGpuIoTimedOut) waiting.push_back(r.cid);
  }
  logger->warn("{} q{}: the GPU gave up on {} command(s) after {} ms without a completion",
               controller_->options().name, qid(), waiting.size(), options_.timeout_ms);
  bool reset = controller_->Fatal();
  for (size_t i = 0; i < waiting.size() && !reset; ++i) {
    bool aborted = false;
    absl::Status s = controller_->Abort(qid(), waiting[i], &aborted);
    if (s.ok() && aborted) {
      ++outcome->aborted;
    } else {
      reset = true;
    }
  }
  if (!reset) reset = !DrainAborted(&ring, &waiting);
  if (!reset) {
    *state_ = GpuRingState{ring.sq.tail, ring.sq.head, ring.cq.head, ring.cq.phase};
    return absl::OkStatus();
  }
  logger->error("{} q{}: GPU queue not recovered by Abort; resetting the controller",
                controller_->options().name, qid());
  outcome->reset = true;
  absl::Status s = controller_->Reset();
  *state_ = GpuRingState{};
  resets_seen_ = controller_->resets();
  return s;
}

// Consumes completions until every CID in `waiting` has completed (true) or abort_wait_ms pass.
bool GpuQueue::DrainAborted(QueueRing* ring, std::vector<uint16_t>* waiting) {
  Clock* clock = controller_->options().clock ? controller_->options().clock : Clock::Real();
  const int64_t deadline = clock->NowMs() + options_.abort_wait_ms;
  while (!waiting->empty()) {
    Cqe c;
    bool popped = false;
    while (CqPeek(ring->cq, &c)) {
      CqPop(ring, c);
      popped = true;
      auto it = std::find(waiting->begin(), waiting->end(), CqeCid(c.dw3));
      if (it != waiting->end()) waiting->erase(it);
    }
    if (popped) RingCq(&ring->cq);
    if (waiting->empty()) break;
    if (clock->NowMs() >= deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace tutti::io::nvme::gpu

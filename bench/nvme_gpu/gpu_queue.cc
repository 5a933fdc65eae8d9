#include "bench/nvme_gpu/gpu_queue.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "bench/nvme_gpu/doorbell_requirements.h"
#include "gpu/cuda_status.h"

namespace tutti::io::nvme::gpu {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

std::string ReadDriverVersion() {
  std::ifstream in("/proc/driver/nvidia/version");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

// A cudaHostRegister'd range; `owned` is false when another object had registered it already
// (two queues' doorbells on one page), so only the first unregisters it.
struct GpuQueue::Registration {
  void* host = nullptr;
  bool owned = false;
  ~Registration() {
    if (owned) cudaHostUnregister(host);
  }
};

// Registers the pages holding [p, p + bytes) and returns the device address of `p` in `*device`.
absl::StatusOr<std::unique_ptr<GpuQueue::Registration>> GpuQueue::RegisterHost(
    const volatile void* p, size_t bytes, unsigned flags, const char* what, void** device) {
  auto addr = reinterpret_cast<uintptr_t>(p);
  uintptr_t first = addr / kPage * kPage;
  uintptr_t end = RoundUp(addr + bytes, kPage);
  auto r = std::make_unique<GpuQueue::Registration>();
  r->host = reinterpret_cast<void*>(first);
  cudaError_t err = cudaHostRegister(r->host, end - first, flags);
  if (err == cudaErrorHostMemoryAlreadyRegistered) {
    (void)cudaGetLastError();
  } else {
    RETURN_IF_ERROR(::tutti::gpu::CudaStatus(err, absl::StrCat("cudaHostRegister(", what, ")")));
    r->owned = true;
  }
  void* base = nullptr;
  RETURN_IF_ERROR(::tutti::gpu::CudaStatus(cudaHostGetDevicePointer(&base, r->host, 0),
                                           absl::StrCat("cudaHostGetDevicePointer(", what, ")")));
  *device = static_cast<uint8_t*>(base) + (addr - first);
  return r;
}

absl::StatusOr<std::unique_ptr<GpuQueue>> GpuQueue::Create(const GpuQueueOptions& options,
                                                           Controller* controller,
                                                           DmaAllocator* dma) {
  if (options.queue_index >= controller->num_queue_pairs()) {
    return absl::InvalidArgumentError(absl::StrCat("GpuQueue: queue_index ", options.queue_index,
                                                   " but the controller has ",
                                                   controller->num_queue_pairs(), " queue pairs"));
  }
  QueuePair* qp = controller->queue_pair(options.queue_index);
  const uint32_t lba = controller->ns().lba_size();
  if (options.slots == 0 || options.slots >= qp->depth() || options.slots > kMaxGpuSlots) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GpuQueue: slots ", options.slots, " must be in 1..min(queue depth - 1 = ", qp->depth() - 1,
        ", ", kMaxGpuSlots, ")"));
  }
  if (options.slot_bytes == 0 || options.slot_bytes % kPage != 0 || options.slot_bytes % lba != 0 ||
      options.slot_bytes > controller->max_transfer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GpuQueue: slot_bytes ", options.slot_bytes,
                     " must be a positive multiple of 4096 and of the LBA size ", lba,
                     ", at most max_transfer ", controller->max_transfer()));
  }
  if (options.threads == 0 || options.threads % 32 != 0 || options.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("GpuQueue: threads ", options.threads, " must be a multiple of 32 <= 1024"));
  }
  std::unique_ptr<GpuQueue> q(new GpuQueue(options, controller, qp));
  RETURN_IF_ERROR(q->Init(dma));
  return q;
}

absl::Status GpuQueue::Init(DmaAllocator* dma) {
  const QueueRing& ring = qp_->ring();
  if (ring.sq.doorbell == nullptr || ring.cq.doorbell == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(controller_->options().name, " q", qp_->qid(),
                     ": the register space has no mappable doorbells; GPU-initiated submission "
                     "needs them (falling back to the CPU-driven queue pair)"));
  }
  unsigned doorbell_flags = cudaHostRegisterMapped | cudaHostRegisterPortable;
  if (options_.doorbells == DoorbellMemory::kIoMemory) {
    RETURN_IF_ERROR(CheckIoMemoryRequirements(geteuid(), ReadDriverVersion()));
    doorbell_flags |= cudaHostRegisterIoMemory;
    // vfio maps BAR0 lazily: fault the doorbell page in before registering it, by writing what
    // the doorbells already hold (the rings are idle: rewriting a tail or head is a no-op). The
    // CPU writes, as the GPU will: nobody reads BAR0's doorbells.
    PublishDoorbell(ring.sq.doorbell, ring.sq.tail);
    PublishDoorbell(ring.cq.doorbell, ring.cq.head);
  }
  ASSIGN_OR_RETURN(bounce_, dma->Allocate(uint64_t{options_.slots} * options_.slot_bytes));
  ASSIGN_OR_RETURN(bounce_region_, controller_->Register(*bounce_));
  const unsigned flags = cudaHostRegisterMapped | cudaHostRegisterPortable;
  void* dev = nullptr;
  auto add = [&](const volatile void* p, size_t bytes, unsigned f, const char* what) {
    auto r = RegisterHost(p, bytes, f, what, &dev);
    if (r.ok()) registrations_.push_back(std::move(*r));
    return r.status();
  };
  RETURN_IF_ERROR(add(ring.sq.entries, uint64_t{qp_->depth()} * sizeof(Sqe), flags, "SQ"));
  base_.sq = static_cast<Sqe*>(dev);
  RETURN_IF_ERROR(add(ring.cq.entries, uint64_t{qp_->depth()} * sizeof(Cqe), flags, "CQ"));
  base_.cq = static_cast<Cqe*>(dev);
  RETURN_IF_ERROR(add(bounce_->host(), bounce_->size(), flags, "bounce ring"));
  base_.bounce_data = static_cast<const uint8_t*>(dev);
  for (volatile uint32_t* db : {ring.sq.doorbell, ring.cq.doorbell}) {
    absl::Status s = add(db, sizeof(uint32_t), doorbell_flags, "doorbell");
    if (!s.ok() && options_.doorbells == DoorbellMemory::kIoMemory) {
      return absl::FailedPreconditionError(
          absl::StrCat("GPU doorbells: registering BAR0 as I/O memory failed (", s.message(),
                       "); falling back to the CPU-driven queue pair"));
    }
    RETURN_IF_ERROR(s);
    (db == ring.sq.doorbell ? base_.sq_doorbell : base_.cq_doorbell) =
        static_cast<volatile uint32_t*>(dev);
  }
  CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&state_),
                                     sizeof(GpuRingState) + sizeof(GpuReadSummary),
                                     cudaHostAllocMapped));
  *state_ = GpuRingState{};
  summary_ = reinterpret_cast<GpuReadSummary*>(state_ + 1);
  CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(reinterpret_cast<void**>(&base_.state), state_, 0));
  base_.summary = reinterpret_cast<GpuReadSummary*>(base_.state + 1);
  base_.depth = qp_->depth();
  base_.qid = qp_->qid();
  base_.nsid = controller_->ns().nsid;
  base_.lba_shift = controller_->ns().lba_shift;
  base_.bounce = bounce_region_->descriptor();
  base_.slots = options_.slots;
  base_.slot_bytes = options_.slot_bytes;
  base_.timeout_ns = static_cast<uint64_t>(options_.timeout_ms) * 1000000;
  base_.threads = options_.threads;
  resets_seen_ = controller_->resets();
  return absl::OkStatus();
}

GpuQueue::GpuQueue(const GpuQueueOptions& options, Controller* controller, QueuePair* qp)
    : options_(options), controller_(controller), qp_(qp) {}

GpuQueue::~GpuQueue() {
  if (plan_dev_ != nullptr) cudaFree(plan_dev_);
  if (results_ != nullptr) cudaFreeHost(results_);
  if (state_ != nullptr) cudaFreeHost(state_);
  registrations_.clear();  // before the bounce ring goes
}

}  // namespace tutti::io::nvme::gpu

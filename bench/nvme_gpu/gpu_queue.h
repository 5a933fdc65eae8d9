// GPU-initiated submission: one NVMe I/O queue pair taken over by a GPU kernel that reads a plan
// of layers into an engine's device memory with no per-I/O work on the CPU (docs/nvme.md,
// "GPU-initiated submission").
//
// At Create (registration, once): a bounce ring of `slots` x `slot_bytes` is allocated from the
// controller's DMA allocator and its descriptor built by the controller (SGL or windowed PRP
// lists, descriptors.h); the queue pair's SQ and CQ memory and the bounce ring are registered with
// CUDA (cudaHostRegister, mapped); the queue's two doorbells are registered as well:
//   - DoorbellMemory::kHostMemory: the doorbells are ordinary host words (the controller model's),
//     registered mapped.
//   - DoorbellMemory::kIoMemory: the doorbells are BAR0 mapped through vfio, registered with
//     cudaHostRegisterIoMemory (cuMemHostRegister CU_MEMHOSTREGISTER_IOMEMORY). That needs root and
//     the open NVIDIA module >= 570.133.07 (doorbell_requirements.h); when either is missing or
//     the registration fails, Create returns FAILED_PRECONDITION with the reason and the caller
//     keeps the CPU-driven QueuePair. Never run on real hardware here.
//
// Read (per plan): the host uploads the plan and launches one kernel (gpu_read_kernel.h) that
// submits, polls the CQ by phase bit, scatters from the bounce ring into the engine's blocks and
// writes each layer's ready word; the host thread waits for the kernel's end only. A layer with a
// failed I/O gets no ready word; Read reports which I/Os failed and why (GpuReadOutcome, as
// RetrieveProgress.failed does for the CPU path). When the kernel gave up on a stalled queue, Read
// recovers it before returning: Abort for every timed-out command through the CPU controller,
// and, when an Abort fails or its command does not complete, a controller reset.
//
// THE RULE: the taken-over queue pair has one owner, this object (its kernel while a Read runs,
// the calling thread during recovery). Nobody may call the QueuePair's own methods after Create.
// Read is called by one thread at a time. The controller must outlive this object.
#ifndef TUTTI_BENCH_NVME_GPU_GPU_QUEUE_H_
#define TUTTI_BENCH_NVME_GPU_GPU_QUEUE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/io/nvme/controller.h"
#include "bench/nvme_gpu/gpu_plan.h"
#include "bench/nvme_gpu/gpu_read_kernel.h"
#include "daemon/io/nvme/queue_pair.h"

namespace tutti::io::nvme::gpu {

enum class DoorbellMemory { kHostMemory, kIoMemory };

struct GpuQueueOptions {
  uint32_t queue_index = 0;          // the controller's queue pair to take over
  uint32_t slots = 255;              // bounce slots = commands in flight; < queue depth
  uint32_t slot_bytes = 128 * 1024;  // bytes per slot: the largest I/O; <= max_transfer
  uint32_t threads = 256;            // the kernel's CTA
  int64_t timeout_ms = 2000;         // the kernel gives up after this long without a completion
  int64_t abort_wait_ms = 1000;      // recovery: how long an aborted command may take to complete
  DoorbellMemory doorbells = DoorbellMemory::kHostMemory;
};

struct GpuReadOutcome {
  std::vector<GpuIoResult> ios;  // per I/O of the plan
  GpuReadSummary summary;
  std::vector<bool> layer_ready;  // per layer: ready word written (every I/O of it landed)
  uint32_t aborted = 0;           // recovery: commands the controller aborted
  bool reset = false;             // recovery: the controller was reset
  bool ok() const { return summary.done == ios.size(); }
};

class GpuQueue {
 public:
  // Registers everything (see above). `controller` and its DMA allocator `dma` must outlive the
  // result. INVALID_ARGUMENT for options the queue cannot carry (slots >= depth or > kMaxGpuSlots,
  // slot_bytes over max_transfer or not a multiple of the LBA size); FAILED_PRECONDITION when the
  // doorbells cannot be registered (the reason: to fall back to the CPU-driven QueuePair);
  // UNAVAILABLE without a GPU; other CUDA and allocation errors as they come.
  static absl::StatusOr<std::unique_ptr<GpuQueue>> Create(const GpuQueueOptions& options,
                                                          Controller* controller,
                                                          DmaAllocator* dma);
  GpuQueue(const GpuQueue&) = delete;
  GpuQueue& operator=(const GpuQueue&) = delete;
  // Unregisters and frees. Precondition: no Read in progress.
  ~GpuQueue();

  // Reads `plan` into `engine` (device memory of `engine_bytes`), writing ready_words[l] = ticket
  // (device memory, num_layers words; may be null) for each layer whose I/Os all landed, on
  // `stream`, and waits. The outcome reports every I/O; a failed or timed-out I/O is not an error
  // of Read. INVALID_ARGUMENT for a plan that leaves the engine memory, a slot or its layers, or
  // is not 16-byte aligned; the CUDA error when the launch fails; the recovery's error when the
  // queue could not be made usable again (the controller is then down: see Controller::Reset).
  absl::StatusOr<GpuReadOutcome> Read(const GpuPlan& plan, uint8_t* engine, uint64_t engine_bytes,
                                      uint32_t* ready_words, uint32_t ticket, cudaStream_t stream);

  uint16_t qid() const { return qp_->qid(); }
  const RegionDescriptor& bounce_descriptor() const { return bounce_region_->descriptor(); }

 private:
  struct Registration;  // cudaHostRegister'd ranges, unregistered on destruction
  static absl::StatusOr<std::unique_ptr<Registration>> RegisterHost(const volatile void* p,
                                                                    size_t bytes, unsigned flags,
                                                                    const char* what,
                                                                    void** device);
  GpuQueue(const GpuQueueOptions& options, Controller* controller, QueuePair* qp);
  absl::Status Init(DmaAllocator* dma);
  absl::Status Validate(const GpuPlan& plan, uint64_t engine_bytes) const;
  absl::Status Upload(const GpuPlan& plan);
  GpuReadParams Params(const GpuPlan& plan, uint8_t* engine, uint32_t* ready_words,
                       uint32_t ticket) const;
  absl::Status Recover(GpuReadOutcome* outcome);
  bool DrainAborted(QueueRing* ring, std::vector<uint16_t>* waiting);

  const GpuQueueOptions options_;
  Controller* const controller_;
  QueuePair* const qp_;
  std::unique_ptr<DmaBuffer> bounce_;
  std::unique_ptr<RegisteredRegion> bounce_region_;
  std::vector<std::unique_ptr<Registration>> registrations_;
  GpuReadParams base_;  // the queue's and bounce ring's device pointers
  uint64_t resets_seen_ = 0;
  // Host-mapped: ring state, summary, results. Device: the plan and the layer counts.
  GpuRingState* state_ = nullptr;
  GpuReadSummary* summary_ = nullptr;
  GpuIoResult* results_ = nullptr;
  size_t results_capacity_ = 0;
  uint8_t* plan_dev_ = nullptr;
  size_t plan_capacity_ = 0;
};

}  // namespace tutti::io::nvme::gpu

#endif  // TUTTI_BENCH_NVME_GPU_GPU_QUEUE_H_

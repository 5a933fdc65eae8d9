#include "daemon/engine/cuda_engine_io.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "daemon/gpu/cuda_ipc_memory.h"
#include "gpu/cuda_status.h"
#include "gpu/ready_words.h"

namespace tutti::engine {
namespace {

absl::Status Closed() { return absl::CancelledError("the session was closed"); }

// The newer of two tickets, wrap-around safe (as WaitLayer compares).
uint32_t Newer(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0 ? a : b; }

class CudaEngineIo final : public EngineIo {
 public:
  CudaEngineIo(std::unique_ptr<gpu::CudaIpcMemory> memory, std::unique_ptr<gpu::ReadyWords> words,
               std::unique_ptr<gpu::LayerCopier::Lane> lane, uint32_t num_layers,
               CudaIoContext context)
      : num_blocks_(memory->num_blocks()),
        has_words_(words != nullptr),
        num_layers_(num_layers),
        context_(context),
        memory_(std::move(memory)),
        words_(std::move(words)),
        lane_(std::move(lane)) {}
  ~CudaEngineIo() override { Close(); }

  std::string_view kind() const override { return "cuda_ipc"; }
  uint32_t num_blocks() const override { return num_blocks_; }
  bool is_device() const override { return true; }
  bool has_ready_words() const override { return has_words_; }

  absl::Status ScatterLayer(uint32_t layer, absl::Span<const CopyOp> ops,
                            uint32_t ticket) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Usable());
    return context_.copier->ScatterLayer(memory_.get(), ops, words_.get(), layer, ticket,
                                         gpu::LayerCopier::Wait::kLanded, lane_.get());
  }

  absl::Status EnqueueLayer(uint32_t layer, absl::Span<const CopyOp> ops,
                            uint32_t ticket) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Usable());
    return context_.copier->ScatterLayer(memory_.get(), ops, words_.get(), layer, ticket,
                                         gpu::LayerCopier::Wait::kPrevious, lane_.get());
  }

  absl::Status Drain() override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Usable());
    return context_.copier->Drain(lane_.get());
  }

  absl::Status SignalLayers(uint32_t begin, uint32_t end, uint32_t ticket) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Usable());
    if (words_ == nullptr) return absl::OkStatus();
    for (uint32_t l = begin; l < end && l < num_layers_; ++l) {
      RETURN_IF_ERROR(words_->Signal(l, ticket));
    }
    return absl::OkStatus();
  }

  absl::Status Gather(absl::Span<const CopyOp> ops) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Usable());
    return context_.copier->Gather(memory_.get(), ops);
  }

  absl::Status SignalCaptured(uint32_t ticket) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Usable());
    if (words_ == nullptr) return absl::OkStatus();
    last_store_ticket_ = stored_before_ ? Newer(ticket, last_store_ticket_) : ticket;
    stored_before_ = true;
    return words_->Signal(num_layers_, last_store_ticket_);
  }

  void Close() override {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    (void)cudaSetDevice(context_.stream->device());
    words_.reset();   // waits for the I/O stream, then closes the mapping
    memory_.reset();  // the same for the KV tensors
    lane_.reset();    // nothing of it is in flight any more
  }

 private:
  // CANCELLED once closed; makes the daemon's GPU current on this (gRPC) thread.
  absl::Status Usable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closed_) return Closed();
    return gpu::CudaStatus(cudaSetDevice(context_.stream->device()), "cudaSetDevice");
  }

  const uint32_t num_blocks_;
  const bool has_words_;
  const uint32_t num_layers_;
  const CudaIoContext context_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<gpu::CudaIpcMemory> memory_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<gpu::ReadyWords> words_ ABSL_GUARDED_BY(mu_);
  // This session's layers in the shared copier: its overlapped layers wait for its own only.
  std::unique_ptr<gpu::LayerCopier::Lane> lane_ ABSL_GUARDED_BY(mu_);
  bool stored_before_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t last_store_ticket_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EngineIo>> OpenCudaEngineIo(const CudaEngineRegions& regions,
                                                           CudaIoContext context) {
  RETURN_IF_ERROR(gpu::CudaStatus(cudaSetDevice(context.stream->device()), "cudaSetDevice"));
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaIpcMemory> memory,
                   gpu::CudaIpcMemory::Open(regions.layout, regions.regions,
                                            context.copier->staging_regions(), context.stream));
  std::unique_ptr<gpu::ReadyWords> words;
  if (regions.ready_words.has_value()) {
    const uint32_t count = regions.ready_word_count;
    if (count < regions.num_layers + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("ready_words.count = ", count,
                       ": must be at least num_layers + 1 = ", regions.num_layers + 1));
    }
    absl::StatusOr<std::unique_ptr<gpu::ReadyWords>> opened =
        gpu::ReadyWords::Open(*regions.ready_words, 0, count, context.stream);
    if (!opened.ok()) {
      return absl::Status(opened.status().code(),
                          absl::StrCat("ready_words: ", opened.status().message()));
    }
    words = std::move(*opened);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::LayerCopier::Lane> lane, context.copier->NewLane());
  return std::unique_ptr<EngineIo>(new CudaEngineIo(std::move(memory), std::move(words),
                                                    std::move(lane), regions.num_layers, context));
}

}  // namespace tutti::engine

#include "daemon/server/gpu_engine_io.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/cuda_ipc_memory.h"
#include "gpu/cuda_status.h"
#include "gpu/ready_words.h"

namespace tutti::server {
namespace {

using tutti::v1::MemoryRegion;

absl::Status Closed() { return absl::CancelledError("the session was closed"); }

// The newer of two tickets, wrap-around safe (as WaitLayer compares).
uint32_t Newer(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0 ? a : b; }

class GpuEngineIo final : public engine::EngineIo {
 public:
  GpuEngineIo(std::unique_ptr<gpu::CudaIpcMemory> memory, std::unique_ptr<gpu::ReadyWords> words,
              uint32_t num_layers, GpuIoContext context)
      : num_blocks_(memory->num_blocks()),
        has_words_(words != nullptr),
        num_layers_(num_layers),
        context_(context),
        memory_(std::move(memory)),
        words_(std::move(words)) {}
  ~GpuEngineIo() override { Close(); }

  std::string_view kind() const override { return "cuda_ipc"; }
  uint32_t num_blocks() const override { return num_blocks_; }
  bool is_device() const override { return true; }
  bool has_ready_words() const override { return has_words_; }

  absl::Status ScatterLayer(uint32_t layer, absl::Span<const engine::CopyOp> ops,
                            uint32_t ticket) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Usable());
    return context_.copier->ScatterLayer(memory_.get(), ops, words_.get(), layer, ticket);
  }

  absl::Status EnqueueLayer(uint32_t layer, absl::Span<const engine::CopyOp> ops,
                            uint32_t ticket) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Usable());
    return context_.copier->ScatterLayer(memory_.get(), ops, words_.get(), layer, ticket,
                                         gpu::LayerCopier::Wait::kPrevious);
  }

  absl::Status Drain() override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(Usable());
    return context_.copier->Drain();
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

  absl::Status Gather(absl::Span<const engine::CopyOp> ops) override {
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
  const GpuIoContext context_;
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<gpu::CudaIpcMemory> memory_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<gpu::ReadyWords> words_ ABSL_GUARDED_BY(mu_);
  bool stored_before_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t last_store_ticket_ ABSL_GUARDED_BY(mu_) = 0;
};

gpu::IpcRegion ToIpcRegion(const tutti::v1::CudaIpcRegion& r) {
  return gpu::IpcRegion{r.ipc_handle(), r.size_bytes(), r.gpu_uuid()};
}

// Counts the kinds of the request's regions: INVALID_ARGUMENT for a region with none, or a mix.
absl::StatusOr<bool> AllCudaIpc(const tutti::v1::AttachRequest& req) {
  int cuda = 0, host = 0;
  for (int i = 0; i < req.regions_size(); ++i) {
    switch (req.regions(i).kind_case()) {
      case MemoryRegion::kCudaIpc:
        ++cuda;
        break;
      case MemoryRegion::kHostShm:
        ++host;
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("regions[", i, "]: no kind set"));
    }
  }
  if (cuda > 0 && host > 0) {
    return absl::InvalidArgumentError(
        "regions: all cuda_ipc (GPU memory) or all host_shm (host memory), not a mix");
  }
  return cuda > 0;
}

absl::StatusOr<std::unique_ptr<engine::EngineIo>> OpenGpu(const tutti::v1::AttachRequest& req,
                                                          const store::NamespaceInfo& ns,
                                                          GpuIoContext context) {
  const uint32_t num_layers = ns.num_objects / ns.parts;
  if (req.placements_size() != static_cast<int>(ns.num_objects)) {
    return absl::InvalidArgumentError(absl::StrCat("placements: ", req.placements_size(),
                                                   " given, the namespace's layout has ",
                                                   ns.num_objects, " objects per block"));
  }
  gpu::EngineLayout layout;
  layout.num_blocks = req.num_blocks();
  layout.object_len = ns.object_len;
  for (const auto& p : req.placements()) {
    layout.placements.push_back({p.region(), p.offset(), p.block_stride()});
  }
  std::vector<gpu::IpcRegion> regions;
  for (const MemoryRegion& r : req.regions()) regions.push_back(ToIpcRegion(r.cuda_ipc()));
  RETURN_IF_ERROR(gpu::CudaStatus(cudaSetDevice(context.stream->device()), "cudaSetDevice"));
  ASSIGN_OR_RETURN(
      std::unique_ptr<gpu::CudaIpcMemory> memory,
      gpu::CudaIpcMemory::Open(layout, regions, context.copier->staging_regions(), context.stream));
  std::unique_ptr<gpu::ReadyWords> words;
  if (req.has_ready_words()) {
    const auto& rw = req.ready_words();
    if (rw.count() < num_layers + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("ready_words.count = ", rw.count(),
                       ": must be at least num_layers + 1 = ", num_layers + 1));
    }
    absl::StatusOr<std::unique_ptr<gpu::ReadyWords>> opened =
        gpu::ReadyWords::Open(ToIpcRegion(rw.region()), 0, rw.count(), context.stream);
    if (!opened.ok()) {
      return absl::Status(opened.status().code(),
                          absl::StrCat("ready_words: ", opened.status().message()));
    }
    words = std::move(*opened);
  }
  return std::unique_ptr<engine::EngineIo>(
      new GpuEngineIo(std::move(memory), std::move(words), num_layers, context));
}

}  // namespace

MemoryOpener GpuMemoryOpener(GpuIoContext context) {
  MemoryOpener host = HostMemoryOpener();
  return
      [context, host](const tutti::v1::AttachRequest& req, const store::NamespaceInfo& ns,
                      Credential& credential) -> absl::StatusOr<std::unique_ptr<engine::EngineIo>> {
        ASSIGN_OR_RETURN(const bool cuda, AllCudaIpc(req));
        if (!cuda) return host(req, ns, credential);
        return OpenGpu(req, ns, context);
      };
}

}  // namespace tutti::server

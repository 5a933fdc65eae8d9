// The daemon's GPU data path at start-up, behind a seam that needs no CUDA header.
//
// Two implementations, one per build (daemon/BUILD picks with if_cuda, tools/cuda.bzl):
//   gpu_setup_cuda.cc: the toolkit's build. ChooseDevice probes the configured GPU; StartGpu sets
//     up the I/O stream (a green context where it can), registers the store's staging and DRAM
//     tier as pinned and mapped memory, and allocates the layer copier's GPU staging.
//   gpu_setup_none.cc: a build without the CUDA toolkit. ChooseDevice always chooses host mode
//     (gpu.mode "auto" and "host") or refuses to start (gpu.mode "cuda": "built without CUDA").
//
// Thread-safety: ChooseDevice and StartGpu run once, on the start-up thread. A GpuRuntime's
// accessors may be called from any thread.
#ifndef TUTTI_DAEMON_GPU_SETUP_H_
#define TUTTI_DAEMON_GPU_SETUP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/server/admin_service.h"
#include "daemon/server/kvcache_service.h"
#include "daemon/store/block_store.h"
#include "tutti/v1/config.pb.h"

namespace tutti::gpu_setup {

// True in a build with the CUDA toolkit (the GPU data path is compiled in).
bool BuiltWithCuda();

// The GPU chosen for cuda mode.
struct ChosenGpu {
  int ordinal = 0;
  std::string name;
  std::string uuid_text;
  int sm_count = 0;
};

// Decides the device mode before anything else starts: the GPU to use in cuda mode, or nullopt
// (host mode, with the reason appended to `notes`). FAILED_PRECONDITION when gpu.mode is "cuda"
// and no usable GPU is there (or the build has no CUDA); INVALID_ARGUMENT when gpu.io_sm_count
// is more than the GPU can give.
absl::StatusOr<std::optional<ChosenGpu>> ChooseDevice(const v1::Config& config,
                                                      std::vector<std::string>* notes);

// The GPU data path of a daemon in cuda mode. Destroying it releases everything StartGpu set up
// (the copier, then the staging registrations, then the stream); it must go before the store.
class GpuRuntime {
 public:
  virtual ~GpuRuntime() = default;
  // Opens engines' CUDA IPC memory on this GPU (daemon/server/gpu_memory_opener.h over
  // daemon/engine/cuda_engine_io.h). The runtime must outlive every session opened through it.
  virtual server::MemoryOpener MemoryOpener() = 0;
  // The layer copier's counts so far.
  virtual server::GpuLayerCounts LayerCounts() const = 0;
  // GPU memory the set-up took: the device's free memory before StartGpu less after it (the I/O
  // context, the copier's staging and words). The primary CUDA context created by the probe is
  // not in it.
  virtual uint64_t memory_bytes() const = 0;
};

// Sets up the GPU data path on `gpu` over `store`'s staging and DRAM tier (registered once here:
// nothing is registered or allocated on the I/O path) and appends what it did to `notes`.
// `store` must outlive the runtime. Errors from the CUDA runtime, naming the step.
absl::StatusOr<std::unique_ptr<GpuRuntime>> StartGpu(const v1::Config& config,
                                                     const ChosenGpu& gpu,
                                                     store::BlockStore* store,
                                                     std::vector<std::string>* notes);

// GPU staging for retrieves: one layer of a maximal call, at most gpu.max_staging_bytes, and at
// least a slot per object (daemon/gpu/layer_copier.h).
uint64_t GpuStagingBytes(const v1::Config& config);

}  // namespace tutti::gpu_setup

#endif  // TUTTI_DAEMON_GPU_SETUP_H_

// gpu_setup.h in a build with the CUDA toolkit: the GPU data path of docs/gpu.md.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "config/config.h"
#include "daemon/gpu/gpu_verifier.h"
#include "daemon/gpu/layer_copier.h"
#include "daemon/gpu_setup.h"
#include "daemon/server/gpu_memory_opener.h"
#include "gpu/cuda_status.h"
#include "gpu/io_stream.h"
#include "gpu/pinned.h"
#include "gpu/probe.h"

namespace tutti::gpu_setup {
namespace {

// Destroyed in reverse order: the copier, then the staging registrations, then the stream.
class CudaRuntime final : public GpuRuntime {
 public:
  server::MemoryOpener MemoryOpener() override {
    return server::GpuMemoryOpener({stream.get(), copier.get()});
  }
  server::GpuLayerCounts LayerCounts() const override {
    const gpu::LayerCopier::Counters c = copier->counters();
    return server::GpuLayerCounts{c.layers,
                                  c.copy_engine_layers,
                                  c.gathers,
                                  c.copy_engine_gathers,
                                  arrivals.arrivals.load(std::memory_order_relaxed),
                                  arrivals.groups.load(std::memory_order_relaxed),
                                  arrivals.pickup_ns.load(std::memory_order_relaxed) * 1e-9,
                                  arrivals.copy_release_ns.load(std::memory_order_relaxed) * 1e-9};
  }
  uint64_t memory_bytes() const override { return memory; }

  std::unique_ptr<gpu::IoStream> stream;
  std::unique_ptr<gpu::PinnedRegion> staging;  // the store's staging, page-locked and mapped
  std::unique_ptr<gpu::PinnedRegion> dram;     // the DRAM tier's region, likewise (if on)
  std::unique_ptr<gpu::LayerCopier> copier;
  // Retrieve checks on the GPU (datapath.verifier), on a stream of their own; handed to `store`,
  // which gets its CPU checker back before the verifier goes.
  std::unique_ptr<gpu::IoStream> check_stream;
  gpu::ArrivalCounters arrivals;  // the verifier's copies on arrival; declared before it
  std::unique_ptr<datapath::Verifier> verifier;
  // The GPU memory Retrieve layers are staged in (datapath.read_bounce_depth > 0), or null.
  struct CudaFree {
    void operator()(uint8_t* p) const { cudaFree(p); }
  };
  std::unique_ptr<uint8_t, CudaFree> read_staging;
  store::BlockStore* store = nullptr;
  uint64_t memory = 0;

  ~CudaRuntime() override {
    if (read_staging != nullptr) {
      (void)store->StageReadsOnGpu({}, nullptr, 0);  // host staging and the CPU checker again
    } else if (verifier != nullptr) {
      store->SetReadVerifier(nullptr);
    }
  }
};

// Stages Retrieve layers in GPU memory as large as the retrieve staging, read through
// `depth` bounce slots per pool device and placed by rt->verifier (datapath/layer_reader.h).
absl::Status StageReadsOnGpu(CudaRuntime* rt, store::BlockStore* store, uint32_t depth) {
  const uint64_t bytes = store->retrieve_staging_region().size();
  uint8_t* device = nullptr;
  RETURN_IF_ERROR(
      gpu::CudaStatus(cudaMalloc(reinterpret_cast<void**>(&device), bytes),
                      absl::StrCat("cudaMalloc(", bytes, ") for the retrieve staging")));
  std::unique_ptr<uint8_t, CudaRuntime::CudaFree> owned(device);
  RETURN_IF_ERROR(
      store->StageReadsOnGpu(absl::MakeSpan(device, bytes), rt->verifier.get(), depth));
  rt->read_staging = std::move(owned);
  return absl::OkStatus();
}

// The device's free memory now (creates the primary context if there is none yet).
absl::StatusOr<uint64_t> FreeDeviceMemory(int ordinal) {
  RETURN_IF_ERROR(gpu::CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"));
  size_t free = 0, total = 0;
  RETURN_IF_ERROR(gpu::CudaStatus(cudaMemGetInfo(&free, &total), "cudaMemGetInfo"));
  return free;
}

std::string RoundsText(const v1::GpuConfig& g, gpu::LayerCopier::Mode mode) {
  const bool rounds =
      mode == gpu::LayerCopier::Mode::kStaged || mode == gpu::LayerCopier::Mode::kAuto;
  if (!rounds || g.round_bytes() == 0) return "";
  return absl::StrCat(" in rounds of at most ", g.round_bytes() >> 10, " KiB");
}

}  // namespace

bool BuiltWithCuda() { return true; }

uint64_t GpuStagingBytes(const v1::Config& config) {
  const uint64_t object = config.pool().object_bytes();
  const uint64_t layer = uint64_t{config.limits().max_blocks_per_call()} * 2 * object;
  return std::max(gpu::LayerCopier::kSlots * object,
                  std::min<uint64_t>(layer, config.gpu().max_staging_bytes()));
}

absl::StatusOr<std::optional<ChosenGpu>> ChooseDevice(const v1::Config& config,
                                                      std::vector<std::string>* notes) {
  const v1::GpuConfig& g = config.gpu();
  if (g.mode() == "host") {
    notes->push_back("host mode (gpu.mode = host): engines attach host shared memory");
    return std::nullopt;
  }
  absl::StatusOr<gpu::DeviceInfo> device = gpu::Probe(static_cast<int>(g.device()));
  if (!device.ok()) {
    if (g.mode() == "cuda") {
      return absl::FailedPreconditionError(absl::StrCat(
          "gpu.mode = cuda, but GPU ", g.device(), " is not usable: ", device.status().message()));
    }
    notes->push_back(absl::StrCat("host mode: no usable GPU (", device.status().message(),
                                  "); engines attach host shared memory"));
    return std::nullopt;
  }
  absl::Status valid = gpu::IoStream::ValidateOptions(
      {static_cast<int>(g.device()), g.io_sm_count(), g.copy_ctas()}, device->sm_count);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("gpu.io_sm_count = ", g.io_sm_count(), ": ",
                                                   device->name, " has ", device->sm_count,
                                                   " SMs (", valid.message(), ")"));
  }
  return ChosenGpu{static_cast<int>(g.device()), device->name, device->uuid_text,
                   device->sm_count};
}

absl::StatusOr<std::unique_ptr<GpuRuntime>> StartGpu(const v1::Config& config,
                                                     const ChosenGpu& chosen,
                                                     store::BlockStore* store,
                                                     std::vector<std::string>* notes) {
  const v1::GpuConfig& g = config.gpu();
  const uint64_t min_staging = gpu::LayerCopier::kSlots * config.pool().object_bytes();
  if (g.max_staging_bytes() < min_staging) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu.max_staging_bytes = ", g.max_staging_bytes(), " is less than ",
        gpu::LayerCopier::kSlots, " x pool.object_bytes (", min_staging,
        "): each GPU staging slot must hold an object"));
  }
  ASSIGN_OR_RETURN(const uint64_t free_before, FreeDeviceMemory(chosen.ordinal));
  auto rt = std::make_unique<CudaRuntime>();
  ASSIGN_OR_RETURN(rt->stream,
                   gpu::IoStream::Create({chosen.ordinal, g.io_sm_count(), g.copy_ctas()}));
  const absl::Span<uint8_t> staging = store->staging_region();
  ASSIGN_OR_RETURN(rt->staging, gpu::PinnedRegion::Register(staging.data(), staging.size()));
  // DRAM-tier hits are copied straight from the tier's region, so it is registered too (without
  // it they would go through the copier's bounce buffer, at about a third of the speed).
  std::vector<gpu::StagingRegion> registered = {rt->staging->staging()};
  const absl::Span<uint8_t> dram = store->dram_region();
  if (!dram.empty()) {
    ASSIGN_OR_RETURN(rt->dram, gpu::PinnedRegion::Register(dram.data(), dram.size()));
    registered.push_back(rt->dram->staging());
  }
  // ValidateConfig admits only the copier's names.
  const gpu::LayerCopier::Mode mode =
      gpu::LayerCopier::ModeFromName(g.scatter()).value_or(gpu::LayerCopier::Mode::kStaged);
  ASSIGN_OR_RETURN(rt->copier, gpu::LayerCopier::Create({mode, GpuStagingBytes(config),
                                                         /*bounce_threads=*/4, g.round_bytes()},
                                                        rt->stream.get(), registered));
  std::string checks = "retrieve checks on the CPU";
  // "auto" is the GPU here: with the mirror it retrieves faster and takes less CPU than the CPU's
  // checks (docs/gpu.md, "Checking retrieves on the GPU").
  if (config.datapath().verifier() != "cpu") {
    ASSIGN_OR_RETURN(rt->check_stream,
                     gpu::IoStream::Create({chosen.ordinal, g.io_sm_count(), g.copy_ctas()}));
    // Checked objects stay in GPU memory, from which the copier places them: one PCIe crossing
    // per byte (daemon/gpu/gpu_verifier.h). With bounce slots the layers are staged there and the
    // reads land in a few host slots per device; else in a GPU mirror of the host retrieve staging.
    rt->store = store;
    const uint32_t depth = config::ReadBounceDepth(config);
    const uint64_t staging_mib = store->retrieve_staging_region().size() >> 20;
    gpu::GpuVerifierOptions vo;
    vo.max_objects_per_slot = config.datapath().gpu_check_batch_objects();
    vo.max_objects_per_shared_slot = config.datapath().gpu_check_shared_objects();
    vo.slots = config.datapath().gpu_check_slots();
    // Only where layers are staged on the GPU: the mirror's checks take whole layers.
    vo.copy_on_arrival = depth > 0 && config.datapath().gpu_check_copy_on_arrival();
    vo.counters = &rt->arrivals;
    if (depth > 0) {
      ASSIGN_OR_RETURN(rt->verifier,
                       gpu::MakeGpuVerifier(vo, *rt->check_stream, store->cpu_verifier()));
      const absl::Status staged = StageReadsOnGpu(rt.get(), store, depth);
      if (staged.ok()) {
        checks = absl::StrCat("retrieve layers staged in ", staging_mib,
                              " MiB of GPU memory, read through ", depth,
                              " host bounce slots per pool device and checked on the GPU",
                              vo.copy_on_arrival ? " (each batch copied there as it arrives)" : "");
      } else {  // not fatal: the mirror does the same job with whole layers in host memory
        notes->push_back(absl::StrCat("datapath.read_bounce_depth = ", depth,
                                      ": retrieve layers cannot be staged in GPU memory (",
                                      staged.message(), "); staging them in host memory"));
        rt->verifier.reset();
      }
    }
    if (rt->verifier == nullptr) {
      vo.mirror = store->retrieve_staging_region();
      vo.copy_on_arrival = false;
      ASSIGN_OR_RETURN(rt->verifier,
                       gpu::MakeGpuVerifier(vo, *rt->check_stream, store->cpu_verifier()));
      store->SetReadVerifier(rt->verifier.get());
      checks = absl::StrCat("retrieve checks on the GPU, over a ", staging_mib,
                            " MiB mirror of the retrieve staging in GPU memory");
    }
  }
  // Store checksums with the gather (the hash kernel over the engine's objects, on the I/O
  // stream after the copies: daemon/gpu/layer_copier.h); the writer computes only the rest.
  const bool gather_sums = config.datapath().store_checksums() != "cpu";
  store->SetGatherChecksums(gather_sums);
  checks +=
      gather_sums ? "; store checksums on the GPU with the gather" : "; store checksums on the CPU";
  ASSIGN_OR_RETURN(const uint64_t free_after, FreeDeviceMemory(chosen.ordinal));
  rt->memory = free_before > free_after ? free_before - free_after : 0;
  notes->push_back(absl::StrCat(
      "cuda mode on GPU ", chosen.ordinal, " (", chosen.name, ", ", chosen.uuid_text, "): I/O ",
      rt->stream->description(), ", ", rt->stream->ctas(), " CTAs per copy; retrieve copies ",
      g.scatter(), RoundsText(g, mode), "; ", staging.size() >> 20, " MiB of staging and ",
      dram.size() >> 20, " MiB of DRAM tier registered; ", rt->memory >> 20,
      " MiB of GPU memory taken at start; ", checks));
  if (!rt->stream->is_green() && g.io_sm_count() > 0) {
    notes->push_back("no green context: the daemon's kernels may use every SM");
  }
  if (const gpu::MpsHint mps = gpu::FindMps();
      !mps.control_pipe_found && mode != gpu::LayerCopier::Mode::kCopyEngine) {
    // Without MPS, scatter kernels time-slice the GPU with the engine's: "auto" cannot see it.
    notes->push_back(absl::StrCat(
        "no MPS control daemon found (no ", mps.pipe_directory,
        "/control): the GPU time-slices between tuttid and the engines, and an engine that keeps "
        "every SM busy loses about 16% while tuttid retrieves (docs/gpu.md); run "
        "nvidia-cuda-mps-control -d, or set gpu.scatter: \"copy_engine\""));
  }
  return rt;
}

}  // namespace tutti::gpu_setup

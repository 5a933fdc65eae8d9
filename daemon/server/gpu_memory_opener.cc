#include "daemon/server/gpu_memory_opener.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tutti::server {
namespace {

using tutti::v1::MemoryRegion;

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
                                                          engine::CudaIoContext context) {
  if (req.placements_size() != static_cast<int>(ns.num_objects)) {
    return absl::InvalidArgumentError(absl::StrCat("placements: ", req.placements_size(),
                                                   " given, the namespace's layout has ",
                                                   ns.num_objects, " objects per block"));
  }
  engine::CudaEngineRegions regions;
  regions.num_layers = ns.num_objects / ns.parts;
  regions.layout.num_blocks = req.num_blocks();
  regions.layout.object_len = ns.object_len;
  for (const auto& p : req.placements()) {
    regions.layout.placements.push_back({p.region(), p.offset(), p.block_stride()});
  }
  for (const MemoryRegion& r : req.regions()) regions.regions.push_back(ToIpcRegion(r.cuda_ipc()));
  if (req.has_ready_words()) {
    regions.ready_words = ToIpcRegion(req.ready_words().region());
    regions.ready_word_count = req.ready_words().count();
  }
  return engine::OpenCudaEngineIo(regions, context);
}

}  // namespace

MemoryOpener GpuMemoryOpener(engine::CudaIoContext context) {
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

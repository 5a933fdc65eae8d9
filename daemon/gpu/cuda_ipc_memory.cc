#include "daemon/gpu/cuda_ipc_memory.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/cuda_device.h"
#include "gpu/probe.h"

namespace tutti::gpu {
namespace {

std::vector<uint64_t> Sizes(absl::Span<const IpcRegion> regions) {
  std::vector<uint64_t> sizes;
  for (const IpcRegion& r : regions) sizes.push_back(r.size_bytes);
  return sizes;
}

std::vector<uint64_t> Sizes(absl::Span<const LocalRegion> regions) {
  std::vector<uint64_t> sizes;
  for (const LocalRegion& r : regions) sizes.push_back(r.size_bytes);
  return sizes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcMemory>> CudaIpcMemory::Open(
    const EngineLayout& layout, absl::Span<const IpcRegion> regions,
    absl::Span<const StagingRegion> staging, IoStream* stream) {
  ASSIGN_OR_RETURN(DeviceInfo device, Probe(stream->device()));
  for (size_t i = 0; i < regions.size(); ++i) {
    RETURN_IF_ERROR(CheckIpcRegion(regions[i], device, absl::StrCat("regions[", i, "]")));
  }
  RETURN_IF_ERROR(ValidateLayout(layout, Sizes(regions)));
  ASSIGN_OR_RETURN(StagingMap map, StagingMap::Create(staging));
  auto cuda = std::make_unique<CudaDevice>(stream);
  Device* const d = cuda.get();
  std::unique_ptr<CudaIpcMemory> mem(new CudaIpcMemory(layout, d, std::move(cuda)));
  mem->staging_ = std::move(map);
  for (size_t i = 0; i < regions.size(); ++i) {
    // On error, the mappings opened so far close with `mem`.
    ASSIGN_OR_RETURN(std::unique_ptr<IpcMapping> m,
                     IpcMapping::Open(regions[i], device, absl::StrCat("regions[", i, "]")));
    mem->bases_.push_back(m->base());
    mem->mappings_.push_back(std::move(m));
  }
  return mem;
}

absl::StatusOr<std::unique_ptr<CudaIpcMemory>> CudaIpcMemory::WrapLocal(
    const EngineLayout& layout, absl::Span<const LocalRegion> regions,
    absl::Span<const StagingRegion> staging, IoStream* stream) {
  RETURN_IF_ERROR(ValidateLayout(layout, Sizes(regions)));
  ASSIGN_OR_RETURN(StagingMap map, StagingMap::Create(staging));
  auto cuda = std::make_unique<CudaDevice>(stream);
  Device* const d = cuda.get();
  std::unique_ptr<CudaIpcMemory> mem(new CudaIpcMemory(layout, d, std::move(cuda)));
  mem->staging_ = std::move(map);
  for (const LocalRegion& r : regions) mem->bases_.push_back(static_cast<uint8_t*>(r.device_ptr));
  return mem;
}

absl::StatusOr<std::unique_ptr<CudaIpcMemory>> CudaIpcMemory::WrapLocal(
    const EngineLayout& layout, absl::Span<const LocalRegion> regions,
    absl::Span<const StagingRegion> staging, Device* device) {
  RETURN_IF_ERROR(ValidateLayout(layout, Sizes(regions)));
  ASSIGN_OR_RETURN(StagingMap map, StagingMap::Create(staging));
  std::unique_ptr<CudaIpcMemory> mem(new CudaIpcMemory(layout, device, nullptr));
  mem->staging_ = std::move(map);
  for (const LocalRegion& r : regions) mem->bases_.push_back(static_cast<uint8_t*>(r.device_ptr));
  return mem;
}

absl::Status CudaIpcMemory::Synchronize() {
  return device_->SyncStream(device_->io_stream(), "I/O stream synchronize");
}

CudaIpcMemory::~CudaIpcMemory() {
  auto logger = log::Get("gpu");
  absl::Status s = Synchronize();
  if (!s.ok()) logger->error("gpu{}: closing engine memory: {}", device_->ordinal(), s.ToString());
  for (size_t i = 0; i < mappings_.size(); ++i) {
    s = mappings_[i]->Close();
    if (!s.ok()) logger->error("gpu{}: regions[{}]: {}", device_->ordinal(), i, s.ToString());
  }
}

absl::Status CudaIpcMemory::Enqueue(absl::Span<const engine::CopyOp> ops, CopyDirection direction) {
  thread_local std::vector<CopyDesc> descs;  // keeps its capacity: no allocation per call
  RETURN_IF_ERROR(BuildCopyDescs(ops, layout_, bases_, staging_, direction, &descs));
  if (descs.empty()) return absl::OkStatus();
  absl::MutexLock lock(&device_->io_mutex());
  return device_->LaunchCopy(
      descs.data(), descs.size(), layout_.object_len, device_->io_stream(),
      direction == CopyDirection::kToEngine ? "scatter launch" : "gather launch");
}

const uint8_t* CudaIpcMemory::EngineObject(uint32_t block, uint32_t object) const {
  return EngineObjectAddress(layout_, bases_, block, object);
}

absl::Status CudaIpcMemory::EnqueueScatter(absl::Span<const engine::CopyOp> ops) {
  return Enqueue(ops, CopyDirection::kToEngine);
}

absl::Status CudaIpcMemory::EnqueueGather(absl::Span<const engine::CopyOp> ops) {
  return Enqueue(ops, CopyDirection::kFromEngine);
}

absl::Status CudaIpcMemory::EnqueueScatterByCopyEngine(absl::Span<const engine::CopyOp> ops) {
  return EnqueueByCopyEngine(ops, CopyDirection::kToEngine, nullptr);
}

absl::Status CudaIpcMemory::EnqueueGatherByCopyEngine(absl::Span<const engine::CopyOp> ops,
                                                      Device::Stream stream) {
  return EnqueueByCopyEngine(ops, CopyDirection::kFromEngine, stream);
}

absl::Status CudaIpcMemory::EnqueueByCopyEngine(absl::Span<const engine::CopyOp> ops,
                                                CopyDirection direction, Device::Stream stream) {
  thread_local std::vector<CopyDesc> descs;  // these keep their capacity: no allocation per call
  thread_local std::vector<uint32_t> groups;
  RETURN_IF_ERROR(BuildCopyDescs(ops, layout_, bases_, staging_, direction, &descs, &groups));
  if (descs.empty()) return absl::OkStatus();
  const char* what = direction == CopyDirection::kToEngine ? "cudaMemcpyBatchAsync(scatter)"
                                                           : "cudaMemcpyBatchAsync(gather)";
  if (stream != nullptr && stream != device_->io_stream()) {
    return device_->CopyByCopyEngine(descs.data(), groups.data(), descs.size(), layout_.object_len,
                                     stream, what);
  }
  absl::MutexLock lock(&device_->io_mutex());
  return device_->CopyByCopyEngine(descs.data(), groups.data(), descs.size(), layout_.object_len,
                                   device_->io_stream(), what);
}

absl::Status CudaIpcMemory::Scatter(absl::Span<const engine::CopyOp> ops) {
  RETURN_IF_ERROR(EnqueueScatter(ops));
  return Synchronize();
}

absl::Status CudaIpcMemory::Gather(absl::Span<const engine::CopyOp> ops) {
  RETURN_IF_ERROR(EnqueueGather(ops));
  return Synchronize();
}

}  // namespace tutti::gpu

// GPU mode's EngineIo: an engine's KV tensors (and its ready words) in its own GPU memory, reached
// through CUDA IPC handles; the daemon copies layers between its staging and their blocks on its
// I/O stream.
//
// OpenCudaEngineIo opens the KV tensors as a gpu::CudaIpcMemory on the daemon's GPU (handle length
// and GPU UUID checked first, INVALID_ARGUMENT for another GPU's UUID; the layout checked against
// the declared sizes and the declared sizes against the mapped allocations), then the ready words,
// if given, as gpu::ReadyWords (count >= num_layers + 1, else INVALID_ARGUMENT; the words' own
// errors prefixed "ready_words: "). On any error, whatever was opened is closed again. The caller
// (the server's GpuMemoryOpener, daemon/server/gpu_memory_opener.h) translates an Attach request
// into CudaEngineRegions and checks the placements against the namespace first.
//
// The EngineIo it makes copies Retrieve layers with the shared gpu::LayerCopier (staged or
// mapped, see daemon/gpu/layer_copier.h) on a lane of its own (so its overlapped layers wait for
// its own layers only, never for another session's), gathers Store blocks with the copy kernel
// straight into the store's registered staging, and writes ready words on the I/O stream after the
// copies. Close() takes the session's lock (so it waits for a layer in progress), waits for the I/O
// stream, and closes the ready words' and the KV tensors' IPC mappings; nothing is enqueued into
// the engine's memory afterwards. Its contract is EngineIo's (daemon/engine/engine_io.h).
//
// Built only with the CUDA toolkit (it links //gpu and //daemon/gpu; tools/cuda.bzl).
//
// Thread-safety: OpenCudaEngineIo and the EngineIo may be used from any thread; one session's
// copies are serialized by its lock.
#ifndef TUTTI_DAEMON_ENGINE_CUDA_ENGINE_IO_H_
#define TUTTI_DAEMON_ENGINE_CUDA_ENGINE_IO_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/engine/engine_io.h"
#include "daemon/gpu/layer_copier.h"
#include "daemon/gpu/placement.h"
#include "gpu/io_stream.h"
#include "gpu/ipc_mapping.h"

namespace tutti::engine {

// What a cuda EngineIo needs of the daemon's GPU set-up; both must outlive every EngineIo.
struct CudaIoContext {
  gpu::IoStream* stream = nullptr;
  gpu::LayerCopier* copier = nullptr;
};

// One engine's GPU memory as its Attach names it.
struct CudaEngineRegions {
  gpu::EngineLayout layout;                   // blocks, object length, one placement per object
  std::vector<gpu::IpcRegion> regions;        // the KV tensors the placements index
  uint32_t num_layers = 0;                    // ready words num_layers + 1 at least, if given
  std::optional<gpu::IpcRegion> ready_words;  // the words from byte 0 of this allocation
  uint32_t ready_word_count = 0;
};

absl::StatusOr<std::unique_ptr<EngineIo>> OpenCudaEngineIo(const CudaEngineRegions& regions,
                                                           CudaIoContext context);

}  // namespace tutti::engine

#endif  // TUTTI_DAEMON_ENGINE_CUDA_ENGINE_IO_H_

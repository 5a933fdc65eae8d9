// GPU mode: engines attach CUDA IPC handles of their KV tensors (and of their ready words), and
// the daemon copies layers between its staging and their blocks on its I/O stream.
//
// GpuMemoryOpener is the MemoryOpener of a daemon with a GPU. For an Attach whose regions are all
// cuda_ipc it opens them as a gpu::CudaIpcMemory on the daemon's GPU (handle length and GPU UUID
// checked first, INVALID_ARGUMENT for another GPU's UUID; the layout checked against the declared
// sizes and the declared sizes against the mapped allocations), and the ready words, if given, as
// gpu::ReadyWords (count >= num_layers + 1, else INVALID_ARGUMENT). An Attach whose regions are
// all host_shm is opened as in host mode (HostMemoryOpener); mixing the two kinds is
// INVALID_ARGUMENT. On any error, whatever was opened is closed again.
//
// The EngineIo it makes copies Retrieve layers with the shared gpu::LayerCopier (staged or
// mapped, see gpu/layer_copier.h), gathers Store blocks with the copy kernel straight into the
// store's registered staging, and writes ready words on the I/O stream after the copies. Close()
// takes the session's lock (so it waits for a layer in progress), waits for the I/O stream, and
// closes the ready words' and the KV tensors' IPC mappings; nothing is enqueued into the engine's
// memory afterwards.
//
// Thread-safety: the opener and the EngineIo may be used from any thread; one session's copies
// are serialized by its lock.
#ifndef TUTTI_DAEMON_SERVER_GPU_ENGINE_IO_H_
#define TUTTI_DAEMON_SERVER_GPU_ENGINE_IO_H_

#include "daemon/server/kvcache_service.h"
#include "gpu/io_stream.h"
#include "gpu/layer_copier.h"

namespace tutti::server {

// What GpuMemoryOpener needs of the daemon's GPU set-up; both must outlive every session.
struct GpuIoContext {
  gpu::IoStream* stream = nullptr;
  gpu::LayerCopier* copier = nullptr;
};

MemoryOpener GpuMemoryOpener(GpuIoContext context);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_GPU_ENGINE_IO_H_

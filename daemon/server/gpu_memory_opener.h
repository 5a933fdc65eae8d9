// GPU mode's MemoryOpener: an Attach request's CUDA IPC regions, translated into the engine seam's
// terms (daemon/engine/cuda_engine_io.h) on the daemon's GPU.
//
// GpuMemoryOpener is the MemoryOpener of a daemon with a GPU. For an Attach whose regions are all
// cuda_ipc it checks that the request has one placement per object of the namespace's layout
// (else INVALID_ARGUMENT) and opens the regions and the ready words, if given, with
// engine::OpenCudaEngineIo (whose errors it returns). An Attach whose regions are all host_shm is
// opened as in host mode (HostMemoryOpener); mixing the two kinds, or a region with no kind, is
// INVALID_ARGUMENT.
//
// Built only with the CUDA toolkit (daemon/BUILD's gpu_setup_cuda links it).
//
// Thread-safety: the opener may be called from any thread.
#ifndef TUTTI_DAEMON_SERVER_GPU_MEMORY_OPENER_H_
#define TUTTI_DAEMON_SERVER_GPU_MEMORY_OPENER_H_

#include "daemon/engine/cuda_engine_io.h"
#include "daemon/server/kvcache_service.h"

namespace tutti::server {

// `context`'s stream and copier must outlive every session.
MemoryOpener GpuMemoryOpener(engine::CudaIoContext context);

}  // namespace tutti::server

#endif  // TUTTI_DAEMON_SERVER_GPU_MEMORY_OPENER_H_

// How one attached engine's data moves: the seam between host mode and GPU mode, and between the
// RPC layer and an engine's memory.
//
// An EngineIo is made at Attach from the request's regions (the server's MemoryOpener,
// daemon/server/kvcache_service.h, translates the request): host shared memory (HostEngineIo
// below) or CUDA IPC device memory with optional ready words (daemon/engine/cuda_engine_io.h).
// The session owns it; requests in flight share it. Nothing here knows of gRPC or the protocol.
//
// Ready words (GPU mode): word l < num_layers is written with a Retrieve's ticket once layer l is
// in the engine's blocks or has failed; word num_layers with a Store's ticket once its blocks are
// captured. The server writes every word of an admitted Retrieve whatever happens (ScatterLayer
// for layers copied, SignalLayers for the rest), unless the engine is gone, so no engine stream
// waits forever on a live daemon.
//
// Close() is the fence against writing into a dead engine: after it returns nothing more is
// enqueued to the engine's memory, work in flight has finished, and the mappings are released;
// every later call fails with CANCELLED.
//
// Thread-safety: every method may be called from any thread.
#ifndef TUTTI_DAEMON_ENGINE_ENGINE_IO_H_
#define TUTTI_DAEMON_ENGINE_ENGINE_IO_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/engine/engine_memory.h"

namespace tutti::engine {

class EngineIo {
 public:
  virtual ~EngineIo() = default;

  virtual std::string_view kind() const = 0;  // "host_shm", "cuda_ipc"
  virtual uint32_t num_blocks() const = 0;
  // GPU memory: Retrieve allows one call in flight per session (the ready words need it).
  virtual bool is_device() const = 0;
  // Ready words are attached: Retrieve and Store write tickets into them.
  virtual bool has_ready_words() const = 0;

  // Copies one Retrieve layer's objects (op.staging: host staging) into the engine's blocks, then
  // writes `ticket` into ready word `layer` (if attached). Returns once the staging may be
  // reused. CANCELLED after Close; INVALID_ARGUMENT for ops outside the engine's memory;
  // INTERNAL for device errors (the word is then not written: call SignalLayers).
  [[nodiscard]] virtual absl::Status ScatterLayer(uint32_t layer, absl::Span<const CopyOp> ops,
                                                  uint32_t ticket) = 0;
  // Like ScatterLayer, but returns once the layer is enqueued and every layer before it has
  // landed, so the next layer's copies overlap this one's tail. The caller keeps this layer's
  // sources unchanged until a later ScatterLayer, EnqueueLayer or Drain returns. By default the
  // same as ScatterLayer.
  [[nodiscard]] virtual absl::Status EnqueueLayer(uint32_t layer, absl::Span<const CopyOp> ops,
                                                  uint32_t ticket) {
    return ScatterLayer(layer, ops, ticket);
  }
  // Returns once every layer enqueued so far has landed. OK by default (ScatterLayer waits).
  [[nodiscard]] virtual absl::Status Drain() { return absl::OkStatus(); }
  // Writes `ticket` into ready words [begin, end) without copying (failed or abandoned layers).
  // OK without ready words; CANCELLED after Close.
  [[nodiscard]] virtual absl::Status SignalLayers(uint32_t begin, uint32_t end,
                                                  uint32_t ticket) = 0;
  // Copies each op's object from the engine's block into staging; returns once staging holds it.
  [[nodiscard]] virtual absl::Status Gather(absl::Span<const CopyOp> ops) = 0;
  // Writes `ticket` into ready word num_layers (a Store's blocks are captured). OK without ready
  // words; CANCELLED after Close.
  [[nodiscard]] virtual absl::Status SignalCaptured(uint32_t ticket) = 0;

  // Stops every copy into or out of the engine: waits for calls in progress (at most one layer),
  // then releases the engine's mappings. Idempotent.
  virtual void Close() = 0;
};

// Host mode: the engine's memory is host shared memory; there are no ready words. Close() makes
// later calls fail; the memory itself is unmapped when the last reference goes (a copy in
// progress on another thread keeps it mapped until it returns).
std::unique_ptr<EngineIo> MakeHostEngineIo(std::unique_ptr<EngineMemory> memory);

// A memory-less session's (AttachRequest with no regions, no placements, num_blocks 0): kind
// "none", no blocks; every copy fails with FAILED_PRECONDITION (the service refuses Retrieve and
// Store of such a session before it gets here), the signals are OK no-ops.
std::unique_ptr<EngineIo> MakeNoMemoryEngineIo();

}  // namespace tutti::engine

#endif  // TUTTI_DAEMON_ENGINE_ENGINE_IO_H_

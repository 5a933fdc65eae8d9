// An engine's KV-cache memory as the daemon sees it: where object (layer, part) of engine block b
// lives, and copies between it and daemon staging.
//
// Implementations: host shared memory (host_memory.h: the engine names POSIX shm objects) and CUDA
// IPC device memory (gpu/, the GPU issue). Created at Attach from the request's regions and
// placements, which are validated against the region sizes; released at Detach or session expiry.
//
// Thread-safety: Scatter and Gather may run concurrently from several threads (different requests
// of one session).
#ifndef TUTTI_DAEMON_ENGINE_ENGINE_MEMORY_H_
#define TUTTI_DAEMON_ENGINE_ENGINE_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/engine/copy_op.h"

namespace tutti::engine {

class EngineMemory {
 public:
  virtual ~EngineMemory() = default;

  virtual std::string_view kind() const = 0;  // "host_shm", "cuda_ipc"
  uint32_t num_blocks() const { return num_blocks_; }
  uint32_t num_objects() const { return num_objects_; }
  uint32_t object_len() const { return object_len_; }

  // Copies each op's object from staging into the engine's block. Returns when the data is in
  // the engine's memory (host) or ordered before `done` on the I/O stream (device). Preconditions:
  // block < num_blocks(), object < num_objects() (the server validates requests first).
  [[nodiscard]] virtual absl::Status Scatter(absl::Span<const CopyOp> ops) = 0;
  // Copies each op's object from the engine's block into staging; returns when staging holds it.
  [[nodiscard]] virtual absl::Status Gather(absl::Span<const CopyOp> ops) = 0;

 protected:
  EngineMemory(uint32_t num_blocks, uint32_t num_objects, uint32_t object_len)
      : num_blocks_(num_blocks), num_objects_(num_objects), object_len_(object_len) {}

 private:
  const uint32_t num_blocks_;
  const uint32_t num_objects_;
  const uint32_t object_len_;
};

}  // namespace tutti::engine

#endif  // TUTTI_DAEMON_ENGINE_ENGINE_MEMORY_H_

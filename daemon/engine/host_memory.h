// EngineMemory over shared memory the engine created (host mode: CI, CPU engines, and GPU engines
// without CUDA IPC). The engine hands the daemon its descriptors (common/handoff.h); the
// daemon maps each one read-write, shared, and copies with memcpy. It never opens memory by name:
// it can only reach what the engine itself could open. Pages are not touched at Attach (no
// MAP_POPULATE): a sparse region costs nothing until blocks are copied into it, and only the
// bytes the layout places blocks at are ever touched.
//
// An engine that shrinks (ftruncate) an object after Attach takes pages away under the daemon's
// mapping. Scatter and Gather check every object's size before copying, and copy through
// GuardedCopy (fault_guard.h), so a shrink racing with a copy is caught too: the call fails with
// FAILED_PRECONDITION, as does every later one on this memory, and the daemon lives on.
//
// Thread-safety: Scatter and Gather may run concurrently (EngineMemory's contract).
#ifndef TUTTI_DAEMON_ENGINE_HOST_MEMORY_H_
#define TUTTI_DAEMON_ENGINE_HOST_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/unique_fd.h"
#include "daemon/engine/engine_memory.h"
#include "daemon/engine/fault_guard.h"
#include "daemon/engine/placement.h"

namespace tutti::engine {

// A shared-memory object the engine handed over (tutti.v1.HostShmRegion).
struct HostShmRegion {
  std::string label;  // for messages: the engine's name for it, escaped
  UniqueFd fd;        // a regular file (shm or memfd) the engine opened read-write
  uint64_t size_bytes = 0;
};

class HostMemory final : public EngineMemory {
 public:
  // Validates `placements` (ValidatePlacements) against the declared sizes, then maps every
  // region's descriptor, taking ownership of them. Errors, naming the region or placement index:
  // INVALID_ARGUMENT for a size of 0, a descriptor that is not a regular file, not open
  // read-write, or smaller than its declared size, no regions, or a bad placement;
  // FAILED_PRECONDITION (with the errno text) when a region cannot be mapped; INTERNAL if the
  // SIGBUS guard cannot be installed. Nothing stays mapped after an error.
  static absl::StatusOr<std::unique_ptr<HostMemory>> Create(
      std::vector<HostShmRegion> regions, const std::vector<ObjectPlacement>& placements,
      uint32_t num_blocks, uint32_t num_objects, uint32_t object_len);

  // Unmaps every region. Callers keep the object alive (shared_ptr) while a copy is in flight.
  ~HostMemory() override;

  std::string_view kind() const override { return "host_shm"; }
  [[nodiscard]] absl::Status Scatter(absl::Span<const CopyOp> ops) override;
  [[nodiscard]] absl::Status Gather(absl::Span<const CopyOp> ops) override;

 private:
  struct Mapping {
    UniqueFd fd;
    uint8_t* base = nullptr;
    uint64_t len = 0;
    std::string name;
    std::unique_ptr<GuardedRange> guard;  // over [base, base + len)
  };

  HostMemory(std::vector<Mapping> maps, std::vector<ObjectPlacement> placements,
             uint32_t num_blocks, uint32_t num_objects, uint32_t object_len);
  static void UnmapAll(const std::vector<Mapping>& maps);
  // FAILED_PRECONDITION if some object is now smaller than its mapping, or shrank during a copy.
  absl::Status CheckNotShrunk() const;
  static absl::Status ShrankDuringCopy(const Mapping& m);
  // Where object `object` of block `block` lies, and the mapping that holds it.
  uint8_t* Address(uint32_t block, uint32_t object, Mapping** mapping);

  std::vector<Mapping> maps_;
  const std::vector<ObjectPlacement> placements_;
};

}  // namespace tutti::engine

#endif  // TUTTI_DAEMON_ENGINE_HOST_MEMORY_H_

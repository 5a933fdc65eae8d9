// EngineMemory over POSIX shared memory the engine created (host mode: CI, CPU engines, and GPU
// engines without CUDA IPC). The daemon maps each named object read-write, shared, and copies with
// memcpy.
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
#include "daemon/engine/engine_memory.h"
#include "daemon/engine/fault_guard.h"
#include "daemon/engine/placement.h"

namespace tutti::engine {

// A shared-memory object named by the engine (tutti.v1.HostShmRegion).
struct HostShmRegion {
  std::string name;  // shm_open name: '/' then 1..199 characters, none of them '/'
  uint64_t size_bytes = 0;
};

// Returns OK if `name` is a valid shm_open name by the rule above, else INVALID_ARGUMENT.
absl::Status ValidateShmName(const std::string& name);

class HostMemory final : public EngineMemory {
 public:
  // Opens (O_RDWR) and maps every region, then validates `placements` (ValidatePlacements) against
  // the declared sizes. Errors, naming the region or placement index: INVALID_ARGUMENT for a bad
  // name, a size of 0, an object smaller than its declared size, no regions, or a bad placement;
  // FAILED_PRECONDITION (with the errno text) when an object cannot be opened or mapped; INTERNAL
  // if the SIGBUS guard cannot be installed. Nothing
  // stays mapped after an error. The engine may unlink the names after Attach; the mappings stay.
  static absl::StatusOr<std::unique_ptr<HostMemory>> Create(
      const std::vector<HostShmRegion>& regions, const std::vector<ObjectPlacement>& placements,
      uint32_t num_blocks, uint32_t num_objects, uint32_t object_len);

  // Unmaps every region. Callers keep the object alive (shared_ptr) while a copy is in flight.
  ~HostMemory() override;

  std::string_view kind() const override { return "host_shm"; }
  [[nodiscard]] absl::Status Scatter(absl::Span<const CopyOp> ops) override;
  [[nodiscard]] absl::Status Gather(absl::Span<const CopyOp> ops) override;

 private:
  struct Mapping {
    int fd = -1;
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

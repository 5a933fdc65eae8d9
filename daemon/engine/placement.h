// Where an engine's objects live inside its registered memory regions, and the checks that every
// object of every block stays inside its region. Shared by every EngineMemory implementation
// (host shared memory here, CUDA IPC in gpu/).
//
// Object o of engine block b lives at region(placements[o].region) + placements[o].offset +
// b * placements[o].block_stride and is object_len bytes long (tutti.v1.ObjectPlacement).
//
// Thread-safety: plain values and a pure function.
#ifndef TUTTI_DAEMON_ENGINE_PLACEMENT_H_
#define TUTTI_DAEMON_ENGINE_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace tutti::engine {

struct ObjectPlacement {
  uint32_t region = 0;
  uint64_t offset = 0;
  uint64_t block_stride = 0;
};

// Checks `placements` against regions of `region_sizes` bytes. INVALID_ARGUMENT, naming the
// placement index, when: placements.size() != num_objects; num_blocks, num_objects or object_len
// is 0; a placement names a region that does not exist; with num_blocks > 1, block_stride <
// object_len (blocks would overlap); or offset + (num_blocks - 1) * block_stride + object_len
// exceeds its region's size (computed without overflow).
absl::Status ValidatePlacements(const std::vector<uint64_t>& region_sizes,
                                const std::vector<ObjectPlacement>& placements, uint32_t num_blocks,
                                uint32_t num_objects, uint32_t object_len);

}  // namespace tutti::engine

#endif  // TUTTI_DAEMON_ENGINE_PLACEMENT_H_

// The one op type of every copy between the daemon's memory and an engine's blocks: a Retrieve's
// scatter (the datapath's reader emits these, engine::EngineMemory::Scatter consumes them) and a
// Store's gather.
#ifndef TUTTI_DAEMON_ENGINE_COPY_OP_H_
#define TUTTI_DAEMON_ENGINE_COPY_OP_H_

#include <cstdint>

namespace tutti::engine {

// A gather's checksum of one object, for engine memories that compute it with the copy (GPU
// mode: the hash kernel over the engine's object, daemon/gpu/layer_copier.h). `seed` is the
// caller's (pool::ObjectChecksumSeed of the object's block); the engine memory sets `value` to
// XXH3_64bits_withSeed(the object_len bytes it copied into staging, seed), i.e.
// pool::ObjectChecksum of them, and `done` once it has, only if the gather succeeded. Engine
// memories that cannot leave `done` false, and the caller computes the checksum itself.
struct ObjectSum {
  uint64_t seed = 0;
  uint64_t value = 0;
  bool done = false;
};

// Copies one object (its length is the namespace's object_len) between daemon memory and object
// `object` of engine block `block`. A scatter only reads `staging` (read staging, or the DRAM
// tier); a gather writes it (store staging).
struct CopyOp {
  uint32_t block;
  uint32_t object;  // layer * parts + part
  uint8_t* staging;
  // Scatters only: the same bytes as `staging`, already checked and held in GPU memory (a GPU
  // verifier's copy, datapath/verifier.h), or null. A GPU engine memory copies from here, device
  // to device, instead of crossing PCIe again; other engine memories ignore it.
  const uint8_t* device_copy = nullptr;
  // Gathers only: where the engine memory may put the checksum of the bytes it copies, or null.
  ObjectSum* sum = nullptr;
};

}  // namespace tutti::engine

#endif  // TUTTI_DAEMON_ENGINE_COPY_OP_H_

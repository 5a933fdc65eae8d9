// Deterministic KV content on the GPU for tests and benchmarks: fills engine objects with words
// derived from (seed, tag) and counts, on the GPU, the words that differ. Content follows the tag
// (the key and object), not the engine block, so blocks stored from one place and retrieved into
// another can be checked where they land, on the engine's stream, without copying them out.
#ifndef TUTTI_TESTS_GPU_CONTENT_KERNEL_H_
#define TUTTI_TESTS_GPU_CONTENT_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tutti::gputest {

// One object: `ptr` (device memory, 8-byte aligned) and the tag its content derives from.
struct ObjectRef {
  void* ptr;
  uint64_t tag;
};

// Fills each of `count` objects (refs in device memory) of `object_len` bytes (a multiple of 8).
cudaError_t LaunchFillObjects(const ObjectRef* refs, uint32_t count, uint32_t object_len,
                              uint64_t seed, cudaStream_t stream);

// Adds to *mismatches (device memory) the number of 8-byte words of the objects that differ from
// what LaunchFillObjects writes for `seed`.
cudaError_t LaunchCountMismatches(const ObjectRef* refs, uint32_t count, uint32_t object_len,
                                  uint64_t seed, unsigned long long* mismatches,
                                  cudaStream_t stream);

}  // namespace tutti::gputest

#endif  // TUTTI_TESTS_GPU_CONTENT_KERNEL_H_

// XXH3-64 on the GPU: the object checksums of daemon/pool/slot_header.h (XXH3_64bits_withSeed with
// a per-object seed) computed over objects in device memory, one CTA per object.
//
// Each thread takes 16-byte vectors of its object (two of the eight 64-bit accumulator lanes of
// one 64-byte stripe), the warps sum each 1 KiB block's contributions per lane, and eight threads
// then run the lanes' sequential part (a scramble per full block) and one thread merges them. The
// value is XXH3's, bit for bit (daemon/gpu/gpu_verifier_test.cc compares it with libxxhash).
//
// Supported lengths: GpuHashSupports (gpu/hash_desc.h, with the descriptor).
//
// Thread-safety: LaunchHashObjects may be called from any thread.
#ifndef TUTTI_GPU_HASH_KERNEL_H_
#define TUTTI_GPU_HASH_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu/hash_desc.h"

namespace tutti::gpu {

// Enqueues on `stream`: hashes[i] = XXH3_64bits_withSeed(descs[i].data, descs[i].len,
// descs[i].seed) for i < count. `descs` and `hashes` are device-addressable and stay valid until
// the kernel has run. Preconditions: GpuHashSupports(len) for every desc. Returns the launch
// error (after clearing the thread's stale last-error state).
cudaError_t LaunchHashObjects(const HashDesc* descs, uint32_t count, const Xxh3Secret& secret,
                              uint64_t* hashes, cudaStream_t stream);

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_HASH_KERNEL_H_

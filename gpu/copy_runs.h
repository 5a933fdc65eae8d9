// Copies of equal-length objects merged into runs: where one object's source and destination both
// end where another's begin, the two become one copy. What the copy engines are given
// (Device::CopyByCopyEngine): each copy costs microseconds of driver and engine set-up, so one
// copy of a 1 MiB run (object j of 32 consecutive engine blocks, landing in adjacent staging
// frames; daemon/store/staging.h InterleavedFrames) moves far faster than 32 copies of 32 KiB.
//
// Contract: MergeCopyRuns copies exactly the bytes the descriptors name, each from the same
// source to the same destination; only how many copies carry them changes. Descriptors merge only
// within one group: the caller's way to keep a run inside one allocation on each side (two
// allocations may lie side by side in the address space, and one copy must not span them). It
// assumes what the copy calls already require: no destination overlaps another copy's source or
// destination (the copies of one call run in no set order).
//
// Thread-safety: plain functions and data.
#ifndef TUTTI_GPU_COPY_RUNS_H_
#define TUTTI_GPU_COPY_RUNS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu/copy_desc.h"

namespace tutti::gpu {

// `bytes` from src to dst: one or more whole objects.
struct CopyRun {
  const void* src;
  void* dst;
  size_t bytes;
};

// Replaces *runs with the `count` copies of `object_len` bytes each of `descs`, merged into runs;
// descs[i] is in group groups[i] (null `groups`: none merge, one run a descriptor).
void MergeCopyRuns(const CopyDesc* descs, const uint32_t* groups, size_t count, uint32_t object_len,
                   std::vector<CopyRun>* runs);

}  // namespace tutti::gpu

#endif  // TUTTI_GPU_COPY_RUNS_H_

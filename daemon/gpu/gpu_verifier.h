// A datapath::Verifier on the GPU: checks a Retrieve's objects (pool::ObjectChecksum, XXH3) with
// the hash kernel (gpu/hash_kernel.h) instead of the CPU's cores.
//
// Verify queues the batch and returns. One thread of the verifier takes what is queued (as much
// as a slot holds, the batches' streams in turn: datapath/verifier.h), copies the objects from
// (registered) host staging into a slot of its device scratch with the copy engine (adjacent
// objects in one copy, on a stream of their own), launches the kernel over them on `stream` once
// they have landed and copies the hashes back. Up to `slots` slots are in flight at once (each
// filled as soon as it is free and something is queued), so later slots' copies run while the
// kernel checks the earlier ones and the thread answers them, oldest first. Each batch's `done`
// then runs on that thread.
// VerifyReleasing's `released` runs on CUDA's callback thread as soon as the batch's copies have
// landed, before the kernel: the host bytes can be reused while the check goes on. With
// copy_on_arrival, placed batches are copied when they arrive, not when a slot takes them. A CUDA
// error after that answers the batch's objects kNotChecked (the bytes are gone); before it, the CPU
// checks them and `released` follows.
//
// The fallback verifier (the CPU's) takes what the GPU does not: objects of lengths the kernel
// does not support, a batch larger than a slot, and every batch of a slot whose CUDA work failed
// (the error is logged with its CUDA name). A check is never skipped: the answer is always a
// checksum comparison.
//
// Mirror: objects whose bytes lie in `options.mirror` (the retrieve staging) are copied to the
// same offset of a device buffer of that size (allocated at creation) and checked there; each
// one that matches gets that address in ObjectCheck::device_copy, so the engine copy reads it in
// GPU memory (engine::CopyOp::device_copy) and the bytes cross PCIe once. The copy stays valid
// while the staging bytes are unchanged: the reader reuses staging only after the engine copy of
// its layer has landed. Objects outside the mirror go through the slots' scratch and cross PCIe
// twice (once here, once when the copier moves them): docs/gpu.md says when that pays.
//
// Placed objects: an object with ObjectCheck::place (a layer the reader stages in GPU memory,
// its reads landing in small host bounce slots) is copied there instead and checked in place,
// with or without a mirror; a match gets that address in device_copy. A batch the CPU checks
// instead (see above) places nothing, and the reader serves those objects as misses.
//
// Thread-safety: Verify may be called from any thread, concurrently. Lifetime: `fallback` and the
// staging the objects live in must outlive the verifier; destroying it waits for every batch.
#ifndef TUTTI_DAEMON_GPU_GPU_VERIFIER_H_
#define TUTTI_DAEMON_GPU_GPU_VERIFIER_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/datapath/verifier.h"

namespace tutti::gpu {

class IoStream;

// What copies on arrival took, summed (GpuVerifierOptions::counters): batches copied, the groups
// they were copied in (each group's bytes go back together, after its last copy), the time from a
// batch's arrival (VerifyReleasing) to its copies being enqueued by the verifier's thread, and from
// then to its `released` running (the copies on one stream, then CUDA's host function).
struct ArrivalCounters {
  std::atomic<uint64_t> arrivals{0}, groups{0}, pickup_ns{0}, copy_release_ns{0};
};

struct GpuVerifierOptions {
  // Device scratch per slot, the most objects one slot holds, and the slots in flight at once
  // (>= 2). A batch queued behind full slots waits for them all: fewer objects a slot answer a
  // Retrieve beside a large one sooner, more slots keep the copies going with small slots.
  uint64_t slot_bytes = 16ull << 20;
  uint32_t max_objects_per_slot = 4096;
  // While batches of more than one stream are queued as a slot is filled, it takes at most this
  // many objects (0: max_objects_per_slot): small checks while Retrieves share, whole ones for
  // a Retrieve alone (daemon/gpu/check_take.h).
  uint32_t max_objects_per_shared_slot = 0;
  uint32_t slots = 2;
  // Placed batches (VerifyReleasing, every object with a place or in the mirror) are copied to
  // their places as they arrive, each group of arrivals with one release after its copies (on a
  // stream of its own), instead of when a slot takes them: their host bytes go back without
  // waiting for a free slot, and the slot that checks them only hashes. The `done` of a batch
  // still follows its `released`. Off here; tuttid's config turns it on by default
  // (datapath.gpu_check_copy_on_arrival; docs/gpu.md, "Stop 53").
  bool copy_on_arrival = false;
  // Where copies on arrival are counted (null: not counted); must outlive the verifier.
  ArrivalCounters* counters = nullptr;
  // Registered host staging to mirror in device memory (empty: none); 16-byte aligned.
  absl::Span<const uint8_t> mirror;
};

// `stream` (its device; kernels go on a stream of its own in the same context kind) and
// `fallback` must outlive the verifier. Errors: the CUDA error of an allocation, named.
absl::StatusOr<std::unique_ptr<datapath::Verifier>> MakeGpuVerifier(
    const GpuVerifierOptions& options, const IoStream& stream, datapath::Verifier* fallback);

}  // namespace tutti::gpu

#endif  // TUTTI_DAEMON_GPU_GPU_VERIFIER_H_

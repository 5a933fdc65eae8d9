// The plain records the GPU-initiated read path shares between the host and its kernel: the
// plan's reads and pieces, per-I/O results and the ring state kept between launches. No library
// includes: nvcc compiles this for the kernel (gpu_read_kernel.h) and the host code uses it as is.
#ifndef TUTTI_BENCH_NVME_GPU_PLAN_TYPES_H_
#define TUTTI_BENCH_NVME_GPU_PLAN_TYPES_H_

#include <stdint.h>

namespace tutti::io::nvme::gpu {

// Bounce slots (= CIDs) a launch may use at most: its bookkeeping lives in shared memory.
inline constexpr uint32_t kMaxGpuSlots = 2048;

// One read of the plan: `blocks` LBAs from `slba`, delivered to pieces[first_piece ..
// first_piece + num_pieces) of the plan's piece array. `layer` indexes the ready words.
struct GpuReadIo {
  uint64_t slba = 0;
  uint32_t blocks = 0;
  uint32_t layer = 0;
  uint32_t first_piece = 0;
  uint32_t num_pieces = 0;
};

// `len` bytes from byte `src_offset` of the I/O's data to byte `dst_offset` of the engine memory.
// All three are multiples of 16 (the scatter moves 16-byte words).
struct GpuPiece {
  uint32_t src_offset = 0;
  uint32_t len = 0;
  uint64_t dst_offset = 0;
};

enum GpuIoState : uint32_t {
  kGpuIoPending = 0,       // not reached (the launch did not run)
  kGpuIoDone = 1,          // landed and scattered
  kGpuIoFailed = 2,        // the controller returned `status`
  kGpuIoTimedOut = 3,      // submitted as `cid`, no completion before the deadline
  kGpuIoNotSubmitted = 4,  // the kernel gave up before submitting it
  kGpuIoBadRequest = 5,    // cannot be encoded (too long for a slot or a command)
};

// Per I/O, in host-mapped memory: the host reads it after the launch.
struct GpuIoResult {
  uint32_t state = kGpuIoPending;
  uint16_t status = 0;  // NVMe status (SCT << 8 | SC) for kGpuIoFailed
  uint16_t cid = 0;     // the command's CID (its bounce slot) once submitted
  uint32_t order = 0;   // when it was retired: 0 for the launch's first, 1 for the next, ...
};

// The ring indices between launches (host-mapped): the queue's owner moves between the kernel
// and the host's recovery code, never both at once.
struct GpuRingState {
  uint32_t sq_tail = 0;
  uint32_t sq_head = 0;
  uint32_t cq_head = 0;
  uint32_t cq_phase = 1;
};

// What one launch did (host-mapped).
struct GpuReadSummary {
  uint32_t done = 0, failed = 0, timed_out = 0, not_submitted = 0, bad = 0;
  uint32_t commands = 0;      // SQEs submitted
  uint32_t sq_doorbells = 0;  // SQ tail doorbell writes
  uint32_t cq_laps = 0;       // CQ wrap-arounds (phase flips)
  uint32_t layers_ready = 0;  // ready words written
  uint32_t gave_up = 0;       // 1: the deadline passed with commands in flight
};

}  // namespace tutti::io::nvme::gpu

#endif  // TUTTI_BENCH_NVME_GPU_PLAN_TYPES_H_

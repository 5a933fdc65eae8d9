// The GPU-initiated read kernel (gpu_read_kernel.h). Thread 0 owns the queue pair; the CTA
// scatters. Per round: thread 0 submits what it can and reaps what has landed; the CTA scatters
// the landed I/Os; thread 0 retires them (slots freed, results written, ready words).
#include "bench/nvme_gpu/gpu_read_kernel.h"

namespace tutti::io::nvme::gpu {
namespace {

constexpr uint32_t kNoIo = 0xffffffffu;
constexpr uint32_t kMaxLanded = 256;  // landed I/Os scattered per round

__device__ uint64_t NowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct Shared {
  uint16_t free_slots[kMaxGpuSlots];
  uint32_t slot_io[kMaxGpuSlots];  // the I/O in flight in each slot (CID), or kNoIo
  uint16_t landed[kMaxLanded];     // slots whose data landed this round
  uint32_t num_free;
  uint32_t num_landed;
  uint32_t stop;
};

// Thread 0's private state, kept in registers across rounds.
struct Owner {
  QueueRing ring;
  uint32_t next = 0;  // next I/O of the plan to submit
  uint32_t in_flight = 0;
  uint64_t last_progress_ns = 0;
  uint32_t retired = 0;  // I/Os finished so far, in any state
  GpuReadSummary sum;    // written to host memory once, at the end (each sysmem read is slow)
};

__device__ void LayerRetired(const GpuReadParams& p, Owner& o, uint32_t layer, bool failed) {
  if (failed) p.layer_failed[layer] = 1;
  if (--p.layer_remaining[layer] != 0 || p.layer_failed[layer] != 0) return;
  if (p.ready_words != nullptr) {
    __threadfence_system();  // the layer's scattered bytes before its word
    *static_cast<volatile uint32_t*>(&p.ready_words[layer]) = p.ticket;
  }
  ++o.sum.layers_ready;
}

__device__ void Finish(const GpuReadParams& p, Owner& o, uint32_t io, uint32_t state,
                       uint16_t status, uint16_t cid) {
  p.results[io] = GpuIoResult{state, status, cid, o.retired++};
  LayerRetired(p, o, p.ios[io].layer, state != kGpuIoDone);
}

// Pushes SQEs while the plan, the SQ and the bounce slots allow; one doorbell write.
__device__ void Submit(const GpuReadParams& p, Shared& s, Owner& o) {
  bool pushed = false;
  while (o.next < p.num_ios && s.num_free > 0 && SqFreeSlots(o.ring.sq) > 0) {
    const uint32_t io = o.next++;
    const GpuReadIo& r = p.ios[io];
    const uint16_t slot = s.free_slots[s.num_free - 1];
    Sqe e;
    bool fits = (static_cast<uint64_t>(r.blocks) << p.lba_shift) <= p.slot_bytes;
    if (!fits || !BuildReadWrite(kNvmRead, slot, p.nsid, r.slba, r.blocks, p.lba_shift, p.bounce,
                                 static_cast<uint64_t>(slot) * p.slot_bytes, &e)) {
      ++o.sum.bad;
      Finish(p, o, io, kGpuIoBadRequest, 0, 0);
      continue;
    }
    --s.num_free;
    s.slot_io[slot] = io;
    p.results[io].cid = slot;
    SqPush(&o.ring.sq, e);
    ++o.in_flight;
    ++o.sum.commands;
    pushed = true;
  }
  if (pushed) {
    RingSq(&o.ring.sq);
    ++o.sum.sq_doorbells;
  }
}

// Consumes new completions: failures retire at once, successes go to the landed list.
__device__ uint32_t Reap(const GpuReadParams& p, Shared& s, Owner& o) {
  uint32_t popped = 0;
  Cqe c;
  while (s.num_landed < kMaxLanded && CqPeek(o.ring.cq, &c)) {
    const uint32_t phase = o.ring.cq.phase;
    CqPop(&o.ring, c);
    if (o.ring.cq.phase != phase) ++o.sum.cq_laps;
    ++popped;
    const uint16_t cid = CqeCid(c.dw3);
    if (cid >= p.slots || s.slot_io[cid] == kNoIo) continue;  // stale: not ours in this launch
    --o.in_flight;
    const uint16_t status = CqeStatus(c.dw3);
    if (status == kStatusSuccess) {
      s.landed[s.num_landed++] = cid;
      continue;
    }
    const uint32_t io = s.slot_io[cid];
    s.slot_io[cid] = kNoIo;
    s.free_slots[s.num_free++] = cid;
    ++o.sum.failed;
    Finish(p, o, io, kGpuIoFailed, status, cid);
  }
  if (popped > 0) RingCq(&o.ring.cq);
  return popped;
}

// Every thread: copies the landed slots' pieces into the engine memory.
__device__ void Scatter(const GpuReadParams& p, const Shared& s) {
  for (uint32_t i = 0; i < s.num_landed; ++i) {
    const uint16_t slot = s.landed[i];
    const GpuReadIo& r = p.ios[s.slot_io[slot]];
    const uint8_t* src = p.bounce_data + static_cast<uint64_t>(slot) * p.slot_bytes;
    for (uint32_t k = 0; k < r.num_pieces; ++k) {
      const GpuPiece& piece = p.pieces[r.first_piece + k];
      const uint4* from = reinterpret_cast<const uint4*>(src + piece.src_offset);
      uint4* to = reinterpret_cast<uint4*>(p.engine + piece.dst_offset);
      // .cv loads: the slot's earlier contents may sit in L1; the controller rewrote them.
      for (uint32_t w = threadIdx.x; w < piece.len / 16; w += blockDim.x) to[w] = __ldcv(&from[w]);
    }
  }
}

// Thread 0 after the scatter: results, slots, ready words; and whether the launch is over.
__device__ void Retire(const GpuReadParams& p, Shared& s, Owner& o, uint32_t popped) {
  for (uint32_t i = 0; i < s.num_landed; ++i) {
    const uint16_t slot = s.landed[i];
    const uint32_t io = s.slot_io[slot];
    s.slot_io[slot] = kNoIo;
    s.free_slots[s.num_free++] = slot;
    ++o.sum.done;
    Finish(p, o, io, kGpuIoDone, 0, slot);
  }
  s.num_landed = 0;
  const uint64_t now = NowNs();
  if (popped > 0 || o.in_flight == 0) o.last_progress_ns = now;
  if (o.next == p.num_ios && o.in_flight == 0) {
    s.stop = 1;
  } else if (o.in_flight > 0 && now - o.last_progress_ns > p.timeout_ns) {
    for (uint32_t slot = 0; slot < p.slots; ++slot) {
      if (s.slot_io[slot] == kNoIo) continue;
      ++o.sum.timed_out;
      Finish(p, o, s.slot_io[slot], kGpuIoTimedOut, 0, slot);
    }
    for (; o.next < p.num_ios; ++o.next) {
      ++o.sum.not_submitted;
      Finish(p, o, o.next, kGpuIoNotSubmitted, 0, 0);
    }
    o.sum.gave_up = 1;
    s.stop = 1;
  } else if (popped == 0) {
    __nanosleep(200);  // nothing landed: poll the CQ less hard
  }
}

__global__ void GpuReadKernel(GpuReadParams p) {
  __shared__ Shared s;
  Owner o;
  if (threadIdx.x == 0) {
    o.ring.qid = p.qid;
    o.ring.sq = SubmissionRing{p.sq, p.sq_doorbell, p.depth, p.state->sq_tail, p.state->sq_head};
    o.ring.cq = CompletionRing{p.cq, p.cq_doorbell, p.depth, p.state->cq_head, p.state->cq_phase};
    for (uint32_t i = 0; i < p.slots; ++i) {
      s.free_slots[i] = static_cast<uint16_t>(p.slots - 1 - i);
      s.slot_io[i] = kNoIo;
    }
    s.num_free = p.slots;
    s.num_landed = 0;
    s.stop = p.num_ios == 0;
    o.last_progress_ns = NowNs();
  }
  __syncthreads();
  while (!s.stop) {
    uint32_t popped = 0;
    if (threadIdx.x == 0) {
      Submit(p, s, o);
      popped = Reap(p, s, o);
    }
    __syncthreads();
    Scatter(p, s);
    __syncthreads();
    if (threadIdx.x == 0) Retire(p, s, o, popped);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *p.state = GpuRingState{o.ring.sq.tail, o.ring.sq.head, o.ring.cq.head, o.ring.cq.phase};
    *p.summary = o.sum;
    __threadfence_system();
  }
}

}  // namespace

cudaError_t LaunchGpuRead(const GpuReadParams& params, cudaStream_t stream) {
  if (params.slots == 0 || params.slots > kMaxGpuSlots || params.slots >= params.depth ||
      params.threads == 0 || params.threads % 32 != 0 || params.threads > 1024) {
    return cudaErrorInvalidValue;
  }
  GpuReadKernel<<<1, params.threads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace tutti::io::nvme::gpu

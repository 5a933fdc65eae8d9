// The queue code shared by the CPU driver (queue_pair.h) and GPU-initiated submission
// (bench/nvme_gpu/gpu_queue.h, a prototype tuttid does not use yet): submission and completion ring
// bookkeeping, SQE encoding for reads, writes and flushes from a descriptor built at registration
// (descriptors.h), and consuming completions by their phase bit.
//
// Plain structs and TUTTI_HD functions: no std::, no allocation, no locks, no virtual calls, so the
// same code compiles for host and device (queue_cuda_check.cu proves it under nvcc).
//
// Ownership rule: ONE owner per queue pair. Exactly one thread (or one GPU thread/warp leader)
// may call the functions below on a given QueueRing at a time; nothing here is atomic beyond the
// doorbell stores and the phase-word loads that order memory with the controller. Owners hand work
// to each other by message, never by sharing a ring.
//
// Memory: `sq.entries` and `cq.entries` live in DMA memory the controller reads/writes; the
// doorbells point into BAR0 (or, for the model, at words it polls). The GPU must only write the
// doorbells, never read them.
#ifndef TUTTI_DAEMON_IO_NVME_QUEUE_H_
#define TUTTI_DAEMON_IO_NVME_QUEUE_H_

#include <stdint.h>

#include "daemon/io/nvme/spec.h"

namespace tutti::io::nvme {

struct SubmissionRing {
  Sqe* entries = nullptr;                 // depth entries, DMA memory
  volatile uint32_t* doorbell = nullptr;  // SQ tail doorbell
  uint32_t depth = 0;                     // entries; at most depth - 1 in flight
  uint32_t tail = 0;                      // next slot the host writes
  uint32_t head = 0;                      // controller's head, as last reported in a CQE
};

struct CompletionRing {
  Cqe* entries = nullptr;                 // depth entries, DMA memory, zeroed before creation
  volatile uint32_t* doorbell = nullptr;  // CQ head doorbell
  uint32_t depth = 0;
  uint32_t head = 0;   // next entry the host reads
  uint32_t phase = 1;  // phase value of new entries in this lap (starts at 1: memory is zeroed)
};

struct QueueRing {
  SubmissionRing sq;
  CompletionRing cq;
  uint16_t qid = 0;
};

// Memory ordering with the controller: entries are written with plain stores, then published by a
// release store to the doorbell; a completion is read by an acquire load of its DW3 (phase).
TUTTI_HD inline void PublishDoorbell(volatile uint32_t* doorbell, uint32_t value) {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  *doorbell = value;
#else
  __atomic_store_n(doorbell, value, __ATOMIC_RELEASE);
#endif
}

TUTTI_HD inline uint32_t LoadAcquire(const uint32_t* word) {
#if defined(__CUDA_ARCH__)
  uint32_t v = *static_cast<const volatile uint32_t*>(word);
  __threadfence_system();
  return v;
#else
  return __atomic_load_n(word, __ATOMIC_ACQUIRE);
#endif
}

// Resets both rings to their state right after queue creation (tail = head = 0, phase 1). The
// caller zeroes the CQ memory first.
TUTTI_HD inline void ResetRing(QueueRing* q) {
  q->sq.tail = 0;
  q->sq.head = 0;
  q->cq.head = 0;
  q->cq.phase = 1;
}

// Free SQ slots (one slot always stays empty: full is tail + 1 == head).
TUTTI_HD inline uint32_t SqFreeSlots(const SubmissionRing& sq) {
  return (sq.head + sq.depth - sq.tail - 1) % sq.depth;
}

// Copies `e` into the slot at the tail and advances the tail; returns false (nothing written)
// when the ring is full. Does not ring the doorbell: batch, then call RingSq once.
TUTTI_HD inline bool SqPush(SubmissionRing* sq, const Sqe& e) {
  if (SqFreeSlots(*sq) == 0) return false;
  sq->entries[sq->tail] = e;
  sq->tail = (sq->tail + 1 == sq->depth) ? 0 : sq->tail + 1;
  return true;
}

// Tells the controller about every entry pushed so far.
TUTTI_HD inline void RingSq(SubmissionRing* sq) { PublishDoorbell(sq->doorbell, sq->tail); }

// If the entry at the CQ head is new (its phase matches), copies it to `*out` and returns true.
// Does not consume it: call CqPop.
TUTTI_HD inline bool CqPeek(const CompletionRing& cq, Cqe* out) {
  const Cqe* slot = &cq.entries[cq.head];
  uint32_t dw3 = LoadAcquire(&slot->dw3);
  if (CqePhase(dw3) != cq.phase) return false;
  out->dw0 = slot->dw0;
  out->dw1 = slot->dw1;
  out->dw2 = slot->dw2;
  out->dw3 = dw3;
  return true;
}

// Consumes the entry at the head (after CqPeek returned true): advances the head, flips the
// expected phase on wrap-around, and records the controller's SQ head from the entry so that
// SqFreeSlots sees the slots the controller has fetched.
TUTTI_HD inline void CqPop(QueueRing* q, const Cqe& e) {
  q->sq.head = CqeSqHead(e) % q->sq.depth;
  if (++q->cq.head == q->cq.depth) {
    q->cq.head = 0;
    q->cq.phase ^= 1;
  }
}

// Tells the controller the CQ entries up to the head may be reused. Ring after a batch of pops.
TUTTI_HD inline void RingCq(CompletionRing* cq) { PublishDoorbell(cq->doorbell, cq->head); }

// ---- Descriptors -------------------------------------------------------------------------------
// What an I/O needs to address a registered DMA region, computed once at registration
// (descriptors.h builds it and owns the PRP list memory). Every field is a plain value, so a GPU
// can hold a copy; building a data pointer reads no memory.
//
// PRP mode uses "windowed" PRP lists: list page w holds the addresses of data pages
// w*window .. w*window + entries_per_page - 1, with no chain entries. Any transfer of at most
// max_prp_entries list entries whose first list entry is page p (p / window == w) lies wholly
// inside list page w, so PRP2 is a pointer into the middle of it. window = entries_per_page -
// max_prp_entries + 1.
struct RegionDescriptor {
  uint64_t iova = 0;  // the region's first byte as the controller sees it (IOVA-contiguous)
  uint64_t size = 0;  // bytes
  uint64_t prp_list_iova = 0;  // PRP mode: the first list page
  uint32_t page_shift = 12;    // controller memory page size (CC.MPS)
  uint32_t prp_window = 0;     // PRP mode: data pages per list page (see above)
  uint32_t max_transfer = 0;   // bytes one command may move
  uint32_t use_sgl = 0;        // 1: SGL data block descriptors; 0: PRPs
};

// Fills e->dptr (and the PSDT bits of e->cdw0) for `len` bytes at `offset` in the region. Returns
// false when the extent leaves the region, exceeds max_transfer, is empty, or is not
// dword-aligned; `e` is then unchanged.
TUTTI_HD inline bool BuildDataPointer(const RegionDescriptor& r, uint64_t offset, uint32_t len,
                                      Sqe* e) {
  if (len == 0 || len > r.max_transfer || offset > r.size || len > r.size - offset) return false;
  if ((offset & 3) != 0 || (len & 3) != 0) return false;
  uint64_t addr = r.iova + offset;
  if (r.use_sgl) {
    // SGL1 is one data block descriptor: address, length, identifier 0 (data block, address).
    e->dptr[0] = addr;
    e->dptr[1] = static_cast<uint64_t>(len) | (static_cast<uint64_t>(kSglDataBlock) << 56);
    e->cdw0 = (e->cdw0 & ~(3u << 14)) | kPsdtSgl;
    return true;
  }
  const uint64_t page = 1ull << r.page_shift;
  uint64_t first_page = offset >> r.page_shift;
  uint64_t last_page = (offset + len - 1) >> r.page_shift;
  e->dptr[0] = addr;
  if (last_page == first_page) {
    e->dptr[1] = 0;
  } else if (last_page == first_page + 1) {
    e->dptr[1] = r.iova + (first_page + 1) * page;
  } else {
    uint64_t entry = first_page + 1;  // the list holds every page; start at the second one
    uint64_t window = entry / r.prp_window;
    uint64_t slot = entry - window * r.prp_window;
    e->dptr[1] = r.prp_list_iova + window * page + slot * 8;
  }
  e->cdw0 = (e->cdw0 & ~(3u << 14)) | kPsdtPrp;
  return true;
}

// A Read or Write of `blocks` LBAs from `slba` on namespace `nsid`, data at `offset` in region `r`
// (blocks << lba_shift bytes). Returns false if the data pointer cannot be built (see above) or
// blocks is 0 or more than one command can carry.
TUTTI_HD inline bool BuildReadWrite(uint8_t opcode, uint16_t cid, uint32_t nsid, uint64_t slba,
                                    uint32_t blocks, uint32_t lba_shift, const RegionDescriptor& r,
                                    uint64_t offset, Sqe* e) {
  if (blocks == 0 || blocks > kMaxBlocksPerCommand) return false;
  uint64_t bytes = static_cast<uint64_t>(blocks) << lba_shift;
  if (bytes > 0xffffffffull) return false;
  Sqe s = {};
  s.cdw0 = Cdw0(opcode, cid, kPsdtPrp);
  s.nsid = nsid;
  s.cdw10 = static_cast<uint32_t>(slba);
  s.cdw11 = static_cast<uint32_t>(slba >> 32);
  s.cdw12 = blocks - 1;
  if (!BuildDataPointer(r, offset, static_cast<uint32_t>(bytes), &s)) return false;
  *e = s;
  return true;
}

TUTTI_HD inline Sqe BuildFlush(uint16_t cid, uint32_t nsid) {
  Sqe s = {};
  s.cdw0 = Cdw0(kNvmFlush, cid, kPsdtPrp);
  s.nsid = nsid;
  return s;
}

}  // namespace tutti::io::nvme

#endif  // TUTTI_DAEMON_IO_NVME_QUEUE_H_

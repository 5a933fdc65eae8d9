// Compile-only: instantiates queue.h's host/device functions in a kernel so that nvcc proves the
// shared queue code builds for the GPU. Never launched.
#include "daemon/io/nvme/queue.h"

namespace tutti::io::nvme {

__global__ void QueueCudaCheck(QueueRing* q, RegionDescriptor r, uint64_t lba, uint32_t* n) {
  Sqe e;
  if (BuildReadWrite(kNvmRead, 0, 1, lba, 8, 12, r, 0, &e) && SqPush(&q->sq, e)) RingSq(&q->sq);
  Cqe c;
  while (CqPeek(q->cq, &c)) {
    CqPop(q, c);
    ++*n;
  }
  RingCq(&q->cq);
}

}  // namespace tutti::io::nvme

// What one GPU check takes from the GPU verifier's queue (daemon/gpu/gpu_verifier.h): the queued
// jobs, their streams (Retrieves) in turn (datapath/fair_queue.h), while they fit the check's
// scratch and object caps. Where jobs of more than one stream are queued as the check is filled,
// the object cap is `shared_objects` (when set, and smaller): a small Retrieve beside a large one
// then waits for small checks, while a Retrieve alone keeps checks of `max_objects`
// (datapath.gpu_check_shared_objects, docs/gpu.md "Smaller checks only while Retrieves share").
//
// Contract: takes at least the first job when the queue is not empty and that job fits the
// uncapped limits (the verifier sends larger jobs to the CPU before queuing them), so a free
// check never goes out empty while jobs wait. Header only, no CUDA: tested on the host.
#ifndef TUTTI_DAEMON_GPU_CHECK_TAKE_H_
#define TUTTI_DAEMON_GPU_CHECK_TAKE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "daemon/datapath/fair_queue.h"

namespace tutti::gpu {

struct CheckCaps {
  uint64_t scratch_bytes = 0;   // device scratch a check holds
  uint32_t max_objects = 0;     // objects a check holds
  uint32_t shared_objects = 0;  // objects a check holds while several streams queue; 0: max_objects
};

// Job has `uint64_t scratch_bytes` and `uint32_t objects`.
template <typename Job>
std::vector<Job> TakeForCheck(datapath::FairQueue<Job>& queue, const CheckCaps& caps) {
  const uint32_t objects_cap = queue.streams() > 1 && caps.shared_objects != 0
                                   ? std::min(caps.shared_objects, caps.max_objects)
                                   : caps.max_objects;
  std::vector<Job> taken;
  uint64_t used = 0;
  uint32_t count = 0;
  while (!queue.empty()) {
    const Job& front = queue.Front();
    const uint32_t cap = taken.empty() ? caps.max_objects : objects_cap;
    if (used + front.scratch_bytes > caps.scratch_bytes || count + front.objects > cap) break;
    used += front.scratch_bytes;
    count += front.objects;
    taken.push_back(queue.Pop());
  }
  return taken;
}

}  // namespace tutti::gpu

#endif  // TUTTI_DAEMON_GPU_CHECK_TAKE_H_

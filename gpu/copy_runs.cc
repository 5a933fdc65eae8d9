#include "gpu/copy_runs.h"

#include <algorithm>

namespace tutti::gpu {
namespace {

uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace

void MergeCopyRuns(const CopyDesc* descs, size_t count, uint32_t object_len,
                   std::vector<CopyRun>* runs) {
  runs->clear();
  for (size_t i = 0; i < count; ++i)
    runs->push_back(CopyRun{descs[i].src, descs[i].dst, object_len});
  // Callers often give objects in source order already (a layer's objects of consecutive
  // blocks); sort only when they are not.
  auto by_src = [](const CopyRun& a, const CopyRun& b) { return Addr(a.src) < Addr(b.src); };
  if (!std::is_sorted(runs->begin(), runs->end(), by_src)) {
    std::stable_sort(runs->begin(), runs->end(), by_src);
  }
  size_t out = 0;
  for (size_t i = 0; i < runs->size(); ++i) {
    const CopyRun& next = (*runs)[i];
    if (out > 0) {
      CopyRun& last = (*runs)[out - 1];
      if (Addr(last.src) + last.bytes == Addr(next.src) &&
          Addr(last.dst) + last.bytes == Addr(next.dst)) {
        last.bytes += next.bytes;
        continue;
      }
    }
    (*runs)[out++] = next;
  }
  runs->resize(out);
}

}  // namespace tutti::gpu

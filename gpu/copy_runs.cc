#include "gpu/copy_runs.h"

#include <algorithm>
#include <tuple>

namespace tutti::gpu {
namespace {

uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// A descriptor on its way to a run, with its group.
struct Piece {
  uint32_t group;
  CopyRun run;
};

}  // namespace

void MergeCopyRuns(const CopyDesc* descs, const uint32_t* groups, size_t count, uint32_t object_len,
                   std::vector<CopyRun>* runs) {
  runs->clear();
  if (groups == nullptr) {
    for (size_t i = 0; i < count; ++i) runs->push_back({descs[i].src, descs[i].dst, object_len});
    return;
  }
  thread_local std::vector<Piece> pieces;  // keeps its capacity across calls
  pieces.clear();
  for (size_t i = 0; i < count; ++i) {
    pieces.push_back({groups[i], {descs[i].src, descs[i].dst, object_len}});
  }
  // Callers often give a group's objects in source order already (a layer's objects of
  // consecutive blocks); sort only when they are not.
  auto before = [](const Piece& a, const Piece& b) {
    return std::make_tuple(a.group, Addr(a.run.src)) < std::make_tuple(b.group, Addr(b.run.src));
  };
  if (!std::is_sorted(pieces.begin(), pieces.end(), before)) {
    std::sort(pieces.begin(), pieces.end(), before);
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const CopyRun& next = pieces[i].run;
    if (i > 0 && pieces[i - 1].group == pieces[i].group) {
      CopyRun& last = runs->back();
      if (Addr(last.src) + last.bytes == Addr(next.src) &&
          Addr(last.dst) + last.bytes == Addr(next.dst)) {
        last.bytes += next.bytes;
        continue;
      }
    }
    runs->push_back(next);
  }
}

}  // namespace tutti::gpu

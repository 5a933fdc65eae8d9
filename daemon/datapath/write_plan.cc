#include "daemon/datapath/write_plan.h"

#include <algorithm>
#include <tuple>

namespace tutti::datapath {
namespace {

bool Before(const WritePiece& a, const WritePiece& b) {
  return std::tie(a.file, a.offset) < std::tie(b.file, b.offset);
}

// Whether `p` continues `w` at its end, in the file and in memory, within the size bound.
bool Extends(const io::IoRequest& w, const WritePiece& p, uint32_t max_write_bytes) {
  return p.file == w.file && p.offset == w.offset + w.len &&
         p.buf == static_cast<const uint8_t*>(w.buf) + w.len &&
         uint64_t{w.len} + p.len <= max_write_bytes;
}

}  // namespace

WritePlan PlanWrites(std::vector<WritePiece> pieces, uint32_t max_write_bytes) {
  WritePlan plan;
  std::sort(pieces.begin(), pieces.end(), Before);
  plan.pieces = std::move(pieces);
  for (uint32_t i = 0; i < plan.pieces.size(); ++i) {
    const WritePiece& p = plan.pieces[i];
    if (!plan.writes.empty() && Extends(plan.writes.back(), p, max_write_bytes)) {
      plan.writes.back().len += p.len;
      ++plan.covers.back().num_pieces;
      continue;
    }
    plan.writes.push_back(
        io::IoRequest{io::Op::kWrite, p.file, p.offset, const_cast<uint8_t*>(p.buf), p.len, 0});
    plan.covers.push_back(PlannedWrite{i, 1});
  }
  return plan;
}

std::vector<bool> BlocksOfFailedWrites(const WritePlan& plan, uint32_t num_blocks,
                                       uint64_t* failed_writes) {
  std::vector<bool> failed(num_blocks, false);
  *failed_writes = 0;
  for (size_t w = 0; w < plan.writes.size(); ++w) {
    const io::IoRequest& r = plan.writes[w];
    if (r.result == static_cast<int64_t>(r.len)) continue;
    ++*failed_writes;
    const PlannedWrite& c = plan.covers[w];
    for (uint32_t i = c.first_piece; i < c.first_piece + c.num_pieces; ++i) {
      failed[plan.pieces[i].block] = true;
    }
  }
  return failed;
}

}  // namespace tutti::datapath

#include "daemon/datapath/write_transfer.h"

#include <algorithm>
#include <utility>

namespace tutti::datapath {
namespace {

bool Whole(const io::IoRequest& r) { return r.result == static_cast<int64_t>(r.len); }

}  // namespace

std::unique_ptr<WriteTransfer> WriteTransfer::Prepare(const pool::PoolLayout& layout,
                                                      absl::Span<const WriteBlock> blocks,
                                                      uint32_t max_write_bytes) {
  std::unique_ptr<WriteTransfer> t(new WriteTransfer);
  std::vector<WritePiece> pieces;
  for (const WriteBlock& b : blocks) {
    t->num_blocks_ = std::max(t->num_blocks_, b.block + 1);
    for (uint32_t j = 0; j < b.frames.size(); ++j) {
      const pool::Location loc = layout.ObjectLocation(b.slot, j);
      pieces.push_back(WritePiece{b.block, loc.file, loc.offset, b.frames[j], b.frame_bytes});
    }
    const pool::Location hl = layout.HeaderLocation(b.slot);
    pieces.push_back(WritePiece{b.block, hl.file, hl.offset, b.header,
                                static_cast<uint32_t>(pool::kSlotHeaderBytes)});
  }
  t->plan_ = PlanWrites(std::move(pieces), max_write_bytes);
  return t;
}

void WriteTransfer::Post(IoScheduler* scheduler, std::function<void()> done) {
  scheduler->Post(IoClass::kWrite, absl::MakeSpan(plan_.writes), std::move(done));
}

std::vector<uint32_t> WriteTransfer::FailedBlocks() const {
  uint64_t failed_writes = 0;
  const std::vector<bool> failed = BlocksOfFailedWrites(plan_, num_blocks_, &failed_writes);
  std::vector<uint32_t> blocks;
  for (uint32_t b = 0; b < failed.size(); ++b) {
    if (failed[b]) blocks.push_back(b);
  }
  return blocks;
}

std::vector<FailedWrite> WriteTransfer::FailedWrites() const {
  std::vector<FailedWrite> out;
  for (size_t w = 0; w < plan_.writes.size(); ++w) {
    if (Whole(plan_.writes[w])) continue;
    const PlannedWrite& c = plan_.covers[w];
    out.push_back(FailedWrite{plan_.writes[w], plan_.pieces[c.first_piece].block, c.num_pieces});
  }
  return out;
}

void WriteTransfer::MarkFilesWritten(std::vector<bool>* files) const {
  for (const io::IoRequest& r : plan_.writes) {
    if (Whole(r)) (*files)[r.file] = true;
  }
}

}  // namespace tutti::datapath

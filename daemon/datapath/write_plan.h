// Which writes put a Store batch into the pool (the planning step of write_transfer.h): the pieces
// of its blocks (objects and slot headers), merged into one write wherever they are adjacent both
// in the pool file and in memory.
//
// PlanWrites is a pure function: it sorts the pieces by (file, offset) and merges each piece into
// the write before it when that write ends exactly where the piece starts, in the file and in its
// buffer, and the merged write stays within max_write_bytes. Writes are never split: a piece
// larger than max_write_bytes is one write of its own. A write covers the pieces
// [first_piece, first_piece + num_pieces) of `pieces` (sorted), so a failed write names exactly
// the blocks it covered (BlocksOfFailedWrites).
//
// Where pieces are adjacent depends on the pool's layout and on where the caller put them in
// memory: object j of the slots of one extent group lie in adjacent frames of one file
// (daemon/pool/layout.h), and slot headers s and s + D are adjacent in file s % D.
//
// Thread-safety: stateless; safe from any thread.
#ifndef TUTTI_DAEMON_DATAPATH_WRITE_PLAN_H_
#define TUTTI_DAEMON_DATAPATH_WRITE_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "daemon/io/io_backend.h"

namespace tutti::datapath {

// One piece of one block to write: an object's frame or the slot header.
struct WritePiece {
  uint32_t block = 0;  // the caller's index of the block
  uint32_t file = 0;
  uint64_t offset = 0;           // in the file; 4 KiB aligned
  const uint8_t* buf = nullptr;  // 4 KiB aligned
  uint32_t len = 0;              // 4 KiB multiple
};

struct PlannedWrite {
  uint32_t first_piece = 0;  // into WritePlan::pieces
  uint32_t num_pieces = 0;
};

struct WritePlan {
  std::vector<WritePiece> pieces;     // sorted by (file, offset)
  std::vector<io::IoRequest> writes;  // kWrite requests, in the order of `pieces`
  std::vector<PlannedWrite> covers;   // per write: its pieces
};

// Plans `pieces`. Preconditions: no two pieces overlap in a file; max_write_bytes > 0.
WritePlan PlanWrites(std::vector<WritePiece> pieces, uint32_t max_write_bytes);

// After the writes ran (each `result` set): the blocks with a piece in a write that did not move
// all its bytes, as a flag per block index (`num_blocks` of them), and the number of such writes.
std::vector<bool> BlocksOfFailedWrites(const WritePlan& plan, uint32_t num_blocks,
                                       uint64_t* failed_writes);

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_WRITE_PLAN_H_

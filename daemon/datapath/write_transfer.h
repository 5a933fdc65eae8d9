// A Store batch as one transfer of the datapath, into the pool: prepare, post, check (the read
// side is retrieve_transfer.h).
//
// Prepare plans a batch's writes: each block's objects, from their frames in store staging to
// their places in its slot (daemon/pool/layout.h), and its slot header page, merged into one write
// wherever pieces lie adjacent both in a pool file and in memory (write_plan.h). Post hands the
// writes to the per-device scheduler as one write-class batch (scheduler.h: reads go first, the
// writes fill the time they leave). Check, once Post's `done` has run: the blocks a failed write
// covered, the failed writes themselves (for the caller's log), and the files that took a whole
// write (those the caller syncs).
//
// What stays the caller's (daemon/store/): slots, checksums and slot headers, the pool syncs, the
// journal, commit and publication. The transfer owns no block memory.
//
// Thread-safety: Prepare and Post on one thread; `done` runs on a scheduler or sink thread (or
// inside Post, for a batch with nothing to write); the Check calls read only, from any thread,
// after `done` has run. Lifetime: the transfer, every frame and every header page must stay valid
// and unchanged until `done` has run; the scheduler must outlive it too.
#ifndef TUTTI_DAEMON_DATAPATH_WRITE_TRANSFER_H_
#define TUTTI_DAEMON_DATAPATH_WRITE_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "daemon/datapath/scheduler.h"
#include "daemon/datapath/write_plan.h"
#include "daemon/io/io_backend.h"
#include "daemon/pool/layout.h"

namespace tutti::datapath {

// One block to write. Blocks adjacent in the pool share writes when they are adjacent in memory
// too: give header pages in the order of their places in the pool, and objects j of consecutive
// slots of one extent group in adjacent frames.
struct WriteBlock {
  uint32_t block = 0;  // the caller's index of the block, reported back by the Check calls
  uint64_t slot = 0;
  absl::Span<uint8_t* const> frames;  // object j's frame: frame_bytes, 4 KiB aligned
  uint32_t frame_bytes = 0;           // a 4 KiB multiple, <= the layout's object_bytes()
  const uint8_t* header = nullptr;    // the encoded slot header page (pool::kSlotHeaderBytes)
};

// A write that did not move all its bytes.
struct FailedWrite {
  io::IoRequest request;     // as completed: `result` is -errno or the short count
  uint32_t first_block = 0;  // the caller's index of the first block it covered
  uint32_t num_pieces = 0;   // objects and headers it covered
};

class WriteTransfer {
 public:
  // Plans the writes of `blocks`, none of them merged past `max_write_bytes` (no piece is split).
  // Preconditions: slots distinct and < layout.num_slots(); frames.size() <= layout.max_objects();
  // max_write_bytes > 0.
  static std::unique_ptr<WriteTransfer> Prepare(const pool::PoolLayout& layout,
                                                absl::Span<const WriteBlock> blocks,
                                                uint32_t max_write_bytes);

  // Posts every write through `scheduler`; `done` runs once, when each has its result.
  // Precondition: called once.
  void Post(IoScheduler* scheduler, std::function<void()> done);

  size_t num_writes() const { return plan_.writes.size(); }

  // --- Check: only after Post's `done` has run. ---
  // The caller's indices of the blocks with a piece in a failed write, ascending, each once.
  std::vector<uint32_t> FailedBlocks() const;
  std::vector<FailedWrite> FailedWrites() const;
  // Sets (*files)[f] for each file f that took a write moving all its bytes. Precondition:
  // files->size() covers every file of the layout.
  void MarkFilesWritten(std::vector<bool>* files) const;

 private:
  WriteTransfer() = default;

  WritePlan plan_;
  uint32_t num_blocks_ = 0;  // the largest caller's index + 1
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_WRITE_TRANSFER_H_

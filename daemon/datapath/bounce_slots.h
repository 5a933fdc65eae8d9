// Small host buffers a Retrieve's reads land in when its layers are staged in GPU memory
// (LayerReader with device staging): each pool file (device) has `depth` slots of `slot_bytes`,
// a batch of that file's reads takes one, and the slot comes back once the batch's objects have
// been copied to the GPU and checked there. So host staging is a few MiB per device that stay in
// the CPU's cache, whatever the size of a layer, instead of whole layers that do not.
//
// Acquire never blocks: a batch that finds its file's slots taken waits in that file's queue and
// is started by the Release that frees a slot (on the releasing thread). Files do not wait on each
// other. Waiting batches are served by stream (one Retrieve's batches) in turn (fair_queue.h), in
// the order asked within a stream: a Retrieve that starts while another has a layer's batches
// waiting gets every other slot freed, instead of waiting for all of them.
//
// Thread-safety: thread-safe. Lifetime: the region must outlive the slots, and every slot must be
// released (every started batch finished) before they are destroyed.
#ifndef TUTTI_DAEMON_DATAPATH_BOUNCE_SLOTS_H_
#define TUTTI_DAEMON_DATAPATH_BOUNCE_SLOTS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/align.h"
#include "daemon/datapath/fair_queue.h"

namespace tutti::datapath {

class BounceSlots {
 public:
  // Runs a batch with its slot (slot_bytes() bytes, 4 KiB aligned).
  using Start = std::function<void(uint8_t* slot)>;

  // Carves files x depth slots of slot_bytes (a multiple of 4096) out of `region` (4 KiB
  // aligned). INVALID_ARGUMENT if a count is 0 or the region is too small (the message gives the
  // bytes needed).
  static absl::StatusOr<std::unique_ptr<BounceSlots>> Create(absl::Span<uint8_t> region,
                                                            uint32_t files, uint32_t depth,
                                                            uint32_t slot_bytes);
  // The slot a batch of one file's reads needs: a batch is up to `read_post_bytes` of reads
  // (datapath.read_post_bytes) and at least one read of up to `max_read_bytes`, so the larger,
  // rounded up to 4 KiB. Precondition: both < 2^32 - 4096.
  static uint32_t SlotBytesFor(uint64_t read_post_bytes, uint64_t max_read_bytes) {
    return static_cast<uint32_t>(RoundUp4K(std::max(read_post_bytes, max_read_bytes)));
  }
  // The region's bytes Create needs.
  static uint64_t BytesFor(uint32_t files, uint32_t depth, uint32_t slot_bytes) {
    return uint64_t{files} * depth * slot_bytes;
  }

  uint32_t slot_bytes() const { return slot_bytes_; }
  uint32_t files() const { return num_files_; }

  // Runs `start` with a free slot of `file` (< files()): inside this call if one is free (and no
  // batch of `file` waits), else from the Release that frees one, when `stream`'s turn comes
  // and after the batches of `stream` for `file` asked before it.
  void Acquire(uint32_t file, uint64_t stream, Start start);
  // Gives `slot` (from Acquire of `file`) back; starts the next waiting batch of `file` with it.
  void Release(uint32_t file, uint8_t* slot);

  // Slots of every file held now, and the most held at once since creation.
  uint32_t held() const;
  uint32_t most_held() const;

 private:
  struct File {
    std::vector<uint8_t*> free;
    FairQueue<Start> waiting;
  };
  BounceSlots(absl::Span<uint8_t> region, uint32_t files, uint32_t depth, uint32_t slot_bytes);

  const uint32_t slot_bytes_;
  const uint32_t num_files_;
  mutable absl::Mutex mu_;
  std::vector<File> files_ ABSL_GUARDED_BY(mu_);
  uint32_t held_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t most_held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_BOUNCE_SLOTS_H_

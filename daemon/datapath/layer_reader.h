// The read side of the data path: a Retrieve's layers, planned, posted, checked and released.
//
// LayerReader::Read walks layers [layer_begin, layer_end) with a window of up to `window_layers`
// layers in flight, one staging lease per layer of the window (the first lease waits for staging,
// the others are taken only if free now). For each layer it plans the pool reads (read_plan.h:
// adjacent objects merged up to max_read_bytes) and posts them through `post` in small batches of
// one device each (at most `post_bytes`), so every device works on the layer at once and the checks
// start as soon as the first reads land. Each Read posts as a stream of its own: Reads at once take
// turns for the bounce slots, the devices' queues and the checks. Each batch's objects go to the
// Verifier (verifier.h) as it completes (the calling thread never hashes): an object fails on an
// I/O error, a short read (a merged read that came back short serves the objects it covered fully
// and fails the others), or a checksum mismatch. Once a layer's reads and checks are all done, the
// calling thread calls the sink once with the layer's objects of every item not failed so far, as
// engine copies (engine::CopyOp: into the item's engine block, from its DRAM copy for DRAM-tier
// items, else from the lease), and the items that failed in this layer; a failed item is reported
// once and never served again. Meanwhile the layers after it are being read and checked.
//
// Release: every lease goes back, and every posted read and its check have completed, before Read
// returns, on every path (sink error included).
//
// Layers staged in GPU memory (a reader made with bounce slots, bounce_slots.h): the leases are
// then GPU memory, and a batch's reads land in one of its device's small host bounce slots, taken
// when the batch is posted (it waits in its device's queue while they are all taken) and given
// back once the verifier has copied each object to its place in the layer's lease
// (ObjectCheck::place, Verifier::VerifyReleasing), where it is then checked. The copies' sources
// are then GPU memory (CopyOp::staging and device_copy both the placed bytes). An object the
// verifier did not place (its batch was checked on the CPU after a CUDA error), or could not check
// after the slot went back (kNotChecked), fails its item with kNotPlaced: the block is served as a
// miss and stays in the pool. Needs a verifier that places (daemon/gpu/gpu_verifier.h).
//
// Who uses it: a Retrieve's reads are one step of the datapath's retrieve transfer
// (retrieve_transfer.h: the store prepares the sources, this reader reads them, the store
// finishes); the block store's Scrub reads through it too. In tuttid the block store builds and
// owns the one reader, over its retrieve staging, its read verifier and a `post` into its
// per-device scheduler (BlockStore::reader()); the reader owns none of the three.
//
// Thread-safety: Read may run on many threads at once; `post` must then be callable concurrently.
// Lifetime: the staging pool, the verifier and whatever `post` reaches must outlive the reader.
#ifndef TUTTI_DAEMON_DATAPATH_LAYER_READER_H_
#define TUTTI_DAEMON_DATAPATH_LAYER_READER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "daemon/datapath/bounce_slots.h"
#include "daemon/datapath/counters.h"
#include "daemon/datapath/read_plan.h"
#include "daemon/datapath/staging_lease.h"
#include "daemon/datapath/verifier.h"
#include "daemon/engine/copy_op.h"
#include "daemon/io/io_backend.h"
#include "daemon/pool/layout.h"

namespace tutti::datapath {

// One block of a read.
struct ReadSource {
  enum class From : uint8_t {
    kSsd,     // read from `slot` and verified against `checksums`
    kDram,    // served from `dram`
    kFailed,  // failed before the read (the caller knows why): reported in the first layer
  };
  From from = From::kSsd;
  uint64_t slot = 0;
  // The checksum seed with the read's namespace, and one checksum per object of the block
  // (caller-owned, valid for the whole Read).
  Key key;
  uint64_t epoch = 0;
  absl::Span<const uint64_t> checksums;
  // kDram: the block's objects back to back, object_len bytes each; valid for the whole Read and
  // only read (engine::CopyOp::staging of a scatter).
  uint8_t* dram = nullptr;
};

// kNotPlaced: read and checked, but not placed in the GPU-memory staging (see the header's note):
// the block is fine, this read of it is not.
enum class ReadFailure : uint8_t {
  kNone,
  kIoError,
  kShortRead,
  kChecksum,
  kBeforeRead,
  kNotPlaced,
};

struct LayerReadRequest {
  NamespaceId ns = 0;
  absl::Span<const ReadSource> items;
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;
  uint32_t parts = 0;
  uint32_t object_len = 0;
  // Per item, the engine block its objects land in (CopyOp::block); empty: the item's index.
  absl::Span<const uint32_t> engine_blocks;
};

// One checked layer, as the sink gets it; every span is valid only during the call.
struct LayerObjects {
  uint32_t layer = 0;
  // The layer's objects of every item not failed so far, as copies into the engine.
  absl::Span<const engine::CopyOp> copies;
  absl::Span<const uint32_t> failed_items;  // items failing in this layer (request indexes)
  // The copies' sources stay valid until the sink's next call returns (or Read returns, whichever
  // comes first), not only during this call: the sink may leave its copy in flight until then,
  // and must have finished it before returning an error. True for a layer served wholly from the
  // DRAM tier, and for every layer while staging holds three layers or more (or one per layer of
  // the read).
  bool stays = false;
};

struct LayerReadResult {
  // OK, the sink's error (the read stopped there), or RESOURCE_EXHAUSTED (nothing read) when one
  // layer needs more staging than the pool holds.
  absl::Status status;
  // Per item: why it failed (kBeforeRead for kFailed sources), or kNone if it was served every
  // layer the read reached.
  std::vector<ReadFailure> failures;
  uint32_t layers_done = 0;  // sink calls made
  // From the first read posted (staging taken) to the last sink call's return.
  double seconds = 0;
};

struct LayerReaderOptions {
  pool::PoolLayout layout;
  uint32_t max_read_bytes = 1u << 20;  // a multiple of 4096, >= 4096
  uint32_t window_layers = 8;          // >= 1; staging may allow fewer
  // Reads of one device are posted in batches of at most this many bytes (at least one read), so
  // checks follow the reads as they land: by default each merged read is its own batch.
  uint32_t post_bytes = 1u << 20;
};

class LayerReader {
 public:
  // Starts `batch` (its span and buffers valid until `done` runs) and returns; runs `done` once
  // every request's result is set. `stream` is the same for every batch of one Read and differs
  // between Reads, so that Reads at once can take turns. The block store passes its I/O
  // scheduler's Post (read class), which does (scheduler.h).
  using PostFn = std::function<void(uint64_t stream, absl::Span<io::IoRequest> batch,
                                    std::function<void()> done)>;
  // Called once per layer, in order (LayerObjects says how long its sources stay valid). An error
  // stops the read and is returned.
  using Sink = std::function<absl::Status(const LayerObjects& layer)>;

  // `bounce`: null for layers staged in `staging` as read (host memory); else the layers are
  // staged in `staging` as placed by the verifier (GPU memory) and the reads land in `bounce`,
  // whose slot_bytes() must be at least options.max_read_bytes and whose files() the layout's.
  LayerReader(const LayerReaderOptions& options, StagingPool* staging, Verifier* verifier,
              PostFn post, BounceSlots* bounce = nullptr);

  // Preconditions: request.items' slots and layers lie within the layout; layer_begin <
  // layer_end; RoundUp4K(object_len) <= layout.object_bytes().
  LayerReadResult Read(const LayerReadRequest& request, const Sink& sink);

  ReadCountersSnapshot counters() const { return counters_.Snapshot(); }

 private:
  struct InFlight;
  struct Window;
  // Read without the call's count and time.
  LayerReadResult ReadLayers(const LayerReadRequest& request, const Sink& sink);
  // Takes the window's leases: the first one waits, the others only if free now.
  absl::Status TakeWindow(uint64_t layer_bytes, uint32_t layers, Window* window);
  void Post(const LayerReadRequest& r, uint32_t layer, absl::Span<const ReadFailure> failures,
            const StagingLease& lease, InFlight* in);
  // Posts batch `batch` of `in` (its reads [begin, end)), into `slot` (a bounce slot) if not
  // null, else where they are (their staging).
  void PostBatch(const LayerReadRequest& r, InFlight* in, uint32_t batch, uint32_t begin,
                 uint32_t end, uint8_t* slot);
  // Runs on the thread completing batch `batch` (reads [begin, end) of `in`): records each
  // object's read outcome and hands the objects to the verifier, whose answer finishes the batch
  // (and gives `slot` back).
  void OnReadsDone(const LayerReadRequest& r, InFlight* in, uint32_t batch, uint32_t begin,
                   uint32_t end, uint8_t* slot);
  // kIoError or kShortRead if the read carrying `o` did not deliver it whole, else kNone.
  static ReadFailure ReadOutcome(const InFlight& in, const PlannedObject& o);
  // Collects one checked layer: appends its copies to `ops` and the items failing in it to
  // `failed`, recording why in `failures`; sets `*from_staging` if a copy reads the lease.
  void Collect(const LayerReadRequest& r, uint32_t layer, const InFlight& in,
               const StagingLease& lease, std::vector<ReadFailure>* failures,
               std::vector<engine::CopyOp>* ops, std::vector<uint32_t>* failed,
               bool* from_staging) const;

  const LayerReaderOptions options_;
  StagingPool* const staging_;
  Verifier* const verifier_;
  const PostFn post_;
  std::atomic<uint64_t> next_stream_{1};  // the stream of the next Read
  BounceSlots* const bounce_;
  ReadCounters counters_;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_LAYER_READER_H_

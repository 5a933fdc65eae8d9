// A Retrieve as one transfer of the datapath, in the four steps of every transfer:
//
//   Prepare  the store side (RetrieveStore::PrepareRead) validates the request, checks that its
//            blocks are pinned and gathers their sources (slots, checksums, DRAM copies) into a
//            PreparedRead;
//   Post     the LayerReader (layer_reader.h) plans every layer's reads and posts them through the
//            per-device scheduler;
//   Check    the reader's Verifier checks each object; each checked layer goes to the EngineSink
//            (the handoff below), and its progress to the caller once the engine holds it;
//   Release  the reader's staging is back and its reads done when LayerReader::Read returns; then
//            PreparedRead::Finish accounts the result in the store (failed blocks leave the
//            index, stats, read bandwidth). Finish runs after every prepare that succeeded,
//            whatever stopped the read: an engine error, a progress failure, the reader's own.
//
// Who owns what: the store (BlockStore in tuttid) owns the LayerReader and the retrieve staging it
// leases (BlockStore::reader()); the transfer borrows both for one call. The PreparedRead is the
// transfer's from PrepareRead until Finish returns. The leases that pin the blocks are the
// caller's (the server's ClaimedLease) and must be held for the whole call. The transfer owns no
// block memory.
//
// The handoff (HandOver), per layer, in order: the layer's copies (the reader's engine::CopyOps,
// into the engine blocks the request named) are enqueued (EngineSink::EnqueueLayer) when the engine
// can overlap, it is not the last layer of the range, and their sources stay valid until the next
// layer's call returns (LayerObjects::stays: the DRAM tier, or staging the reader does not reuse
// before then); otherwise they are copied (EngineSink::CopyLayer). An enqueued layer's progress is
// held back and emitted only after the next layer's engine call has returned (it has landed then),
// before that layer's own progress; so progress is emitted in layer order and only for layers
// that landed.
//
// Stopping: an engine error, or `progress` returning false (CANCELLED "the client went away"),
// stops the read and is returned. Whenever the handoff stops with a layer possibly in flight (an
// engine error or a progress failure), the engine is drained within that sink call, before the
// reader's sources go back; a read that ends early without the sink's error is drained once it
// returns. A held progress is then dropped, never emitted (the call fails: the client counts
// every block failed).
//
// Thread-safety: every function here runs on the calling thread; `engine`, `progress`, the sink
// and the store's PrepareRead and Finish are called from it only. Many transfers may run at once
// on one store and reader. Lifetime: everything passed must outlive the call.
#ifndef TUTTI_DAEMON_DATAPATH_RETRIEVE_TRANSFER_H_
#define TUTTI_DAEMON_DATAPATH_RETRIEVE_TRANSFER_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/types.h"
#include "daemon/datapath/engine_sink.h"
#include "daemon/datapath/layer_reader.h"

namespace tutti::datapath {

// What a Retrieve reads: layers [layer_begin, layer_end) of blocks `keys` of namespace `ns`, into
// engine block engine_blocks[i] for key i (block i when `engine_blocks` is empty). The spans are
// the caller's and must outlive the transfer.
struct RetrieveRequest {
  NamespaceId ns = 0;
  absl::Span<const Key> keys;
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;
  absl::Span<const uint32_t> engine_blocks;
};

// One Retrieve's read as the store side prepared it: the reader's request, and the store's part
// of the release. Made by RetrieveStore::PrepareRead; the transfer owns it until Finish returns.
class PreparedRead {
 public:
  virtual ~PreparedRead() = default;
  // The read to make. It and every span in it stay valid for this object's life (they point into
  // it, and into the RetrieveRequest's spans).
  virtual const LayerReadRequest& request() const = 0;
  // Accounts the read's `result` in the store (a result with layers_done == 0, a read refused
  // before any layer, has nothing to account). Called once, after LayerReader::Read returned, on
  // every path.
  virtual void Finish(const LayerReadResult& result) = 0;
};

// The store side of a Retrieve (BlockStore in tuttid; fakes in tests), so that the transfer knows
// no store.
class RetrieveStore {
 public:
  virtual ~RetrieveStore() = default;
  // Validates `request`, checks that its keys are pinned and gathers their sources. On error
  // nothing is held and nothing is to be finished. Thread-safe. The result must not outlive the
  // store.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<PreparedRead>> PrepareRead(
      const RetrieveRequest& request) = 0;
};

// Prepare, read, release, with `sink` as the read's sink: no engine handoff. Returns the
// prepare's error (nothing read, Finish not called), or the read's status (the sink's error if it
// stopped the read; RESOURCE_EXHAUSTED, nothing read, if one layer needs more staging than the
// reader's pool holds). Finish has run when it returns, the reader's staging is back and its reads
// are done. BlockStore::Read is this; RunRetrieve is this with the handoff as the sink.
[[nodiscard]] absl::Status ReadPrepared(const RetrieveRequest& request, RetrieveStore* store,
                                        LayerReader* reader, const LayerReader::Sink& sink);

// Emits layer `layer`'s progress with the items that failed in it; false when the client is gone.
using ProgressFn = std::function<bool(uint32_t layer, absl::Span<const uint32_t> failed_items)>;

struct RetrieveOutcome {
  // OK, the engine's error, CANCELLED when progress could not be emitted, the prepare's error, or
  // the read's error.
  absl::Status status;
  // The first layer not handed to the engine: layers [next_layer, layer_end) were neither copied
  // nor marked ready (their ready words are the caller's to write). layer_begin when the prepare
  // failed.
  uint32_t next_layer = 0;
};

// The whole transfer: ReadPrepared with the engine handoff as the sink. Returns once Finish has
// run (where the prepare succeeded), the read's staging is back, its reads done, and nothing
// enqueued is still in flight. Preconditions: none on `request` (the store's PrepareRead checks
// it); `store`, `reader` and `engine` non-null.
RetrieveOutcome RunRetrieve(const RetrieveRequest& request, RetrieveStore* store,
                            LayerReader* reader, EngineSink* engine, const ProgressFn& progress);

// --- The handoff step alone, over any layer-wise read (RunRetrieve's, and tests'). ---

struct RetrieveTarget {
  // The read's layer range; the last layer always lands before its progress is emitted.
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;
};

// Runs a layer-wise read: calls `sink` once per layer, in order, and returns the read's status
// (the sink's error if it stopped the read).
using LayerSource = std::function<absl::Status(const LayerReader::Sink& sink)>;

// Hands each layer `source` reads to `engine` and emits its progress, as described at the top.
// Returns once `source` has returned and nothing enqueued is still in flight.
// Preconditions: target.layer_begin < target.layer_end; the source reads that range.
RetrieveOutcome HandOver(const RetrieveTarget& target, EngineSink* engine,
                         const ProgressFn& progress, const LayerSource& source);

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_RETRIEVE_TRANSFER_H_

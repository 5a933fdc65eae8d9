// A Retrieve as one transfer of the datapath: the layer-wise read (LayerReader, reached through
// the block store, which pins the sources) hands each verified layer to an EngineSink, and each
// layer's progress goes to the caller once the engine holds it.
//
// Per layer, in order: the layer's copies (the reader's engine::CopyOps, into the engine blocks
// the read request named) are enqueued (EngineSink::EnqueueLayer) when the engine can overlap, it
// is not the last layer of the range, and their sources stay valid until the next layer's call
// returns (LayerObjects::stays: the DRAM tier, or staging the reader does not reuse before then);
// otherwise they are copied (EngineSink::CopyLayer). An enqueued layer's progress is held back and
// emitted only after the next layer's engine call has returned (it has landed then), before that
// layer's own progress; so progress is emitted in layer order and only for layers that landed.
//
// Stopping: an engine error, or `progress` returning false (CANCELLED "the client went away"),
// stops the read and is returned. Whenever the handoff stops with a layer possibly in flight (an
// engine error or a progress failure), the engine is drained within that sink call, before the
// reader's sources go back; a read that ends early without the sink's error is drained once it
// returns. A held progress is then dropped, never emitted (the call fails: the client counts
// every block failed).
//
// Release: RunRetrieve returns once the read has returned (its staging back, its reads done) and
// nothing enqueued is still in flight.
//
// Thread-safety: RunRetrieve runs on the calling thread; `engine` and `progress` are called from
// it only (the reader's sink runs there). Lifetime: everything passed must outlive the call.
#ifndef TUTTI_DAEMON_DATAPATH_RETRIEVE_TRANSFER_H_
#define TUTTI_DAEMON_DATAPATH_RETRIEVE_TRANSFER_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/datapath/engine_sink.h"
#include "daemon/datapath/layer_reader.h"

namespace tutti::datapath {

struct RetrieveTarget {
  // The read's layer range; the last layer always lands before its progress is emitted.
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;
};

// Emits layer `layer`'s progress with the items that failed in it; false when the client is gone.
using ProgressFn = std::function<bool(uint32_t layer, absl::Span<const uint32_t> failed_items)>;
// Runs the layer-wise read: calls `sink` once per layer, in order, and returns the read's status
// (the sink's error if it stopped the read). BlockStore::Read is one.
using LayerSource = std::function<absl::Status(const LayerReader::Sink& sink)>;

struct RetrieveOutcome {
  // OK, the engine's error, CANCELLED when progress could not be emitted, or the read's error.
  absl::Status status;
  // The first layer not handed to the engine: layers [next_layer, layer_end) were neither copied
  // nor marked ready (their ready words are the caller's to write).
  uint32_t next_layer = 0;
};

// Preconditions: target.layer_begin < target.layer_end; the source reads that range.
RetrieveOutcome RunRetrieve(const RetrieveTarget& target, EngineSink* engine,
                            const ProgressFn& progress, const LayerSource& source);

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_RETRIEVE_TRANSFER_H_

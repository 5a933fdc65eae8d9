#include "daemon/datapath/retrieve_transfer.h"

#include <utility>
#include <vector>

namespace tutti::datapath {
namespace {

// The layer loop's engine handoff: one per HandOver, called by the reader's sink.
class Handoff {
 public:
  Handoff(const RetrieveTarget& target, EngineSink* engine, const ProgressFn& progress)
      : target_(target), engine_(engine), progress_(progress), next_(target.layer_begin) {}

  // The reader's sink: hands one layer over; on error, nothing of the transfer is left in flight.
  absl::Status Layer(const LayerObjects& layer) {
    absl::Status s = Hand(layer);
    if (!s.ok()) Stop();
    return s;
  }

  // Ends the handoff on error or once the read returned: a layer still in flight is drained and
  // its held progress dropped.
  void Stop() {
    if (in_flight_) (void)engine_->Drain();
    in_flight_ = false;
    held_ = false;
  }

  uint32_t next() const { return next_; }

 private:
  absl::Status Hand(const LayerObjects& in) {
    const uint32_t layer = in.layer;
    const absl::Span<const uint32_t> failed = in.failed_items;
    const bool overlap = engine_->can_overlap() && layer + 1 < target_.layer_end && in.stays;
    absl::Status s =
        overlap ? engine_->EnqueueLayer(layer, in.copies) : engine_->CopyLayer(layer, in.copies);
    if (!s.ok()) return s;  // the layer before may still be in flight: Stop drains it
    in_flight_ = overlap;
    next_ = layer + 1;
    // Every layer before this one has landed.
    if (std::exchange(held_, false) && !progress_(held_layer_, held_failed_)) return ClientGone();
    if (overlap) {
      held_ = true;
      held_layer_ = layer;
      held_failed_.assign(failed.begin(), failed.end());
    } else if (!progress_(layer, failed)) {
      return ClientGone();
    }
    return absl::OkStatus();
  }

  static absl::Status ClientGone() { return absl::CancelledError("the client went away"); }

  const RetrieveTarget& target_;
  EngineSink* const engine_;
  const ProgressFn& progress_;
  uint32_t next_;
  // The last layer handed over was enqueued and may not have landed.
  bool in_flight_ = false;
  // The enqueued layer's progress, emitted once it has landed.
  bool held_ = false;
  uint32_t held_layer_ = 0;
  std::vector<uint32_t> held_failed_;
};

}  // namespace

RetrieveOutcome HandOver(const RetrieveTarget& target, EngineSink* engine,
                         const ProgressFn& progress, const LayerSource& source) {
  Handoff handoff(target, engine, progress);
  RetrieveOutcome out;
  out.status = source([&handoff](const LayerObjects& layer) { return handoff.Layer(layer); });
  handoff.Stop();
  out.next_layer = handoff.next();
  return out;
}

absl::Status ReadPrepared(const RetrieveRequest& request, RetrieveStore* store, LayerReader* reader,
                          const LayerReader::Sink& sink) {
  absl::StatusOr<std::unique_ptr<PreparedRead>> prepared = store->PrepareRead(request);
  if (!prepared.ok()) return prepared.status();
  // Read returns with its staging back and its reads done, on every path (sink error included).
  const LayerReadResult result = reader->Read((*prepared)->request(), sink);
  (*prepared)->Finish(result);
  return result.status;
}

RetrieveOutcome RunRetrieve(const RetrieveRequest& request, RetrieveStore* store,
                            LayerReader* reader, EngineSink* engine, const ProgressFn& progress) {
  return HandOver(
      RetrieveTarget{request.layer_begin, request.layer_end}, engine, progress,
      [&](const LayerReader::Sink& sink) { return ReadPrepared(request, store, reader, sink); });
}

}  // namespace tutti::datapath

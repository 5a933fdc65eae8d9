#include "daemon/datapath/retrieve_transfer.h"

#include <optional>
#include <utility>
#include <vector>

namespace tutti::datapath {
namespace {

// The layer loop's engine handoff: one per RunRetrieve, called by the reader's sink.
class Handoff {
 public:
  Handoff(const RetrieveTarget& target, EngineSink* engine, const ProgressFn& progress)
      : target_(target), engine_(engine), progress_(progress), next_(target.layer_begin) {}

  // The reader's sink: hands one layer over; on error, nothing of the transfer is left in flight.
  absl::Status Layer(uint32_t layer, absl::Span<const ScatterOp> objects,
                     absl::Span<const uint32_t> failed) {
    absl::Status s = Hand(layer, objects, failed);
    if (!s.ok()) Stop();
    return s;
  }

  // Ends the handoff on error or once the read returned: a layer still in flight is drained and
  // its held progress dropped.
  void Stop() {
    if (in_flight_) (void)engine_->Drain();
    in_flight_ = false;
    held_.reset();
  }

  uint32_t next() const { return next_; }

 private:
  struct Held {
    uint32_t layer = 0;
    std::vector<uint32_t> failed;
  };

  static bool Stays(absl::Span<const ScatterOp> objects) {
    for (const ScatterOp& op : objects) {
      if (!op.stays) return false;
    }
    return true;
  }

  absl::Status Hand(uint32_t layer, absl::Span<const ScatterOp> objects,
                    absl::Span<const uint32_t> failed) {
    ops_.clear();
    for (const ScatterOp& op : objects) {
      // CopyOp serves both directions; a scatter only reads `staging`.
      ops_.push_back(
          {target_.engine_blocks[op.item], op.object, const_cast<uint8_t*>(op.src)});
    }
    const bool overlap =
        engine_->can_overlap() && layer + 1 < target_.layer_end && Stays(objects);
    absl::Status s = overlap ? engine_->EnqueueLayer(layer, ops_) : engine_->CopyLayer(layer, ops_);
    if (!s.ok()) return s;  // the layer before may still be in flight: Stop drains it
    in_flight_ = overlap;
    next_ = layer + 1;
    // Every layer before this one has landed.
    if (held_.has_value()) {
      const Held held = *std::exchange(held_, std::nullopt);
      if (!progress_(held.layer, held.failed)) return ClientGone();
    }
    if (overlap) {
      held_ = Held{layer, std::vector<uint32_t>(failed.begin(), failed.end())};
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
  std::optional<Held> held_;  // progress of the enqueued layer, emitted once it has landed
  std::vector<engine::CopyOp> ops_;
};

}  // namespace

RetrieveOutcome RunRetrieve(const RetrieveTarget& target, EngineSink* engine,
                            const ProgressFn& progress, const LayerSource& source) {
  Handoff handoff(target, engine, progress);
  RetrieveOutcome out;
  out.status = source([&handoff](uint32_t layer, absl::Span<const ScatterOp> objects,
                                 absl::Span<const uint32_t> failed) {
    return handoff.Layer(layer, objects, failed);
  });
  handoff.Stop();
  out.next_layer = handoff.next();
  return out;
}

}  // namespace tutti::datapath

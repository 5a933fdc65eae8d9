#include "daemon/datapath/retrieve_transfer.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

constexpr uint32_t kParts = 2;
// The engine block each item of a read lands in.
const std::vector<uint32_t> kEngineBlocks = {7, 3};

// Records every engine call, in order, into a log shared with the progress callback.
class FakeEngine final : public EngineSink {
 public:
  explicit FakeEngine(std::vector<std::string>* log, bool overlap = true)
      : log_(log), overlap_(overlap) {}
  bool can_overlap() const override { return overlap_; }
  absl::Status CopyLayer(uint32_t layer, absl::Span<const engine::CopyOp> ops) override {
    return Take("copy", layer, ops);
  }
  absl::Status EnqueueLayer(uint32_t layer, absl::Span<const engine::CopyOp> ops) override {
    return Take("enqueue", layer, ops);
  }
  absl::Status Drain() override {
    log_->push_back("drain");
    return absl::OkStatus();
  }

  int fail_layer = -1;              // this layer's copy or enqueue fails with INTERNAL
  std::vector<engine::CopyOp> ops;  // every op taken

 private:
  absl::Status Take(const char* what, uint32_t layer, absl::Span<const engine::CopyOp> layer_ops) {
    if (static_cast<int>(layer) == fail_layer) {
      log_->push_back(absl::StrCat(what, " ", layer, " failed"));
      return absl::InternalError("injected engine error");
    }
    log_->push_back(absl::StrCat(what, " ", layer));
    ops.insert(ops.end(), layer_ops.begin(), layer_ops.end());
    return absl::OkStatus();
  }

  std::vector<std::string>* const log_;
  const bool overlap_;
};

// A read of `items` items over `layers` layers from one buffer per item; layer `failing_layer`
// reports item 0 failed (and serves it no more). Its sources stay if `stays`.
struct FakeRead {
  uint32_t items = 2;
  uint32_t layers = 4;
  bool stays = true;
  int failing_layer = -1;
  int stop_after = -1;  // the read ends with an error after this layer's sink call
  std::vector<std::string>* log = nullptr;
  std::vector<std::vector<uint8_t>> data;

  LayerSource Source() {
    data.assign(items, std::vector<uint8_t>(layers * kParts, 0));
    return [this](const LayerReader::Sink& sink) -> absl::Status {
      bool item0_failed = false;
      for (uint32_t layer = 0; layer < layers; ++layer) {
        std::vector<engine::CopyOp> ops;
        std::vector<uint32_t> failed;
        if (static_cast<int>(layer) == failing_layer) {
          failed.push_back(0);
          item0_failed = true;
        }
        for (uint32_t i = 0; i < items; ++i) {
          if (i == 0 && item0_failed) continue;
          for (uint32_t p = 0; p < kParts; ++p) {
            const uint32_t object = layer * kParts + p;
            ops.push_back(engine::CopyOp{kEngineBlocks[i], object, &data[i][object]});
          }
        }
        absl::Status s = sink(LayerObjects{layer, ops, failed, stays});
        if (!s.ok()) {
          log->push_back("read returns");
          return s;
        }
        if (static_cast<int>(layer) == stop_after) {
          log->push_back("read returns");
          return absl::DataLossError("the read ended early");
        }
      }
      log->push_back("read returns");
      return absl::OkStatus();
    };
  }
};

struct Run {
  std::vector<std::string> log;
  RetrieveOutcome outcome;
};

ProgressFn Recorder(std::vector<std::string>* log, int fail_at_layer = -1) {
  return [log, fail_at_layer](uint32_t layer, absl::Span<const uint32_t> failed) {
    if (static_cast<int>(layer) == fail_at_layer) return false;
    log->push_back(absl::StrCat("progress ", layer, " [", absl::StrJoin(failed, ","), "]"));
    return true;
  };
}

RetrieveTarget Target(uint32_t layers) { return RetrieveTarget{0, layers}; }

std::string Joined(const std::vector<std::string>& log) { return absl::StrJoin(log, "; "); }

// Sources that stay: every layer but the last is enqueued; each layer's progress waits until the
// next layer's engine call has returned (it has landed then), and keeps layer order.
TEST(RetrieveTransferTest, OverlapsLayersAndHoldsProgressUntilTheNextCallReturns) {
  std::vector<std::string> log;
  FakeEngine engine(&log);
  FakeRead read{2, 4, true, /*failing_layer=*/1, -1, &log};
  const RetrieveOutcome out = RunRetrieve(Target(4), &engine, Recorder(&log), read.Source());
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.next_layer, 4u);
  EXPECT_EQ(Joined(log),
            "enqueue 0; enqueue 1; progress 0 []; enqueue 2; progress 1 [0]; copy 3; "
            "progress 2 []; progress 3 []; read returns");
}

TEST(RetrieveTransferTest, CopiesLayersWhoseSourcesDoNotStay) {
  std::vector<std::string> log;
  FakeEngine engine(&log);
  FakeRead read{2, 3, /*stays=*/false, -1, -1, &log};
  const RetrieveOutcome out = RunRetrieve(Target(3), &engine, Recorder(&log), read.Source());
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(Joined(log),
            "copy 0; progress 0 []; copy 1; progress 1 []; copy 2; progress 2 []; read returns");
}

TEST(RetrieveTransferTest, AnEngineThatCannotOverlapCopiesEveryLayer) {
  std::vector<std::string> log;
  FakeEngine engine(&log, /*overlap=*/false);
  FakeRead read{2, 2, true, -1, -1, &log};
  const RetrieveOutcome out = RunRetrieve(Target(2), &engine, Recorder(&log), read.Source());
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(Joined(log), "copy 0; progress 0 []; copy 1; progress 1 []; read returns");
}

// The read's copies reach the engine as they are.
TEST(RetrieveTransferTest, HandsTheReadsCopiesToTheEngine) {
  std::vector<std::string> log;
  FakeEngine engine(&log);
  FakeRead read{2, 2, true, -1, -1, &log};
  const RetrieveOutcome out = RunRetrieve(Target(2), &engine, Recorder(&log), read.Source());
  ASSERT_TRUE(out.status.ok()) << out.status;
  ASSERT_EQ(engine.ops.size(), 2u * 2 * kParts);
  for (const engine::CopyOp& op : engine.ops) {
    const uint32_t item = op.block == kEngineBlocks[0] ? 0 : 1;
    EXPECT_EQ(op.block, kEngineBlocks[item]);
    EXPECT_EQ(op.staging, &read.data[item][op.object]);
  }
}

// An engine error after an enqueued layer: the engine is drained before the read returns (its
// sources go back then), the held progress is dropped, and the failed layer is the next one.
TEST(RetrieveTransferTest, DrainsOnAnEngineErrorAndDropsTheHeldProgress) {
  std::vector<std::string> log;
  FakeEngine engine(&log);
  engine.fail_layer = 2;
  FakeRead read{2, 4, true, -1, -1, &log};
  const RetrieveOutcome out = RunRetrieve(Target(4), &engine, Recorder(&log), read.Source());
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInternal) << out.status;
  EXPECT_EQ(out.next_layer, 2u);
  EXPECT_EQ(Joined(log),
            "enqueue 0; enqueue 1; progress 0 []; enqueue 2 failed; drain; read returns");
}

// Nothing in flight (the failing layer is the first): no drain.
TEST(RetrieveTransferTest, AnEngineErrorWithNothingInFlightDoesNotDrain) {
  std::vector<std::string> log;
  FakeEngine engine(&log);
  engine.fail_layer = 0;
  FakeRead read{2, 3, true, -1, -1, &log};
  const RetrieveOutcome out = RunRetrieve(Target(3), &engine, Recorder(&log), read.Source());
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(out.next_layer, 0u);
  EXPECT_EQ(Joined(log), "enqueue 0 failed; read returns");
}

// The client went away while a layer was in flight: the read stops, the engine is drained first.
TEST(RetrieveTransferTest, DrainsWhenTheClientGoesAway) {
  std::vector<std::string> log;
  FakeEngine engine(&log);
  FakeRead read{2, 4, true, -1, -1, &log};
  const RetrieveOutcome out =
      RunRetrieve(Target(4), &engine, Recorder(&log, /*fail_at_layer=*/1), read.Source());
  EXPECT_EQ(out.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(out.status.message(), "the client went away");
  EXPECT_EQ(out.next_layer, 3u);  // layer 2 was handed over before layer 1's progress failed
  EXPECT_EQ(Joined(log), "enqueue 0; enqueue 1; progress 0 []; enqueue 2; drain; read returns");
}

// The read ends early on its own (not the sink's error): the layer in flight is drained once it
// returns and its progress is never emitted.
TEST(RetrieveTransferTest, DrainsWhenTheReadStopsEarly) {
  std::vector<std::string> log;
  FakeEngine engine(&log);
  FakeRead read{2, 4, true, -1, /*stop_after=*/1, &log};
  const RetrieveOutcome out = RunRetrieve(Target(4), &engine, Recorder(&log), read.Source());
  EXPECT_EQ(out.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(out.next_layer, 2u);
  EXPECT_EQ(Joined(log), "enqueue 0; enqueue 1; progress 0 []; read returns; drain");
}

// A read refused before any layer: nothing is handed over, nothing drained.
TEST(RetrieveTransferTest, ARefusedReadHandsNothingOver) {
  std::vector<std::string> log;
  FakeEngine engine(&log);
  const RetrieveOutcome out =
      RunRetrieve(RetrieveTarget{3, 5}, &engine, Recorder(&log),
                  [](const LayerReader::Sink&) { return absl::ResourceExhaustedError("staging"); });
  EXPECT_EQ(out.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(out.next_layer, 3u);
  EXPECT_TRUE(log.empty()) << Joined(log);
}

}  // namespace
}  // namespace tutti::datapath

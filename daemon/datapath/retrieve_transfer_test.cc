#include "daemon/datapath/retrieve_transfer.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/datapath/staging_lease.h"
#include "daemon/datapath/verifier.h"
#include "daemon/pool/layout.h"
#include "daemon/pool/slot_header.h"
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
  const RetrieveOutcome out = HandOver(Target(4), &engine, Recorder(&log), read.Source());
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
  const RetrieveOutcome out = HandOver(Target(3), &engine, Recorder(&log), read.Source());
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(Joined(log),
            "copy 0; progress 0 []; copy 1; progress 1 []; copy 2; progress 2 []; read returns");
}

TEST(RetrieveTransferTest, AnEngineThatCannotOverlapCopiesEveryLayer) {
  std::vector<std::string> log;
  FakeEngine engine(&log, /*overlap=*/false);
  FakeRead read{2, 2, true, -1, -1, &log};
  const RetrieveOutcome out = HandOver(Target(2), &engine, Recorder(&log), read.Source());
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(Joined(log), "copy 0; progress 0 []; copy 1; progress 1 []; read returns");
}

// The read's copies reach the engine as they are.
TEST(RetrieveTransferTest, HandsTheReadsCopiesToTheEngine) {
  std::vector<std::string> log;
  FakeEngine engine(&log);
  FakeRead read{2, 2, true, -1, -1, &log};
  const RetrieveOutcome out = HandOver(Target(2), &engine, Recorder(&log), read.Source());
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
  const RetrieveOutcome out = HandOver(Target(4), &engine, Recorder(&log), read.Source());
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
  const RetrieveOutcome out = HandOver(Target(3), &engine, Recorder(&log), read.Source());
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
      HandOver(Target(4), &engine, Recorder(&log, /*fail_at_layer=*/1), read.Source());
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
  const RetrieveOutcome out = HandOver(Target(4), &engine, Recorder(&log), read.Source());
  EXPECT_EQ(out.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(out.next_layer, 2u);
  EXPECT_EQ(Joined(log), "enqueue 0; enqueue 1; progress 0 []; read returns; drain");
}

// A read refused before any layer: nothing is handed over, nothing drained.
TEST(RetrieveTransferTest, ARefusedReadHandsNothingOver) {
  std::vector<std::string> log;
  FakeEngine engine(&log);
  const RetrieveOutcome out =
      HandOver(RetrieveTarget{3, 5}, &engine, Recorder(&log),
               [](const LayerReader::Sink&) { return absl::ResourceExhaustedError("staging"); });
  EXPECT_EQ(out.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(out.next_layer, 3u);
  EXPECT_TRUE(log.empty()) << Joined(log);
}

// --- The whole transfer: a fake store side, a LayerReader over pool files of zeros. ---

constexpr NamespaceId kNs = 9;
constexpr uint32_t kObjectLen = 4096;
constexpr uint32_t kLayers = 4;
constexpr uint32_t kObjects = kLayers * kParts;
constexpr uint64_t kLayerBytes = 2 * kParts * kObjectLen;  // two items' objects of one layer

Key KeyOf(uint32_t item) {
  Key k;
  k.bytes[0] = static_cast<uint8_t>(item + 1);
  return k;
}

// Page-aligned retrieve staging.
struct StagingMemory {
  explicit StagingMemory(uint64_t bytes)
      : data(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes))),
        pool(absl::MakeSpan(data, bytes)) {}
  ~StagingMemory() { std::free(data); }
  uint8_t* data;
  StagingPool pool;
};

// Pool files of zeros: every read completes inline, whole.
void PostZeros(uint64_t, absl::Span<io::IoRequest> batch, std::function<void()> done) {
  for (io::IoRequest& r : batch) {
    std::memset(r.buf, 0, r.len);
    r.result = r.len;
  }
  done();
}

// The store side: two items in slots 0 and 1, each object's checksum that of zeros (item
// `bad_item`'s object `bad_object` gets a wrong one). Logs "prepare" and "finish" into the
// engine's log, and what Finish was given.
class FakeStore final : public RetrieveStore {
 public:
  FakeStore(std::vector<std::string>* log, const StagingPool* staging)
      : log_(log), staging_(staging) {
    const std::vector<uint8_t> zeros(kObjectLen, 0);
    for (uint32_t item = 0; item < 2; ++item) {
      for (uint32_t j = 0; j < kObjects; ++j) {
        checksums_[item].push_back(
            pool::ObjectChecksum(kNs, KeyOf(item), 1, j, zeros.data(), kObjectLen));
      }
    }
  }

  absl::StatusOr<std::unique_ptr<PreparedRead>> PrepareRead(const RetrieveRequest& r) override {
    log_->push_back("prepare");
    if (!refusal.ok()) return refusal;
    if (bad_item >= 0) checksums_[bad_item][bad_object] ^= 1;
    return std::unique_ptr<PreparedRead>(std::make_unique<Read>(this, r));
  }

  absl::Status refusal;  // PrepareRead's answer where not OK
  int bad_item = -1;
  uint32_t bad_object = 0;
  // What Finish saw.
  int finished = 0;
  LayerReadResult result;
  uint64_t staging_used_at_finish = ~uint64_t{0};

 private:
  class Read final : public PreparedRead {
   public:
    Read(FakeStore* store, const RetrieveRequest& r) : store_(store) {
      for (uint32_t item = 0; item < r.keys.size(); ++item) {
        ReadSource s;
        s.slot = item;
        s.key = r.keys[item];
        s.epoch = 1;
        s.checksums = store->checksums_[item];
        sources_.push_back(s);
      }
      request_ = LayerReadRequest{r.ns,   sources_,   r.layer_begin,  r.layer_end,
                                  kParts, kObjectLen, r.engine_blocks};
    }
    const LayerReadRequest& request() const override { return request_; }
    void Finish(const LayerReadResult& result) override {
      store_->log_->push_back("finish");
      ++store_->finished;
      store_->result = result;
      store_->staging_used_at_finish = store_->staging_->used_bytes();
    }

   private:
    FakeStore* const store_;
    std::vector<ReadSource> sources_;
    LayerReadRequest request_;
  };

  std::vector<std::string>* const log_;
  const StagingPool* const staging_;
  std::vector<uint64_t> checksums_[2];
};

// A reader, its staging and store side, and a retrieve of layers [begin, end) of both items.
struct Transfer {
  explicit Transfer(uint64_t staging_bytes = 1 << 20, uint32_t begin = 0, uint32_t end = kLayers)
      : staging(staging_bytes),
        verifier(MakeCpuVerifier(nullptr)),
        reader(LayerReaderOptions{Layout(), kObjectLen, 8, kObjectLen}, &staging.pool,
               verifier.get(), PostZeros),
        store(&log, &staging.pool),
        request{kNs, keys, begin, end, kEngineBlocks} {}

  static pool::PoolLayout Layout() {
    auto layout = pool::PoolLayout::Compute(16ull << 20, 1, kObjectLen, kObjects, 1);
    EXPECT_TRUE(layout.ok()) << layout.status();
    return *layout;
  }

  RetrieveOutcome Run(EngineSink* engine, const ProgressFn& progress) {
    return RunRetrieve(request, &store, &reader, engine, progress);
  }

  std::vector<std::string> log;
  const std::vector<Key> keys = {KeyOf(0), KeyOf(1)};
  StagingMemory staging;
  std::unique_ptr<Verifier> verifier;
  LayerReader reader;
  FakeStore store;
  RetrieveRequest request;
};

// Prepare, read, hand over, finish: Finish gets the read's result (the item that failed its
// check), once the reader's staging is back.
TEST(RetrieveTransferTest, PreparesReadsHandsOverAndFinishes) {
  Transfer t;
  t.store.bad_item = 1;
  t.store.bad_object = 1 * kParts + 1;  // layer 1
  FakeEngine engine(&t.log);
  const RetrieveOutcome out = t.Run(&engine, Recorder(&t.log));
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_EQ(out.next_layer, kLayers);
  EXPECT_EQ(Joined(t.log),
            "prepare; enqueue 0; enqueue 1; progress 0 []; enqueue 2; progress 1 [1]; copy 3; "
            "progress 2 []; progress 3 []; finish");
  EXPECT_EQ(t.store.finished, 1);
  EXPECT_TRUE(t.store.result.status.ok());
  EXPECT_EQ(t.store.result.layers_done, kLayers);
  EXPECT_EQ(t.store.result.failures,
            (std::vector<ReadFailure>{ReadFailure::kNone, ReadFailure::kChecksum}));
  EXPECT_EQ(t.store.staging_used_at_finish, 0u);
  EXPECT_EQ(engine.ops.size(), (kLayers + 1) * kParts);  // item 1 served in layer 0 only
}

// An engine error: the layer in flight is drained, the reader returns its staging, then Finish
// gets the engine's error.
TEST(RetrieveTransferTest, FinishesAfterAnEngineError) {
  Transfer t;
  FakeEngine engine(&t.log);
  engine.fail_layer = 1;
  const RetrieveOutcome out = t.Run(&engine, Recorder(&t.log));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInternal) << out.status;
  EXPECT_EQ(out.next_layer, 1u);
  EXPECT_EQ(Joined(t.log), "prepare; enqueue 0; enqueue 1 failed; drain; finish");
  EXPECT_EQ(t.store.finished, 1);
  EXPECT_EQ(t.store.result.status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(t.store.result.layers_done, 2u);
  EXPECT_EQ(t.store.staging_used_at_finish, 0u);
}

// The client went away: CANCELLED, drained, staging back, finished.
TEST(RetrieveTransferTest, FinishesWhenProgressFails) {
  Transfer t;
  FakeEngine engine(&t.log);
  const RetrieveOutcome out = t.Run(&engine, Recorder(&t.log, /*fail_at_layer=*/0));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kCancelled) << out.status;
  EXPECT_EQ(out.next_layer, 2u);
  EXPECT_EQ(Joined(t.log), "prepare; enqueue 0; enqueue 1; drain; finish");
  EXPECT_EQ(t.store.finished, 1);
  EXPECT_EQ(t.store.result.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(t.store.staging_used_at_finish, 0u);
}

// A refused prepare: its error, nothing read or handed over, nothing to finish.
TEST(RetrieveTransferTest, ARefusedPrepareReadsNothing) {
  Transfer t(1 << 20, /*begin=*/1, /*end=*/3);
  t.store.refusal = absl::FailedPreconditionError("block is not pinned");
  FakeEngine engine(&t.log);
  const RetrieveOutcome out = t.Run(&engine, Recorder(&t.log));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kFailedPrecondition) << out.status;
  EXPECT_EQ(out.next_layer, 1u);
  EXPECT_EQ(Joined(t.log), "prepare");
  EXPECT_EQ(t.store.finished, 0);
  EXPECT_EQ(t.reader.counters().calls, 0u);
  EXPECT_EQ(t.staging.pool.used_bytes(), 0u);
}

// The reader refuses (one layer needs more staging than the pool holds): Finish still runs, with
// nothing read.
TEST(RetrieveTransferTest, FinishesAReadTheReaderRefused) {
  Transfer t(/*staging_bytes=*/kLayerBytes / 2);
  FakeEngine engine(&t.log);
  const RetrieveOutcome out = t.Run(&engine, Recorder(&t.log));
  EXPECT_EQ(out.status.code(), absl::StatusCode::kResourceExhausted) << out.status;
  EXPECT_EQ(out.next_layer, 0u);
  EXPECT_EQ(Joined(t.log), "prepare; finish");
  EXPECT_EQ(t.store.finished, 1);
  EXPECT_EQ(t.store.result.layers_done, 0u);
}

// ReadPrepared (no handoff): a sink error stops the read; Finish gets it, staging back.
TEST(RetrieveTransferTest, ReadPreparedFinishesAfterASinkError) {
  Transfer t;
  int layers = 0;
  const absl::Status s =
      ReadPrepared(t.request, &t.store, &t.reader, [&](const LayerObjects& layer) {
        ++layers;
        return layer.layer == 2 ? absl::AbortedError("sink") : absl::OkStatus();
      });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(layers, 3);
  EXPECT_EQ(Joined(t.log), "prepare; finish");
  EXPECT_EQ(t.store.result.status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(t.store.result.layers_done, 3u);
  EXPECT_EQ(t.store.staging_used_at_finish, 0u);
}

}  // namespace
}  // namespace tutti::datapath

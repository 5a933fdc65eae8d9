#include "daemon/datapath/layer_reader.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/datapath/placing_verifier_fake.h"
#include "daemon/io/memory_backend.h"
#include "daemon/pool/slot_header.h"
#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

constexpr NamespaceId kNs = 77;
constexpr uint32_t kFrame = 4096;
constexpr uint32_t kParts = 2;
constexpr uint32_t kLayers = 4;
constexpr uint32_t kObjects = kParts * kLayers;

Key KeyOf(uint32_t i) {
  Key k;
  k.bytes[0] = static_cast<uint8_t>(i + 1);
  k.bytes[15] = 0x5a;
  return k;
}

uint8_t ContentByte(uint32_t item, uint32_t object, uint32_t offset) {
  return static_cast<uint8_t>(item * 31 + object * 17 + offset / 64 + 1);
}

// A page-aligned region for staging.
struct Memory {
  explicit Memory(uint64_t bytes)
      : data(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes))), size(bytes) {}
  ~Memory() { std::free(data); }
  uint8_t* data;
  uint64_t size;
};

// Pool files in memory, read by a fake post that completes inline and lets a test change what a
// request returns (partial and failed completions).
class FakePool {
 public:
  FakePool(const pool::PoolLayout& layout, uint32_t object_len)
      : layout_(layout),
        object_len_(object_len),
        files_(layout.num_files(), std::vector<uint8_t>(layout.file_bytes(), 0)) {}

  // Writes block `item` (with its checksums) into `slot`.
  void Put(uint32_t item, uint64_t slot) {
    auto& sums = checksums_[item];
    sums.resize(kObjects);
    for (uint32_t j = 0; j < std::min(kObjects, layout_.max_objects()); ++j) {
      const pool::Location loc = layout_.ObjectLocation(slot, j);
      layer_at_[{loc.file, loc.offset}] = j / kParts;
      uint8_t* dst = files_[loc.file].data() + loc.offset;
      for (uint32_t b = 0; b < object_len_; ++b) dst[b] = ContentByte(item, j, b);
      sums[j] = pool::ObjectChecksum(kNs, KeyOf(item), 1, j, dst, object_len_);
    }
  }
  ReadSource Source(uint32_t item, uint64_t slot) const {
    ReadSource s;
    s.slot = slot;
    s.key = KeyOf(item);
    s.epoch = 1;
    s.checksums = checksums_.at(item);
    return s;
  }
  void Corrupt(uint64_t slot, uint32_t object) {
    const pool::Location loc = layout_.ObjectLocation(slot, object);
    files_[loc.file][loc.offset + 5] ^= 0xff;
  }

  LayerReader::PostFn Post() {
    return [this](uint64_t stream, absl::Span<io::IoRequest> batch, std::function<void()> done) {
      {
        std::lock_guard<std::mutex> lock(mu_);  // several Reads may post at once
        streams.push_back(stream);
        // A layer's reads may come in several batches (one device each): count layers.
        if (!batch.empty()) layers_posted.insert(layer_at_.at({batch[0].file, batch[0].offset}));
        for (io::IoRequest& r : batch) {
          std::memcpy(r.buf, files_[r.file].data() + r.offset, r.len);
          r.result = r.len;
          if (fault) fault(r);
          posted.push_back(r);
        }
      }
      done();
    };
  }

  std::function<void(io::IoRequest&)> fault;
  std::vector<io::IoRequest> posted;
  std::vector<uint64_t> streams;  // per batch posted, in order
  std::set<uint32_t> layers_posted;
  int batches() const { return static_cast<int>(layers_posted.size()); }  // layers posted

 private:
  std::mutex mu_;
  const pool::PoolLayout layout_;
  const uint32_t object_len_;
  std::vector<std::vector<uint8_t>> files_;
  std::map<uint32_t, std::vector<uint64_t>> checksums_;
  std::map<std::pair<uint32_t, uint64_t>, uint32_t> layer_at_;  // (file, offset) -> layer
};

// One slot per extent group (extent_slots 1): each slot's objects follow each other on a file, as
// in pool format 1, which the cases below lay out by hand.
pool::PoolLayout Layout(uint32_t files, uint32_t max_objects = kObjects, uint32_t frame = kFrame) {
  auto layout = pool::PoolLayout::Compute(16ull << 20, files, frame, max_objects, 1);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

// What a sink saw.
struct Seen {
  std::vector<uint32_t> layers;
  std::map<uint32_t, std::vector<uint32_t>> failed;     // per layer
  std::map<std::pair<uint32_t, uint32_t>, int> served;  // (item, object) -> times
  int bad_bytes = 0;
  int from_dram = 0;
  absl::Span<const uint8_t> dram;  // the DRAM tier's bytes, where the test has some
};

LayerReader::Sink Recorder(Seen* seen, uint32_t object_len) {
  return [seen, object_len](const LayerObjects& got) {
    const uint32_t layer = got.layer;
    seen->layers.push_back(layer);
    seen->failed[layer].assign(got.failed_items.begin(), got.failed_items.end());
    for (const engine::CopyOp& op : got.copies) {
      EXPECT_EQ(op.object / kParts, layer);
      EXPECT_EQ(op.device_copy, nullptr) << "the CPU verifier keeps no device copies";
      ++seen->served[{op.block, op.object}];
      seen->from_dram +=
          op.staging >= seen->dram.data() && op.staging < seen->dram.data() + seen->dram.size();
      for (uint32_t b = 0; b < object_len; ++b) {
        seen->bad_bytes += op.staging[b] != ContentByte(op.block, op.object, b);
      }
    }
    return absl::OkStatus();
  };
}

class LayerReaderTest : public ::testing::Test {
 protected:
  // Blocks 0 .. n-1 written into slots 0 .. n-1, as read sources.
  std::vector<ReadSource> PutInOrder(uint32_t n) {
    std::vector<ReadSource> items;
    for (uint32_t i = 0; i < n; ++i) {
      fake_->Put(i, i);
      items.push_back(fake_->Source(i, i));
    }
    return items;
  }
  void Make(const pool::PoolLayout& layout, uint32_t object_len, uint64_t staging_bytes,
            uint32_t max_read_bytes = 1u << 20) {
    object_len_ = object_len;
    fake_ = std::make_unique<FakePool>(layout, object_len);
    memory_ = std::make_unique<Memory>(staging_bytes);
    staging_ = std::make_unique<StagingPool>(absl::MakeSpan(memory_->data, memory_->size));
    reader_ = std::make_unique<LayerReader>(LayerReaderOptions{layout, max_read_bytes, 4},
                                            staging_.get(), verifier_.get(), fake_->Post());
  }
  LayerReadResult Read(absl::Span<const ReadSource> items, Seen* seen) {
    return reader_->Read(LayerReadRequest{kNs, items, 0, kLayers, kParts, object_len_},
                         Recorder(seen, object_len_));
  }

  uint32_t object_len_ = kFrame;
  std::unique_ptr<FakePool> fake_;
  std::unique_ptr<Memory> memory_;
  std::unique_ptr<StagingPool> staging_;
  WorkPool checks_{2, "checks"};  // checks run off the reading thread, as in tuttid
  std::unique_ptr<Verifier> verifier_ = MakeCpuVerifier(&checks_);
  std::unique_ptr<LayerReader> reader_;
};

// One file: each block's K and V are adjacent frames, read in one I/O per block and layer.
TEST_F(LayerReaderTest, ServesEveryObjectVerifiedAndMergesAdjacentFrames) {
  Make(Layout(1), kFrame, 64 * kFrame);
  std::vector<ReadSource> items;
  for (uint32_t i = 0; i < 8; ++i) {
    fake_->Put(i, 7 - i);
    items.push_back(fake_->Source(i, 7 - i));
  }
  Seen seen;
  const LayerReadResult result = Read(items, &seen);
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_EQ(seen.layers, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(seen.served.size(), 8u * kObjects);
  for (const auto& [object, times] : seen.served) EXPECT_EQ(times, 1);
  EXPECT_EQ(seen.bad_bytes, 0);
  for (ReadFailure f : result.failures) EXPECT_EQ(f, ReadFailure::kNone);
  const ReadCountersSnapshot c = reader_->counters();
  EXPECT_EQ(c.ios, 8u * kLayers);
  EXPECT_EQ(c.objects, 8u * kObjects);
  EXPECT_EQ(c.merged_ios, 8u * kLayers);
  EXPECT_EQ(c.io_bytes, 8u * kObjects * kFrame);
  EXPECT_EQ(staging_->used_bytes(), 0u);
}

// Every batch of one Read is posted as one stream, and the next Read as another: the scheduler
// and the bounce slots let Reads at once take turns by it.
TEST_F(LayerReaderTest, EachReadPostsAsAStreamOfItsOwn) {
  Make(Layout(2), kFrame, 64 * kFrame);
  const std::vector<ReadSource> items = PutInOrder(4);
  Seen first, second;
  ASSERT_TRUE(Read(items, &first).status.ok());
  const size_t first_batches = fake_->streams.size();
  ASSERT_GT(first_batches, 1u);
  ASSERT_TRUE(Read(items, &second).status.ok());
  ASSERT_GT(fake_->streams.size(), first_batches);
  const std::set<uint64_t> a(fake_->streams.begin(), fake_->streams.begin() + first_batches);
  const std::set<uint64_t> b(fake_->streams.begin() + first_batches, fake_->streams.end());
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(*a.begin(), *b.begin());
  EXPECT_EQ(second.bad_bytes, 0);
}

// The leading thread's time is split into waiting for layers and handing them over: a sink that
// takes 5 ms per layer shows as at least that much sink time, per layer handed.
TEST_F(LayerReaderTest, CountsTheLeadingThreadsWaitAndSinkTime) {
  Make(Layout(1), kFrame, 64 * kFrame);
  const std::vector<ReadSource> items = PutInOrder(4);
  const LayerReadResult result = reader_->Read(
      LayerReadRequest{kNs, items, 0, kLayers, kParts, object_len_}, [](const LayerObjects&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return absl::OkStatus();
      });
  ASSERT_TRUE(result.status.ok()) << result.status;
  const ReadCountersSnapshot c = reader_->counters();
  EXPECT_EQ(c.layers, kLayers);
  EXPECT_GE(c.lead_sink_ns, kLayers * 5'000'000ull);
  EXPECT_EQ(c.calls, 1u);
  EXPECT_GT(c.lead_post_ns, 0u);
  EXPECT_GE(c.call_ns, c.lead_wait_ns + c.lead_sink_ns + c.lead_post_ns);
  // Reads complete inline here and checks take microseconds: the wait is the smaller part.
  EXPECT_LT(c.lead_wait_ns, c.lead_sink_ns);
}

// A verifier that keeps checked copies elsewhere (as a GPU verifier's mirror does) hands their
// addresses on: each copy the sink gets carries its object's device copy; a failed object's item
// is not served. With the CPU verifier (every other test) device_copy stays null.
TEST_F(LayerReaderTest, CopiesCarryTheVerifiersDeviceCopies) {
  class MarkingVerifier final : public Verifier {
   public:
    explicit MarkingVerifier(Verifier* cpu) : cpu_(cpu) {}
    std::string_view name() const override { return "marking"; }
    void Verify(uint64_t stream, absl::Span<const ObjectCheck> checks, absl::Span<uint8_t> matches,
                std::function<void()> done) override {
      cpu_->Verify(stream, checks, matches, [checks, matches, done = std::move(done)] {
        for (size_t i = 0; i < checks.size(); ++i) {
          if (matches[i] && checks[i].device_copy != nullptr) {
            *checks[i].device_copy = checks[i].bytes + 1;  // a marker, never dereferenced
          }
        }
        done();
      });
    }

   private:
    Verifier* cpu_;
  };
  MarkingVerifier marking(verifier_.get());
  const pool::PoolLayout layout = Layout(2);
  object_len_ = kFrame;
  fake_ = std::make_unique<FakePool>(layout, kFrame);
  memory_ = std::make_unique<Memory>(64 * kFrame);
  staging_ = std::make_unique<StagingPool>(absl::MakeSpan(memory_->data, memory_->size));
  reader_ = std::make_unique<LayerReader>(LayerReaderOptions{layout, 1u << 20, 4}, staging_.get(),
                                          &marking, fake_->Post());
  std::vector<ReadSource> items;
  for (uint32_t i = 0; i < 4; ++i) {
    fake_->Put(i, i);
    items.push_back(fake_->Source(i, i));
  }
  fake_->Corrupt(2, 1 * kParts);  // item 2 fails in layer 1
  int copies = 0, marked = 0;
  const LayerReadResult result = reader_->Read(
      LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame}, [&](const LayerObjects& got) {
        for (const engine::CopyOp& op : got.copies) {
          ++copies;
          marked += op.device_copy == op.staging + 1;
        }
        return absl::OkStatus();
      });
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_EQ(result.failures[2], ReadFailure::kChecksum);
  EXPECT_EQ(copies, 4 * kParts + 3 * kParts * (kLayers - 1));
  EXPECT_EQ(marked, copies);
}

class BouncedReaderTest : public LayerReaderTest {
 protected:
  // Layers staged in `layers_bytes` of "device" memory, reads landing in `depth` slots of
  // `slot_bytes` per file.
  void MakeBounced(const pool::PoolLayout& layout, uint32_t depth, uint32_t slot_bytes,
                   Verifier* verifier, uint32_t post_bytes = 1u << 20) {
    object_len_ = kFrame;
    fake_ = std::make_unique<FakePool>(layout, kFrame);
    memory_ = std::make_unique<Memory>(64 * kFrame);
    staging_ = std::make_unique<StagingPool>(absl::MakeSpan(memory_->data, memory_->size),
                                             MemoryKind::kDevice);
    bounce_memory_ = std::make_unique<Memory>(
        BounceSlots::BytesFor(layout.num_files(), depth, slot_bytes));
    auto slots = BounceSlots::Create(absl::MakeSpan(bounce_memory_->data, bounce_memory_->size),
                                     layout.num_files(), depth, slot_bytes);
    ASSERT_TRUE(slots.ok()) << slots.status();
    bounce_ = std::move(*slots);
    reader_ = std::make_unique<LayerReader>(LayerReaderOptions{layout, kFrame * 2, 4, post_bytes},
                                            staging_.get(), verifier, fake_->Post(),
                                            bounce_.get());
  }
  // A sink that checks every copy's bytes at its place in the layer's lease.
  LayerReader::Sink PlacedRecorder(Seen* seen) {
    return [this, seen](const LayerObjects& got) {
      seen->layers.push_back(got.layer);
      seen->failed[got.layer].assign(got.failed_items.begin(), got.failed_items.end());
      for (const engine::CopyOp& op : got.copies) {
        EXPECT_EQ(op.device_copy, op.staging);
        EXPECT_GE(op.staging, memory_->data);
        EXPECT_LT(op.staging, memory_->data + memory_->size);
        ++seen->served[{op.block, op.object}];
        for (uint32_t b = 0; b < kFrame; ++b) {
          seen->bad_bytes += op.staging[b] != ContentByte(op.block, op.object, b);
        }
      }
      return absl::OkStatus();
    };
  }
  std::unique_ptr<Memory> bounce_memory_;
  std::unique_ptr<BounceSlots> bounce_;
};

// Two files, one slot of one merged read each: every read of a layer passes through the same two
// small slots, and every object reaches the engine from its place, checked.
TEST_F(BouncedReaderTest, ReadsPassThroughOneSlotPerFileAndServeFromTheirPlace) {
  PlacingVerifierFake placing(verifier_.get());
  MakeBounced(Layout(2), /*depth=*/1, /*slot_bytes=*/2 * kFrame, &placing, /*post_bytes=*/kFrame);
  std::vector<ReadSource> items;
  for (uint32_t i = 0; i < 6; ++i) {
    fake_->Put(i, 5 - i);
    items.push_back(fake_->Source(i, 5 - i));
  }
  fake_->Corrupt(4, 2 * kParts + 1);  // item 1 (slot 4) fails in layer 2
  Seen seen;
  const LayerReadResult result = reader_->Read(
      LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame}, PlacedRecorder(&seen));
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_EQ(seen.layers, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(seen.bad_bytes, 0);
  EXPECT_EQ(result.failures[1], ReadFailure::kChecksum);
  EXPECT_EQ(seen.failed[2], (std::vector<uint32_t>{1}));
  EXPECT_EQ(seen.served.size(), 6u * kObjects - (kLayers - 2) * kParts);
  for (const auto& [object, times] : seen.served) EXPECT_EQ(times, 1);
  // Every read went into a bounce slot, never into the layer staging.
  for (const io::IoRequest& r : fake_->posted) {
    const uint8_t* buf = static_cast<const uint8_t*>(r.buf);
    EXPECT_GE(buf, bounce_memory_->data);
    EXPECT_LE(buf + r.len, bounce_memory_->data + bounce_memory_->size);
  }
  EXPECT_LE(bounce_->most_held(), 2u);
  EXPECT_EQ(bounce_->held(), 0u);
  EXPECT_EQ(staging_->used_bytes(), 0u);
}

// A verifier that checks but does not place (the GPU's CUDA error path falls back to the CPU's):
// the objects must not be served from a slot that is reused; the items fail as not placed.
TEST_F(BouncedReaderTest, ObjectsNotPlacedAreNeverServed) {
  MakeBounced(Layout(1), /*depth=*/2, /*slot_bytes=*/2 * kFrame, verifier_.get());
  const std::vector<ReadSource> items = PutInOrder(3);
  Seen seen;
  const LayerReadResult result = reader_->Read(
      LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame}, PlacedRecorder(&seen));
  ASSERT_TRUE(result.status.ok()) << result.status;
  for (ReadFailure f : result.failures) EXPECT_EQ(f, ReadFailure::kNotPlaced);
  EXPECT_EQ(seen.failed[0].size(), 3u);
  EXPECT_TRUE(seen.served.empty());
  EXPECT_EQ(bounce_->held(), 0u);
}

// A verifier that copied the objects out but could not check them after the slot went back
// (kNotChecked, the GPU's after a CUDA error): never served, and not taken for corrupt blocks.
TEST_F(BouncedReaderTest, ObjectsNotCheckedAfterTheSlotWentBackAreNeitherServedNorBlamed) {
  PlacingVerifierFake placing(verifier_.get());
  placing.answer_not_checked = true;
  MakeBounced(Layout(2), /*depth=*/1, /*slot_bytes=*/2 * kFrame, &placing);
  const std::vector<ReadSource> items = PutInOrder(3);
  Seen seen;
  const LayerReadResult result = reader_->Read(
      LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame}, PlacedRecorder(&seen));
  ASSERT_TRUE(result.status.ok()) << result.status;
  for (ReadFailure f : result.failures) EXPECT_EQ(f, ReadFailure::kNotPlaced);
  EXPECT_TRUE(seen.served.empty());
  EXPECT_EQ(bounce_->held(), 0u);
}

// Holds each batch's answer until `hold` batches are held at once, then answers them all and
// holds no more. A reader that waited for the answers before reusing a bounce slot would never
// get there: after 2 s it stops holding too, so such a reader fails the test instead of hanging.
class HoldingVerifier final : public ReleasingVerifierFake {
 public:
  HoldingVerifier(Verifier* inner, size_t hold) : inner_(inner), hold_(hold) {
    watchdog_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(2), [this] { return !holding_; });
      holding_ = false;
      std::vector<std::function<void()>> run;
      run.swap(held_);
      lock.unlock();
      for (auto& f : run) f();
    });
  }
  ~HoldingVerifier() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      holding_ = false;
    }
    cv_.notify_all();
    watchdog_.join();
  }
  std::string_view name() const override { return "holding"; }
  void VerifyReleasing(uint64_t stream, absl::Span<const ObjectCheck> checks,
                       absl::Span<uint8_t> matches, std::function<void()> released,
                       std::function<void()> done) override {
    inner_->VerifyReleasing(stream, checks, matches, std::move(released),
                            [this, done = std::move(done)]() mutable {
                              std::vector<std::function<void()>> run;
                              {
                                std::lock_guard<std::mutex> lock(mu_);
                                if (holding_) {
                                  held_.push_back(done);
                                  most_held_ = std::max(most_held_, held_.size());
                                  if (held_.size() < hold_) return;
                                  holding_ = false;
                                  run.swap(held_);  // this batch's answer among them
                                } else {
                                  run.push_back(done);
                                }
                              }
                              cv_.notify_all();
                              for (auto& f : run) f();
                            });
  }
  size_t most_held() {
    std::lock_guard<std::mutex> lock(mu_);
    return most_held_;
  }

 private:
  Verifier* const inner_;
  const size_t hold_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool holding_ = true;
  std::vector<std::function<void()>> held_;
  size_t most_held_ = 0;
  std::thread watchdog_;
};

// The verifier gives a bounce slot back once it has copied the objects out (VerifyReleasing),
// before its checks answer: with one slot for the one file, later batches are read into it while
// the earlier ones still wait for their answers.
TEST_F(BouncedReaderTest, SlotsGoBackBeforeTheChecksAnswer) {
  PlacingVerifierFake placing(verifier_.get());
  HoldingVerifier holding(&placing, /*hold=*/3);
  MakeBounced(Layout(1), /*depth=*/1, /*slot_bytes=*/2 * kFrame, &holding, /*post_bytes=*/kFrame);
  const std::vector<ReadSource> items = PutInOrder(4);
  Seen seen;
  const LayerReadResult result = reader_->Read(
      LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame}, PlacedRecorder(&seen));
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_GE(holding.most_held(), 3u);
  EXPECT_EQ(seen.bad_bytes, 0);
  EXPECT_EQ(seen.served.size(), 4u * kObjects);
  for (ReadFailure f : result.failures) EXPECT_EQ(f, ReadFailure::kNone);
  EXPECT_EQ(bounce_->most_held(), 1u);
  EXPECT_EQ(bounce_->held(), 0u);
}

// Where a layer's batches spend their time, counted by phase: each read takes 3 ms (the post
// sleeps before completing), each check 4 ms on a thread of its own before the slot goes back
// (as the GPU's copies do), and with one slot for the one file every batch but the first waits
// for the slot while the one before it is checked.
TEST_F(BouncedReaderTest, CountsEachBatchsSlotWaitReadsAndChecks) {
  class SlowVerifier final : public ReleasingVerifierFake {
   public:
    explicit SlowVerifier(Verifier* inner) : inner_(inner) {}
    std::string_view name() const override { return "slow"; }
    void VerifyReleasing(uint64_t stream, absl::Span<const ObjectCheck> checks,
                         absl::Span<uint8_t> matches, std::function<void()> released,
                         std::function<void()> done) override {
      pool_.Schedule([this, stream, checks, matches, released = std::move(released),
                      done = std::move(done)]() mutable {
        std::this_thread::sleep_for(std::chrono::milliseconds(4));
        inner_->VerifyReleasing(stream, checks, matches, std::move(released), std::move(done));
      });
    }

   private:
    Verifier* const inner_;
    WorkPool pool_{1, "slow-check"};
  };
  PlacingVerifierFake placing(verifier_.get());
  SlowVerifier slow(&placing);
  MakeBounced(Layout(1), /*depth=*/1, /*slot_bytes=*/2 * kFrame, &slow);
  const LayerReader::PostFn inner = fake_->Post();
  reader_ = std::make_unique<LayerReader>(
      LayerReaderOptions{Layout(1), kFrame * 2, 4}, staging_.get(), &slow,
      [inner](uint64_t stream, absl::Span<io::IoRequest> batch, std::function<void()> done) {
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        inner(stream, batch, std::move(done));
      },
      bounce_.get());
  const std::vector<ReadSource> items = PutInOrder(2);  // not adjacent: a batch each per layer
  Seen seen;
  const LayerReadResult result = reader_->Read(
      LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame}, PlacedRecorder(&seen));
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_EQ(seen.served.size(), 2u * kObjects);
  const ReadCountersSnapshot c = reader_->counters();
  constexpr uint64_t kBatches = 2 * kLayers;
  constexpr uint64_t kMs = 1'000'000;
  EXPECT_EQ(c.batches, kBatches);
  EXPECT_EQ(fake_->posted.size(), kBatches);
  EXPECT_GE(c.batch_io_ns, kBatches * 3 * kMs);
  EXPECT_GE(c.batch_check_ns, kBatches * 4 * kMs);
  EXPECT_GE(c.batch_slot_ns, (kBatches - 1) * 4 * kMs);
  // The slot goes back after the check's 4 ms, within the check phase.
  EXPECT_GE(c.batch_release_ns, kBatches * 4 * kMs);
  EXPECT_LE(c.batch_release_ns, c.batch_check_ns);
  // Every batch's three phases lie within the call.
  EXPECT_LE(c.batch_slot_ns + c.batch_io_ns + c.batch_check_ns, kBatches * c.call_ns);
}

// Without bounce slots no batch waits for one.
TEST_F(LayerReaderTest, BatchesWithoutBounceSlotsWaitForNone) {
  Make(Layout(2), kFrame, 64 * kFrame);
  const std::vector<ReadSource> items = PutInOrder(4);
  Seen seen;
  ASSERT_TRUE(Read(items, &seen).status.ok());
  const ReadCountersSnapshot c = reader_->counters();
  EXPECT_EQ(c.batches, fake_->streams.size());
  EXPECT_GT(c.batches, 0u);
  EXPECT_LT(c.batch_slot_ns, c.batches * 1'000'000ull);  // only the clock reads between
  EXPECT_EQ(c.batch_release_ns, 0u);
  EXPECT_GT(c.batch_io_ns + c.batch_check_ns, 0u);
}

// Several Retrieves at once share each file's slots (one each here) and all finish.
TEST_F(BouncedReaderTest, ConcurrentReadsShareTheSlots) {
  PlacingVerifierFake placing(verifier_.get());
  MakeBounced(Layout(2), /*depth=*/1, /*slot_bytes=*/2 * kFrame, &placing);
  const std::vector<ReadSource> items = PutInOrder(4);
  Seen seen[2];
  LayerReadResult results[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      results[t] = reader_->Read(LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame},
                                 PlacedRecorder(&seen[t]));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 2; ++t) {
    ASSERT_TRUE(results[t].status.ok()) << results[t].status;
    EXPECT_EQ(seen[t].served.size(), 4u * kObjects);
    EXPECT_EQ(seen[t].bad_bytes, 0);
  }
  EXPECT_EQ(bounce_->held(), 0u);
}

// Objects (rounded to 4 KiB) shorter than a frame: one I/O per object, as before merging.
TEST_F(LayerReaderTest, PartialFrameObjectsAreReadOneByOne) {
  Make(Layout(1, kObjects, 2 * kFrame), kFrame, 64 * kFrame);
  const std::vector<ReadSource> items = PutInOrder(3);
  Seen seen;
  ASSERT_TRUE(Read(items, &seen).status.ok());
  EXPECT_EQ(seen.bad_bytes, 0);
  EXPECT_EQ(reader_->counters().ios, 3u * kObjects);
  EXPECT_EQ(reader_->counters().merged_ios, 0u);
}

TEST_F(LayerReaderTest, DramItemsAndEarlyFailuresNeedNoIo) {
  Make(Layout(2), kFrame, 64 * kFrame);
  std::vector<uint8_t> dram(uint64_t{kObjects} * kFrame);
  for (uint32_t j = 0; j < kObjects; ++j) {
    for (uint32_t b = 0; b < kFrame; ++b) dram[j * kFrame + b] = ContentByte(0, j, b);
  }
  fake_->Put(1, 4);
  std::vector<ReadSource> items(3);
  items[0].from = ReadSource::From::kDram;
  items[0].dram = dram.data();
  items[1] = fake_->Source(1, 4);
  items[2].from = ReadSource::From::kFailed;
  Seen seen;
  seen.dram = dram;
  const LayerReadResult result = Read(items, &seen);
  ASSERT_TRUE(result.status.ok());
  EXPECT_EQ(seen.bad_bytes, 0);
  EXPECT_EQ(seen.from_dram, static_cast<int>(kObjects));
  EXPECT_EQ(seen.served.size(), 2u * kObjects);
  EXPECT_EQ(seen.failed[0], std::vector<uint32_t>{2});  // reported in the first layer only
  EXPECT_TRUE(seen.failed[1].empty());
  EXPECT_EQ(result.failures[2], ReadFailure::kBeforeRead);
  EXPECT_EQ(result.failures[0], ReadFailure::kNone);
  // Only item 1's objects were read.
  EXPECT_EQ(reader_->counters().objects, kObjects);
}

TEST_F(LayerReaderTest, AllFromDramTakesNoStaging) {
  Make(Layout(2), kFrame, 4096);
  std::vector<uint8_t> dram(uint64_t{kObjects} * kFrame);
  for (uint32_t j = 0; j < kObjects; ++j) {
    for (uint32_t b = 0; b < kFrame; ++b) dram[j * kFrame + b] = ContentByte(0, j, b);
  }
  std::vector<ReadSource> items(1);
  items[0].from = ReadSource::From::kDram;
  items[0].dram = dram.data();
  Seen seen;
  ASSERT_TRUE(Read(items, &seen).status.ok());
  EXPECT_EQ(seen.served.size(), kObjects);
  EXPECT_EQ(fake_->batches(), 0);
}

// Objects of half a frame (4 KiB in 8 KiB frames) are read one I/O each, so a failed I/O names one
// object of one item.
TEST_F(LayerReaderTest, IoErrorFailsTheItemOnceAndItIsNotReadAgain) {
  const pool::PoolLayout layout = Layout(2, kObjects, 2 * kFrame);
  Make(layout, kFrame, 64 * kFrame);
  const std::vector<ReadSource> items = PutInOrder(4);
  const pool::Location bad = layout.ObjectLocation(2, 1 * kParts + 1);  // item 2, layer 1, V
  fake_->fault = [bad](io::IoRequest& r) {
    if (r.file == bad.file && r.offset == bad.offset) r.result = -EIO;
  };
  Seen seen;
  const LayerReadResult result = Read(items, &seen);
  ASSERT_TRUE(result.status.ok());
  EXPECT_EQ(result.failures[2], ReadFailure::kIoError);
  EXPECT_EQ(seen.failed[1], std::vector<uint32_t>{2});
  EXPECT_TRUE(seen.failed[2].empty());
  // Item 2 served layer 0 only; the others every layer.
  EXPECT_EQ(seen.served.count({2, 0}), 1u);
  EXPECT_EQ(seen.served.count({2, 2}), 0u);  // layer 1's K is dropped with its failed V
  EXPECT_EQ(seen.served.count({2, 4}), 0u);
  EXPECT_EQ(seen.served.size(), 3u * kObjects + kParts);
  EXPECT_EQ(seen.bad_bytes, 0);
}

TEST_F(LayerReaderTest, FailedItemIsNotPostedInLaterWindows) {
  const pool::PoolLayout layout = Layout(2, kObjects, 2 * kFrame);  // one I/O per object
  Make(layout, kFrame, 2 * kParts * kFrame);  // one layer of two blocks: a window of one
  const std::vector<ReadSource> items = PutInOrder(2);
  const pool::Location bad = layout.ObjectLocation(1, 0);
  fake_->fault = [bad](io::IoRequest& r) {
    if (r.file == bad.file && r.offset == bad.offset) r.result = -EIO;
  };
  Seen seen;
  ASSERT_TRUE(Read(items, &seen).status.ok());
  EXPECT_EQ(seen.failed[0], std::vector<uint32_t>{1});
  EXPECT_EQ(fake_->batches(), static_cast<int>(kLayers));
  // Layer 0: both blocks; layers 1-3: block 0 only.
  EXPECT_EQ(fake_->posted.size(), 2u * kParts + (kLayers - 1) * kParts);
}

// Two files, two objects per block: file 0 holds slot 0's K, slot 1's V, slot 2's K, slot 3's V
// back to back, read in one I/O. Cut short after two frames, it serves those two and fails the
// blocks whose objects it did not cover.
TEST_F(LayerReaderTest, ShortMergedReadServesTheObjectsItCovered) {
  const pool::PoolLayout layout = Layout(2, kParts);
  ASSERT_EQ(layout.extent_slots(), 1u);
  Make(layout, kFrame, 64 * kFrame);
  const std::vector<ReadSource> items = PutInOrder(4);
  fake_->fault = [](io::IoRequest& r) {
    if (r.file == 0) r.result = 2 * kFrame;
  };
  Seen seen;
  LayerReadResult result =
      reader_->Read(LayerReadRequest{kNs, items, 0, 1, kParts, kFrame}, Recorder(&seen, kFrame));
  ASSERT_TRUE(result.status.ok());
  ASSERT_EQ(fake_->posted.size(), 2u);
  EXPECT_EQ(fake_->posted[0].len, 4 * kFrame);
  EXPECT_EQ(result.failures[0], ReadFailure::kNone);
  EXPECT_EQ(result.failures[1], ReadFailure::kNone);
  EXPECT_EQ(result.failures[2], ReadFailure::kShortRead);
  EXPECT_EQ(result.failures[3], ReadFailure::kShortRead);
  EXPECT_EQ(seen.failed[0], (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(seen.served.size(), 2u * kParts);
  EXPECT_EQ(seen.bad_bytes, 0);
}

TEST_F(LayerReaderTest, ChecksumMismatchFailsOnlyThatBlock) {
  Make(Layout(1), kFrame, 64 * kFrame);
  const std::vector<ReadSource> items = PutInOrder(3);
  fake_->Corrupt(1, 2 * kParts);  // slot 1, layer 2, K
  Seen seen;
  const LayerReadResult result = Read(items, &seen);
  ASSERT_TRUE(result.status.ok());
  EXPECT_EQ(result.failures[1], ReadFailure::kChecksum);
  EXPECT_EQ(seen.failed[2], std::vector<uint32_t>{1});
  EXPECT_EQ(seen.served.count({1, 2 * kParts}), 0u);
  EXPECT_EQ(seen.served.count({1, 2 * kParts + 1}), 0u);  // its V too: the block failed
  EXPECT_EQ(seen.served.count({1, 1 * kParts}), 1u);
  EXPECT_EQ(seen.bad_bytes, 0);
}

// The request's engine blocks name where each item's copies land.
TEST_F(LayerReaderTest, CopiesLandInTheRequestedEngineBlocks) {
  Make(Layout(2), kFrame, 64 * kFrame);
  const std::vector<ReadSource> items = PutInOrder(2);
  const std::vector<uint32_t> blocks = {9, 4};
  std::map<uint32_t, int> copies;  // engine block -> copies into it
  int bad_bytes = 0;
  const LayerReadResult result =
      reader_->Read(LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame, blocks},
                    [&](const LayerObjects& got) {
                      for (const engine::CopyOp& op : got.copies) {
                        ++copies[op.block];
                        const uint32_t item = op.block == blocks[0] ? 0 : 1;
                        for (uint32_t b = 0; b < kFrame; ++b) {
                          bad_bytes += op.staging[b] != ContentByte(item, op.object, b);
                        }
                      }
                      return absl::OkStatus();
                    });
  ASSERT_TRUE(result.status.ok()) << result.status;
  EXPECT_EQ(copies, (std::map<uint32_t, int>{{4, kObjects}, {9, kObjects}}));
  EXPECT_EQ(bad_bytes, 0);
}

TEST_F(LayerReaderTest, SinkErrorStopsTheReadAndReleasesStaging) {
  Make(Layout(2), kFrame, 64 * kFrame);
  fake_->Put(0, 0);
  std::vector<ReadSource> items{fake_->Source(0, 0)};
  std::vector<uint32_t> layers;
  const LayerReadResult result = reader_->Read(
      LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame}, [&](const LayerObjects& got) {
        layers.push_back(got.layer);
        return got.layer == 1 ? absl::CancelledError("gone") : absl::OkStatus();
      });
  EXPECT_EQ(result.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(layers, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(staging_->used_bytes(), 0u);
  EXPECT_EQ(result.failures[0], ReadFailure::kNone);
}

TEST_F(LayerReaderTest, LayerLargerThanStagingIsRefusedBeforeAnyIo) {
  Make(Layout(2), kFrame, 2 * kFrame);
  const std::vector<ReadSource> items = PutInOrder(2);
  Seen seen;
  const LayerReadResult result = Read(items, &seen);
  EXPECT_EQ(result.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(result.status.message().find("limits.retrieve_staging_bytes"), std::string::npos);
  EXPECT_EQ(fake_->batches(), 0);
  EXPECT_TRUE(seen.layers.empty());
}

// The window is as deep as free staging allows, at most four layers.
TEST_F(LayerReaderTest, WindowHoldsAsManyLayersAsStagingAllows) {
  for (uint32_t layers_of_staging : {1u, 2u, 4u, 8u}) {
    Make(Layout(2), kFrame, layers_of_staging * kParts * kFrame);
    fake_->Put(0, 0);
    std::vector<ReadSource> items{fake_->Source(0, 0)};
    std::vector<int> posted_at_sink;
    reader_->Read(LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame},
                  [&](const LayerObjects&) {
                    posted_at_sink.push_back(fake_->batches());
                    return absl::OkStatus();
                  });
    EXPECT_EQ(posted_at_sink[0], static_cast<int>(std::min(layers_of_staging, kLayers)))
        << layers_of_staging;
    EXPECT_EQ(posted_at_sink.back(), static_cast<int>(kLayers));
  }
}

// A Read that holds all the staging gives a lease back once a layer is done while another Read
// waits for staging: the second Read runs to its end while the first is still mid-way, instead of
// waiting for the first to end.
TEST_F(LayerReaderTest, AReadGivesStagingBackToAReadWaitingForIt) {
  Make(Layout(2), kFrame, kLayers * kParts * kFrame);  // one block's every layer: all of it
  const std::vector<ReadSource> items = PutInOrder(1);
  absl::Notification second_done;
  Seen first, second;
  LayerReadResult second_result;
  std::thread waiting;
  bool second_ended_mid_way = false;
  LayerReader::Sink record = Recorder(&first, kFrame);
  const LayerReadResult first_result = reader_->Read(
      LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame}, [&](const LayerObjects& layer) {
        if (layer.layer == 0) {
          waiting = std::thread([&] {
            second_result = Read(items, &second);
            second_done.Notify();
          });
          const absl::Time deadline = absl::Now() + absl::Seconds(10);
          while (!staging_->HasWaiters() && absl::Now() < deadline) {
            absl::SleepFor(absl::Milliseconds(1));
          }
          EXPECT_TRUE(staging_->HasWaiters()) << "the second Read should wait for staging";
        }
        if (layer.layer == 2) {
          second_ended_mid_way = second_done.WaitForNotificationWithTimeout(absl::Seconds(10));
        }
        return record(layer);
      });
  waiting.join();
  EXPECT_TRUE(second_ended_mid_way) << "the second Read waited for the first one's end";
  ASSERT_TRUE(first_result.status.ok()) << first_result.status;
  ASSERT_TRUE(second_result.status.ok()) << second_result.status;
  EXPECT_EQ(first.served.size(), kObjects);
  EXPECT_EQ(second.served.size(), kObjects);
  EXPECT_EQ(first.bad_bytes, 0);
  EXPECT_EQ(second.bad_bytes, 0);
  EXPECT_GE(reader_->counters().staging_yields, 1u);
  EXPECT_EQ(reader_->counters().staging_waits, 1u);
  EXPECT_EQ(staging_->used_bytes(), 0u);
}

// With staging for three layers or more, a layer's objects stay valid until the sink's next call
// returns (the engine copy may still read them): the reader posts into that staging only after.
// With one or two layers of staging they are valid only during the call.
TEST_F(LayerReaderTest, StagingStaysUntilTheNextSinkCallReturns) {
  for (uint32_t layers_of_staging : {1u, 2u, 3u, 4u}) {
    Make(Layout(2), kFrame, layers_of_staging * 2 * kParts * kFrame);
    std::vector<ReadSource> items;
    for (uint32_t i = 0; i < 2; ++i) {
      fake_->Put(i, i);
      items.push_back(fake_->Source(i, i));
    }
    std::vector<engine::CopyOp> previous;
    int stale = 0, stays = 0, calls = 0;
    LayerReadResult result = reader_->Read(
        LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame}, [&](const LayerObjects& got) {
          for (const engine::CopyOp& op : previous) {  // still what the previous call was given
            for (uint32_t b = 0; b < kFrame; ++b)
              stale += op.staging[b] != ContentByte(op.block, op.object, b);
          }
          previous.assign(got.copies.begin(), got.copies.end());
          if (got.stays) stays += static_cast<int>(got.copies.size());
          ++calls;
          return absl::OkStatus();
        });
    ASSERT_TRUE(result.status.ok()) << layers_of_staging;
    ASSERT_EQ(calls, static_cast<int>(kLayers));
    if (layers_of_staging < 3) {
      EXPECT_EQ(stays, 0) << layers_of_staging;
      EXPECT_GT(stale, 0) << layers_of_staging;  // read into again before the next call
    } else {
      EXPECT_EQ(stays, static_cast<int>(kLayers * 2 * kParts)) << layers_of_staging;
      EXPECT_EQ(stale, 0) << layers_of_staging;
    }
  }
}

// Through the memory backend: completions on its thread, injected I/O errors and short reads.
TEST(LayerReaderBackendTest, ReadsThroughMemoryBackendWithFaults) {
  const pool::PoolLayout layout = Layout(2);
  auto backend = io::MemoryBackend::Create({layout.file_bytes(), layout.file_bytes()});
  ASSERT_TRUE(backend.ok());
  io::MemoryBackend& b = **backend;
  std::vector<std::vector<uint64_t>> sums(6, std::vector<uint64_t>(kObjects));
  Memory page(kFrame);
  for (uint32_t i = 0; i < 6; ++i) {
    for (uint32_t j = 0; j < kObjects; ++j) {
      for (uint32_t x = 0; x < kFrame; ++x) page.data[x] = ContentByte(i, j, x);
      sums[i][j] = pool::ObjectChecksum(kNs, KeyOf(i), 1, j, page.data, kFrame);
      const pool::Location loc = layout.ObjectLocation(i, j);
      io::IoRequest w{io::Op::kWrite, loc.file, loc.offset, page.data, kFrame, 0};
      b.Execute(absl::MakeSpan(&w, 1));
      ASSERT_EQ(w.result, kFrame);
    }
  }
  std::vector<ReadSource> items(6);
  for (uint32_t i = 0; i < 6; ++i) {
    items[i].slot = i;
    items[i].key = KeyOf(i);
    items[i].epoch = 1;
    items[i].checksums = sums[i];
  }
  Memory staging_memory(64 * kFrame);
  StagingPool staging(absl::MakeSpan(staging_memory.data, staging_memory.size));
  WorkPool checks(2, "checks");
  std::unique_ptr<Verifier> verifier = MakeCpuVerifier(&checks);
  LayerReader reader(LayerReaderOptions{layout, 1u << 20, 4}, &staging, verifier.get(),
                     [&b](uint64_t, absl::Span<io::IoRequest> batch, std::function<void()> done) {
                       b.Submit(batch, std::move(done));
                     });
  b.disk().FailNext(1, io::Op::kRead, 1, EIO);
  Seen seen;
  const LayerReadResult result = reader.Read(
      LayerReadRequest{kNs, items, 0, kLayers, kParts, kFrame}, Recorder(&seen, kFrame));
  ASSERT_TRUE(result.status.ok());
  EXPECT_EQ(seen.bad_bytes, 0);
  // Layer 0's first read of file 1 failed: the items it carried failed, the others were served.
  int failed = 0;
  for (ReadFailure f : result.failures) failed += f == ReadFailure::kIoError;
  EXPECT_GE(failed, 1);
  EXPECT_EQ(seen.failed[0].size(), static_cast<size_t>(failed));
  EXPECT_EQ(seen.served.size(), (6u - failed) * kObjects);
  EXPECT_EQ(staging.used_bytes(), 0u);
}

}  // namespace
}  // namespace tutti::datapath

// LayerCopier's logic on a HostDevice (gpu/host_device.h): no GPU, so it runs in CI. The engine's
// regions, the GPU staging slots and the ready words are host memory; every byte that lands is
// checked against the placements, and the device's counts say which way the copies went.
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "daemon/gpu/layer_copier.h"
#include "daemon/gpu/testing/kv_layout.h"
#include "gpu/host_device.h"
#include "gpu/testing/test_util.h"
#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

using Mode = LayerCopier::Mode;
using Op = HostDevice::Op;
using testing::KvFormat;

constexpr uint8_t kPoison = 0x5a;
constexpr uint32_t kLayers = 3, kBlocks = 96, kObj = 64 * 1024, kLayer = 1;

// One engine on a host device: its regions (poisoned), staging, the copier, the engine memory and
// the ready words.
class Rig {
 public:
  // `gap(i)`: bytes of staging left free after object i (ops are laid out in order).
  Rig(const LayerCopier::Options& options, bool registered, uint32_t used,
      uint64_t (*gap)(uint32_t), bool chunked = false)
      : kv_(testing::MakeKvLayout(KvFormat::kFusedKv, kLayers, kBlocks, kObj)) {
    for (uint64_t size : kv_.region_sizes) {
      auto p = device_.Allocate(size, "region");
      EXPECT_TRUE(p.ok());
      std::memset(*p, kPoison, size);
      regions_.push_back(*p);
      local_.push_back({*p, size});
    }
    // Chunked: as the DRAM tier holds blocks, one chunk per block (all its layers' objects), at
    // a constant distance with a hole after every seventh.
    const uint64_t chunk = uint64_t{kLayers} * 2 * kObj;
    uint64_t bytes = chunked ? (used + used / 7 + 1) * chunk : 0;
    for (uint32_t i = 0; !chunked && i < 2 * used; ++i) bytes += kObj + gap(i);
    uint8_t* base = nullptr;
    if (registered) {
      pinned_ = std::move(device_.AllocatePinned(bytes)).value();
      base = pinned_->host();
      registered_.push_back({base, bytes, base});
    } else {
      heap_.resize(bytes + 16);
      base = heap_.data() + (16 - reinterpret_cast<uintptr_t>(heap_.data()) % 16) % 16;
    }
    const std::vector<uint32_t> blocks = testing::RandomBlocks(7, used, kBlocks);
    uint8_t* next = base;
    for (uint32_t i = 0; i < used; ++i) {
      for (uint32_t p = 0; p < 2; ++p) {
        const uint32_t obj = kLayer * 2 + p;
        if (chunked) next = base + (i + i / 7) * chunk + uint64_t{obj} * kObj;
        testing::FillObject(7, blocks[i], obj, next, kObj);
        ops_.push_back({blocks[i], obj, next});
        next += kObj + (chunked ? 0 : gap(i * 2 + p));
      }
    }
    for (const engine::CopyOp& op : ops_) originals_.emplace_back(op.staging, op.staging + kObj);
    copier_ = std::move(LayerCopier::Create(options, &device_, registered_)).value();
    memory_ = std::move(CudaIpcMemory::WrapLocal(kv_.layout, local_, copier_->staging_regions(),
                                                 &device_))
                  .value();
    words_ = reinterpret_cast<uint32_t*>(device_.Allocate(4 * (kLayers + 1), "words").value());
    std::memset(words_, 0, 4 * (kLayers + 1));
    ready_ = std::move(ReadyWords::WrapLocal(words_, kLayers + 1, &device_)).value();
  }
  ~Rig() {
    ready_.reset();
    memory_.reset();
    copier_.reset();
    for (void* p : regions_) device_.Free(p);
    device_.Free(words_);
  }

  absl::Status Scatter(uint32_t ticket, LayerCopier::Wait wait = LayerCopier::Wait::kLanded) {
    return copier_->ScatterLayer(memory_.get(), ops_, ready_.get(), kLayer, ticket, wait);
  }
  uint32_t word() const { return words_[kLayer]; }

  // Every engine byte: the ops' objects (from originals_) in layer kLayer, kPoison elsewhere.
  void ExpectLanded() const {
    std::vector<uint8_t> expect(kv_.region_sizes[kLayer], kPoison);
    for (size_t i = 0; i < ops_.size(); ++i) {
      const engine::ObjectPlacement& pl = kv_.layout.placements[ops_[i].object];
      std::memcpy(expect.data() + pl.offset + uint64_t{ops_[i].block} * pl.block_stride,
                  originals_[i].data(), kObj);
    }
    for (uint32_t r = 0; r < kLayers; ++r) {
      const uint8_t* got = static_cast<const uint8_t*>(regions_[r]);
      if (r == kLayer) {
        EXPECT_TRUE(std::equal(expect.begin(), expect.end(), got)) << "layer " << r << " differs";
      } else {
        EXPECT_EQ(std::count(got, got + kv_.region_sizes[r], kPoison),
                  static_cast<long>(kv_.region_sizes[r]))
            << "layer " << r << " was touched";
      }
    }
  }
  // Whether no engine byte has changed.
  bool Untouched() const {
    for (uint32_t r = 0; r < kLayers; ++r) {
      const uint8_t* got = static_cast<const uint8_t*>(regions_[r]);
      if (std::count(got, got + kv_.region_sizes[r], kPoison) !=
          static_cast<long>(kv_.region_sizes[r])) {
        return false;
      }
    }
    return true;
  }
  void Poison() {
    for (size_t r = 0; r < regions_.size(); ++r) {
      std::memset(regions_[r], kPoison, kv_.region_sizes[r]);
    }
  }

  HostDevice device_;  // first: outlives everything below
  testing::KvLayout kv_;
  std::vector<void*> regions_;
  std::vector<LocalRegion> local_;
  std::unique_ptr<Device::PinnedBuffer> pinned_;
  std::vector<uint8_t> heap_;
  std::vector<StagingRegion> registered_;
  std::vector<engine::CopyOp> ops_;
  std::vector<std::vector<uint8_t>> originals_;
  std::unique_ptr<LayerCopier> copier_;
  std::unique_ptr<CudaIpcMemory> memory_;
  uint32_t* words_ = nullptr;
  std::unique_ptr<ReadyWords> ready_;
};

// A 4 KiB gap after every third object: runs merge across it (kMaxGap) and break at slot ends.
uint64_t GapEveryThird(uint32_t i) { return i % 3 == 2 ? 4096 : 0; }
uint64_t NoGap(uint32_t) { return 0; }
uint64_t WideGap(uint32_t) { return 8192; }  // over kMaxGap: every object its own run

LayerCopier::Options Opts(Mode mode, uint64_t gpu_bytes = 8ull << 20, uint32_t bounce = 4,
                          uint64_t round = 0, bool strided = true) {
  LayerCopier::Options o;
  o.mode = mode;
  o.gpu_staging_bytes = gpu_bytes;
  o.bounce_threads = bounce;
  o.round_bytes = round;
  o.strided_copies = strided;
  return o;
}

struct Case {
  const char* name;
  LayerCopier::Options options;
  bool registered;
  bool chunked = false;
  bool overlap = false;  // both calls Wait::kPrevious, then Drain
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class HostCopierTest : public ::testing::TestWithParam<Case> {};

// Two calls (every slot used again: its words and bounce buffer recycled), every engine byte
// checked, the ready word written, and the way the bytes went.
TEST_P(HostCopierTest, ScattersLayerExactlyAndSignals) {
  const Case c = GetParam();
  Rig rig(c.options, c.registered, 40, GapEveryThird, c.chunked);
  const auto wait = c.overlap ? LayerCopier::Wait::kPrevious : LayerCopier::Wait::kLanded;
  ASSERT_TRUE(rig.Scatter(76, wait).ok());
  ASSERT_TRUE(rig.Scatter(77, wait).ok());
  ASSERT_TRUE(rig.copier_->Drain().ok());
  EXPECT_EQ(rig.word(), 77u);
  rig.ExpectLanded();

  const LayerCopier::Counters n = rig.copier_->counters();
  EXPECT_EQ(n.layers, 2u);
  const HostDevice& d = rig.device_;
  const uint64_t objects = 2 * rig.ops_.size();  // both calls
  const bool direct = c.registered;  // kCopyEngine: straight from staging, else through slots
  switch (c.options.mode) {
    case Mode::kStaged:
      EXPECT_EQ(d.kernel_objects(), objects);  // every object through a slot
      EXPECT_GT(d.count(Op::kCopyToDevice) + d.count(Op::kCopyToDevice2D), 0u);
      break;
    case Mode::kMapped:
      EXPECT_EQ(d.kernel_objects(), objects);
      if (c.registered) {
        EXPECT_EQ(d.count(Op::kCopyToDevice), 0u);  // read in place
      }
      break;
    case Mode::kCopyEngine:
      EXPECT_EQ(n.copy_engine_layers, 2u);
      EXPECT_EQ(d.copy_engine_objects(), direct ? objects : 0);
      EXPECT_EQ(d.kernel_objects(), direct ? 0 : objects);  // unregistered: staged
      break;
    case Mode::kAuto:
      EXPECT_GT(rig.copier_->idle_kernel_us(1 << 20), 0.0);
      // The first call's first round is timed; the second call reads it. The host device's
      // interval holds only the host's enqueueing (the copies run in the call), so a round is
      // slow only with a factor of 0.
      EXPECT_EQ(n.timed_rounds, 1u);
      EXPECT_EQ(n.copy_engine_layers, c.options.auto_slow_factor == 0 ? 1u : 0u);
      EXPECT_EQ(d.copy_engine_objects(), n.copy_engine_layers * rig.ops_.size());
      break;
  }
  if (c.chunked && c.options.strided_copies && c.options.mode == Mode::kStaged) {
    EXPECT_GT(d.count(Op::kCopyToDevice2D), 0u);
  }
  if (!c.options.strided_copies) {
    EXPECT_EQ(d.count(Op::kCopyToDevice2D), 0u);
  }
}

LayerCopier::Options AutoSlow() {
  LayerCopier::Options o = Opts(Mode::kAuto);
  o.auto_slow_factor = 0;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Modes, HostCopierTest,
    ::testing::Values(
        Case{"staged_one_slot", Opts(Mode::kStaged, 128ull << 20), true},
        // 2 MiB slots: 5 MiB of objects take three rounds.
        Case{"staged_rounds", Opts(Mode::kStaged), true},
        // 256 KiB rounds: 20 rounds a layer, each slot reused five times per call.
        Case{"staged_rotation", Opts(Mode::kStaged, 8ull << 20, 4, 256 << 10), true},
        Case{"staged_bounce4", Opts(Mode::kStaged), false},
        Case{"staged_bounce1", Opts(Mode::kStaged, 8ull << 20, 1), false},
        Case{"staged_pageable", Opts(Mode::kStaged, 8ull << 20, 0), false},
        Case{"staged_overlap", Opts(Mode::kStaged, 8ull << 20, 4, 256 << 10), true, false, true},
        Case{"chunks_strided", Opts(Mode::kStaged, 8ull << 20, 4, 1 << 20, true), true, true},
        Case{"chunks_per_run", Opts(Mode::kStaged, 8ull << 20, 4, 1 << 20, false), true, true},
        Case{"mapped", Opts(Mode::kMapped), true},
        Case{"mapped_unregistered", Opts(Mode::kMapped), false},
        Case{"copy_engine", Opts(Mode::kCopyEngine), true},
        Case{"copy_engine_unregistered", Opts(Mode::kCopyEngine), false},
        Case{"auto_at_speed", Opts(Mode::kAuto), true}, Case{"auto_slow", AutoSlow(), true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// Runs: objects at most kMaxGap apart in staging go as one copy; farther apart, one copy each.
TEST(HostCopierRunsTest, MergesNearObjectsAndSplitsFarOnes) {
  struct {
    uint64_t (*gap)(uint32_t);
    uint64_t runs;
  } const cases[] = {{NoGap, 1}, {GapEveryThird, 1}, {WideGap, 16}};
  for (const auto& c : cases) {
    Rig rig(Opts(Mode::kStaged, 8ull << 20, 4, 0, /*strided=*/false), true, 8, c.gap);
    ASSERT_TRUE(rig.Scatter(1).ok());
    EXPECT_EQ(rig.device_.count(Op::kCopyToDevice), c.runs);
    EXPECT_EQ(rig.device_.count(Op::kLaunchCopy), 1u);  // one round
    rig.ExpectLanded();
  }
  // Equal runs at a constant pitch: one 2D copy for all of them.
  Rig rig(Opts(Mode::kStaged, 8ull << 20, 4, 0, /*strided=*/true), true, 8, WideGap);
  ASSERT_TRUE(rig.Scatter(1).ok());
  EXPECT_EQ(rig.device_.count(Op::kCopyToDevice), 0u);
  EXPECT_EQ(rig.device_.count(Op::kCopyToDevice2D), 1u);
  rig.ExpectLanded();
}

// More rounds than slots: each slot's copy waits for its previous kernel (the host device fails
// a wait that could never end), and every round lands.
TEST(HostCopierRunsTest, RotatesSlotsOverManyRounds) {
  Rig rig(Opts(Mode::kStaged, 8ull << 20, 4, kObj), true, 10, NoGap);  // one object per round
  for (uint32_t t = 1; t <= 3; ++t) ASSERT_TRUE(rig.Scatter(t).ok()) << "call " << t;
  EXPECT_EQ(rig.device_.count(Op::kLaunchCopy), 3u * 20);
  EXPECT_EQ(rig.device_.count(Op::kWaitValue32), 2u * 3 * 20);
  EXPECT_EQ(rig.word(), 3u);
  rig.ExpectLanded();
}

// Objects a GPU verifier left in device memory are copied from there: their host bytes (now
// overwritten) must not land.
TEST(HostCopierRunsTest, DeviceCopiesWinOverHostStaging) {
  for (Mode mode : {Mode::kStaged, Mode::kCopyEngine}) {
    Rig rig(Opts(mode), true, 40, GapEveryThird);
    uint8_t* copies = rig.device_.Allocate(rig.ops_.size() * kObj, "copies").value();
    for (size_t i = 0; i < rig.ops_.size(); i += 2) {
      std::memcpy(copies + i * kObj, rig.ops_[i].staging, kObj);
      std::memset(rig.ops_[i].staging, 0xee, kObj);
      rig.ops_[i].device_copy = copies + i * kObj;
    }
    ASSERT_TRUE(rig.Scatter(5).ok());
    rig.ExpectLanded();
    rig.device_.Free(copies);
  }
}

// Lanes: each session's overlapped layers wait for its own previous layer only, and a session
// waiting for its layer to land holds up no other session's layer.
TEST(HostCopierLaneTest, AnOverlappedLayerWaitsForItsOwnLaneOnly) {
  Rig rig(Opts(Mode::kStaged), true, 8, NoGap);
  std::unique_ptr<LayerCopier::Lane> a = rig.copier_->NewLane().value();
  std::unique_ptr<LayerCopier::Lane> b = rig.copier_->NewLane().value();
  auto scatter = [&](uint32_t ticket, LayerCopier::Lane* lane) {
    return rig.copier_->ScatterLayer(rig.memory_.get(), rig.ops_, rig.ready_.get(), kLayer, ticket,
                                     LayerCopier::Wait::kPrevious, lane);
  };
  ASSERT_TRUE(scatter(1, a.get()).ok());
  const uint64_t syncs = rig.device_.count(Op::kSyncEvent);
  // b's first layer: nothing of b's before it; a's pending layer is not b's to wait for.
  ASSERT_TRUE(scatter(2, b.get()).ok());
  EXPECT_EQ(rig.device_.count(Op::kSyncEvent), syncs);
  ASSERT_TRUE(scatter(3, a.get()).ok());  // waits for a's first
  EXPECT_EQ(rig.device_.count(Op::kSyncEvent), syncs + 1);
  ASSERT_TRUE(rig.copier_->Drain(a.get()).ok());
  ASSERT_TRUE(rig.copier_->Drain(b.get()).ok());
  EXPECT_EQ(rig.device_.count(Op::kSyncEvent), syncs + 3);
  ASSERT_TRUE(rig.copier_->Drain(a.get()).ok());  // nothing pending: no wait
  EXPECT_EQ(rig.device_.count(Op::kSyncEvent), syncs + 3);
  EXPECT_EQ(rig.word(), 3u);
  rig.ExpectLanded();
}

TEST(HostCopierLaneTest, ALaneWaitingForItsLayerHoldsUpNoOtherLane) {
  Rig rig(Opts(Mode::kStaged), true, 8, NoGap);
  std::unique_ptr<LayerCopier::Lane> a = rig.copier_->NewLane().value();
  std::unique_ptr<LayerCopier::Lane> b = rig.copier_->NewLane().value();
  absl::Notification a_waiting, release;
  std::atomic<bool> first{true};
  // The first wait (a's layer) lasts until released, as a GPU still copying a large layer.
  rig.device_.SetSyncEventHook([&] {
    if (first.exchange(false)) {
      a_waiting.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(30));
    }
  });
  auto scatter = [&](uint32_t ticket, LayerCopier::Lane* lane) {
    return rig.copier_->ScatterLayer(rig.memory_.get(), rig.ops_, rig.ready_.get(), kLayer, ticket,
                                     LayerCopier::Wait::kLanded, lane);
  };
  absl::Status a_status, b_status;
  std::thread ta([&] { a_status = scatter(1, a.get()); });
  a_waiting.WaitForNotification();
  absl::Notification b_done;
  std::thread tb([&] {
    b_status = scatter(2, b.get());
    b_done.Notify();
  });
  const bool b_went = b_done.WaitForNotificationWithTimeout(absl::Seconds(10));
  release.Notify();
  ta.join();
  tb.join();
  EXPECT_TRUE(b_went) << "lane b's layer waited for lane a's to land";
  EXPECT_TRUE(a_status.ok()) << a_status;
  EXPECT_TRUE(b_status.ok()) << b_status;
  EXPECT_EQ(rig.word(), 2u);
  rig.ExpectLanded();
  rig.device_.SetSyncEventHook(nullptr);
}

struct FailCase {
  const char* name;
  LayerCopier::Options options;
  bool registered;
  Op op;
  uint64_t after;  // successful calls of `op` before the failing one, counted from the call
  bool chunked = false;
};

void PrintTo(const FailCase& c, std::ostream* os) { *os << c.name; }

class HostCopierFailureTest : public ::testing::TestWithParam<FailCase> {};

// A copy that fails: ScatterLayer returns its error, the ready word is not written, and the
// copier still works for the next layers: two of them, so every slot is used again (a slot whose
// words the failed round left behind would fail its next wait).
TEST_P(HostCopierFailureTest, ReturnsTheErrorAndMarksNothingReady) {
  const FailCase c = GetParam();
  Rig rig(c.options, c.registered, 40, GapEveryThird, c.chunked);
  ASSERT_TRUE(rig.Scatter(3).ok());
  EXPECT_EQ(rig.word(), 3u);
  rig.device_.FailOp(c.op, c.after, absl::InternalError("injected"));
  const absl::Status s = rig.Scatter(4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "injected");
  EXPECT_EQ(rig.word(), 3u) << "a failed layer was marked ready";
  rig.Poison();
  ASSERT_TRUE(rig.Scatter(5).ok());
  ASSERT_TRUE(rig.Scatter(6).ok());
  EXPECT_EQ(rig.word(), 6u);
  rig.ExpectLanded();
}

INSTANTIATE_TEST_SUITE_P(
    Ops, HostCopierFailureTest,
    ::testing::Values(
        // Staged, three rounds: the second round's copy in, and its kernel.
        FailCase{"staged_copy_in", Opts(Mode::kStaged, 8ull << 20, 4, 0, false), true,
                 Op::kCopyToDevice, 1},
        FailCase{"staged_kernel", Opts(Mode::kStaged), true, Op::kLaunchCopy, 1},
        FailCase{"strided_copy", Opts(Mode::kStaged, 8ull << 20, 4, 1 << 20), true,
                 Op::kCopyToDevice2D, 1, /*chunked=*/true},
        FailCase{"bounce_copy", Opts(Mode::kStaged), false, Op::kCopyToDevice, 1},
        FailCase{"pageable_copy", Opts(Mode::kStaged, 8ull << 20, 0), false, Op::kCopyToDevice, 1},
        FailCase{"mapped_kernel", Opts(Mode::kMapped), true, Op::kLaunchCopy, 0},
        FailCase{"copy_engine", Opts(Mode::kCopyEngine), true, Op::kCopyByCopyEngine, 0},
        // The slot words' own writes (two a round: copied on the copy stream, then consumed on
        // the I/O stream): the second round's copied word, and its consumed word.
        FailCase{"slot_copied_word", Opts(Mode::kStaged), true, Op::kWriteValue32, 2},
        FailCase{"slot_consumed_word", Opts(Mode::kStaged), true, Op::kWriteValue32, 3}),
    [](const ::testing::TestParamInfo<FailCase>& info) { return std::string(info.param.name); });

// The ready word's own write fails: the layer landed, but the error is returned.
TEST(HostCopierFailureTest, ReadyWordFailureIsReturned) {
  Rig rig(Opts(Mode::kMapped), true, 4, NoGap);
  rig.device_.FailOp(Op::kWriteValue32, 0, absl::InternalError("word"));
  EXPECT_EQ(rig.Scatter(9).message(), "word");
  EXPECT_EQ(rig.word(), 0u);
}

// An op outside the layout: INVALID_ARGUMENT before anything is enqueued.
TEST(HostCopierFailureTest, BadOpEnqueuesNothing) {
  Rig rig(Opts(Mode::kStaged), true, 8, NoGap);
  rig.ops_[3].block = kBlocks;
  EXPECT_EQ(rig.Scatter(1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.device_.count(Op::kCopyToDevice) + rig.device_.count(Op::kLaunchCopy), 0u);
  EXPECT_TRUE(rig.Untouched());
  EXPECT_EQ(rig.word(), 0u);
}

// Gather (stores): every op's engine object back into registered staging, by the kernel or the
// copy engines as the mode says.
TEST(HostCopierGatherTest, GathersExactly) {
  for (Mode mode : {Mode::kStaged, Mode::kMapped, Mode::kCopyEngine, Mode::kAuto}) {
    Rig rig(Opts(mode), true, 40, GapEveryThird);
    ASSERT_TRUE(rig.Scatter(1).ok());
    for (const engine::CopyOp& op : rig.ops_) std::memset(op.staging, 0, kObj);
    ASSERT_TRUE(rig.copier_->Gather(rig.memory_.get(), rig.ops_).ok());
    for (size_t i = 0; i < rig.ops_.size(); ++i) {
      EXPECT_EQ(std::memcmp(rig.ops_[i].staging, rig.originals_[i].data(), kObj), 0) << i;
    }
    const bool by_engines = mode == Mode::kCopyEngine || mode == Mode::kAuto;
    EXPECT_EQ(rig.copier_->counters().copy_engine_gathers, by_engines ? 1u : 0u);
  }
}

// Gather with checksums: each op with a sum gets XXH3 (seeded by its seed) of the object it
// copied, computed by the hash kernel after the copies; ops without one are left alone.
TEST(HostCopierGatherTest, GatherComputesTheChecksumsOfTheObjectsItCopies) {
  for (Mode mode : {Mode::kStaged, Mode::kCopyEngine}) {
    Rig rig(Opts(mode), true, 40, GapEveryThird);
    ASSERT_TRUE(rig.Scatter(1).ok());
    for (const engine::CopyOp& op : rig.ops_) std::memset(op.staging, 0, kObj);
    std::vector<engine::ObjectSum> sums(rig.ops_.size());
    for (size_t i = 0; i < rig.ops_.size(); ++i) {
      sums[i].seed = 1000 + i;
      if (i % 5 != 4) rig.ops_[i].sum = &sums[i];  // every fifth asks for none
    }
    ASSERT_TRUE(rig.copier_->Gather(rig.memory_.get(), rig.ops_).ok());
    for (size_t i = 0; i < rig.ops_.size(); ++i) {
      ASSERT_EQ(std::memcmp(rig.ops_[i].staging, rig.originals_[i].data(), kObj), 0) << i;
      EXPECT_EQ(sums[i].done, i % 5 != 4) << i;
      if (sums[i].done) {
        EXPECT_EQ(sums[i].value, XXH3_64bits_withSeed(rig.ops_[i].staging, kObj, 1000 + i)) << i;
      }
    }
    EXPECT_EQ(rig.device_.count(Op::kLaunchHash), 1u);
    EXPECT_EQ(rig.copier_->counters().summed_objects, rig.ops_.size() - rig.ops_.size() / 5);
    // The buffers are reused: a second gather allocates nothing more.
    const size_t live = rig.device_.live_allocations();
    for (auto& sum : sums) sum.done = false;
    ASSERT_TRUE(rig.copier_->Gather(rig.memory_.get(), rig.ops_).ok());
    EXPECT_TRUE(sums[0].done);
    EXPECT_EQ(rig.device_.live_allocations(), live);
  }
}

// A hash that cannot run leaves the sums not done (the caller computes them on the CPU); the
// gather itself succeeds and its bytes land.
TEST(HostCopierGatherTest, AFailedHashLeavesTheChecksumsToTheCaller) {
  Rig rig(Opts(Mode::kAuto), true, 16, NoGap);
  ASSERT_TRUE(rig.Scatter(1).ok());
  for (const engine::CopyOp& op : rig.ops_) std::memset(op.staging, 0, kObj);
  std::vector<engine::ObjectSum> sums(rig.ops_.size());
  for (size_t i = 0; i < rig.ops_.size(); ++i) rig.ops_[i].sum = &sums[i];
  rig.device_.FailOp(Op::kLaunchHash, 0, absl::InternalError("cudaErrorLaunchFailure (injected)"));
  ASSERT_TRUE(rig.copier_->Gather(rig.memory_.get(), rig.ops_).ok());
  for (size_t i = 0; i < rig.ops_.size(); ++i) {
    EXPECT_FALSE(sums[i].done) << i;
    EXPECT_EQ(std::memcmp(rig.ops_[i].staging, rig.originals_[i].data(), kObj), 0) << i;
  }
  EXPECT_EQ(rig.copier_->counters().sum_failures, 1u);
  EXPECT_EQ(rig.copier_->counters().summed_objects, 0u);
  ASSERT_TRUE(rig.copier_->Gather(rig.memory_.get(), rig.ops_).ok());  // the next one hashes
  EXPECT_TRUE(sums[0].done);
}

// The copier frees everything it allocated on the device.
TEST(HostCopierLifetimeTest, FreesWhatItAllocates) {
  HostDevice device;
  {
    auto copier = LayerCopier::Create(Opts(Mode::kAuto), &device, {});
    ASSERT_TRUE(copier.ok()) << copier.status();
    EXPECT_GT(device.live_allocations(), 0u);
  }
  EXPECT_EQ(device.live_allocations(), 0u);
}

}  // namespace
}  // namespace tutti::gpu

// The GPU-initiated read path end to end against the controller model: a real kernel on the GPU
// submits to a queue pair in host memory, the model (a host thread) serves it, the kernel
// scatters into device memory and writes ready words. Skips itself without a GPU.
#include "bench/nvme_gpu/gpu_queue.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "daemon/io/nvme/controller.h"
#include "daemon/io/nvme/model/controller_model.h"
#include "gpu/ready_words.h"
#include "gpu/testing/test_util.h"
#include "gtest/gtest.h"

namespace tutti::io::nvme::gpu {
namespace {

constexpr uint32_t kLba = 4096;
constexpr uint32_t kTicket = 77;

// Content of byte `i` of LBA `lba` (as 32-bit words): different in every word of the namespace.
uint32_t Word(uint64_t lba, uint32_t word) {
  return static_cast<uint32_t>(lba * 0x9E3779B1u) ^ (word * 0x85EBCA6Bu) ^ 0x5a5a5a5a;
}

struct Config {
  ModelOptions model;
  ControllerOptions controller;
  GpuQueueOptions queue;
};

Config Defaults() {
  Config s;
  s.model.namespace_blocks = 4096;  // 16 MiB
  s.controller.io_queue_depth = 64;
  s.queue.slots = 32;
  s.queue.slot_bytes = 64 * 1024;
  s.queue.timeout_ms = 300;
  return s;
}

// A plan of `layers` x `ios_per_layer` reads of `blocks` LBAs at random namespace places, each
// cut into two pieces that land in random, distinct engine chunks.
struct TestPlan {
  GpuPlan plan;
  uint64_t engine_bytes = 0;
};

TestPlan MakePlan(uint32_t layers, uint32_t ios_per_layer, uint32_t blocks, uint64_t ns_blocks,
                  uint32_t seed) {
  TestPlan t;
  t.plan.num_layers = layers;
  const uint32_t n = layers * ios_per_layer;
  const uint32_t half = blocks * kLba / 2;
  std::vector<uint32_t> chunks(2 * n);
  std::iota(chunks.begin(), chunks.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(chunks.begin(), chunks.end(), rng);
  // The first half of the namespace: tests put their faults in the second.
  std::uniform_int_distribution<uint64_t> lba(0, ns_blocks / 2 - blocks);
  for (uint32_t i = 0; i < n; ++i) {
    GpuReadIo io;
    io.slba = lba(rng);
    io.blocks = blocks;
    io.layer = i / ios_per_layer;
    io.first_piece = static_cast<uint32_t>(t.plan.pieces.size());
    io.num_pieces = 2;
    for (uint32_t k = 0; k < 2; ++k) {
      t.plan.pieces.push_back(GpuPiece{k * half, half, uint64_t{chunks[2 * i + k]} * half});
    }
    t.plan.ios.push_back(io);
  }
  t.engine_bytes = uint64_t{2 * n} * half;
  return t;
}

class GpuQueueTest : public ::testing::Test {
 protected:
  void SetUp() override { TUTTI_SKIP_WITHOUT_GPU(); }
  void TearDown() override {
    queue_.reset();
    if (engine_ != nullptr) cudaFree(engine_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    words_.reset();
    controller_.reset();
    model_.reset();
  }

  void Start(const Config& s) {
    auto model = ControllerModel::Create(s.model);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto* data = reinterpret_cast<uint32_t*>(model_->namespace_data());
    for (uint64_t b = 0; b < s.model.namespace_blocks; ++b) {
      for (uint32_t w = 0; w < kLba / 4; ++w) data[b * (kLba / 4) + w] = Word(b, w);
    }
    auto controller = Controller::Create(s.controller, model_.get(), model_.get());
    ASSERT_TRUE(controller.ok()) << controller.status();
    controller_ = std::move(*controller);
    auto queue = GpuQueue::Create(s.queue, controller_.get(), model_.get());
    ASSERT_TRUE(queue.ok()) << queue.status();
    queue_ = std::move(*queue);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }

  // Fresh engine memory and ready words for `t`, then the read.
  GpuReadOutcome Read(const TestPlan& t) {
    if (engine_ != nullptr) cudaFree(engine_);
    EXPECT_EQ(cudaMalloc(&engine_, t.engine_bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(engine_, 0, t.engine_bytes), cudaSuccess);
    auto words = ::tutti::gpu::ReadyWordArray::Create(0, t.plan.num_layers);
    EXPECT_TRUE(words.ok()) << words.status();
    words_ = std::move(*words);
    auto out = queue_->Read(t.plan, engine_, t.engine_bytes, words_->word(0), kTicket, stream_);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : GpuReadOutcome{};
  }

  // Every piece of every I/O that the outcome says landed holds the namespace's bytes; returns
  // how many I/Os were checked.
  size_t VerifyLanded(const TestPlan& t, const GpuReadOutcome& out) {
    std::vector<uint32_t> engine(t.engine_bytes / 4);
    EXPECT_EQ(cudaMemcpy(engine.data(), engine_, t.engine_bytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    size_t checked = 0;
    for (size_t i = 0; i < t.plan.ios.size(); ++i) {
      if (out.ios[i].state != kGpuIoDone) continue;
      const GpuReadIo& io = t.plan.ios[i];
      for (uint32_t k = 0; k < io.num_pieces; ++k) {
        const GpuPiece& p = t.plan.pieces[io.first_piece + k];
        for (uint32_t w = 0; w < p.len / 4; ++w) {
          uint64_t byte = p.src_offset + uint64_t{w} * 4;
          uint32_t want = Word(io.slba + byte / kLba, (byte % kLba) / 4);
          if (engine[p.dst_offset / 4 + w] != want) {
            ADD_FAILURE() << "I/O " << i << " piece " << k << " word " << w << ": "
                          << engine[p.dst_offset / 4 + w] << " != " << want;
            return checked;
          }
        }
      }
      ++checked;
    }
    return checked;
  }

  std::vector<uint32_t> Words(uint32_t n) {
    std::vector<uint32_t> w(n);
    EXPECT_EQ(cudaMemcpy(w.data(), words_->word(0), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return w;
  }

  std::unique_ptr<ControllerModel> model_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<GpuQueue> queue_;
  std::unique_ptr<::tutti::gpu::ReadyWordArray> words_;
  cudaStream_t stream_ = nullptr;
  uint8_t* engine_ = nullptr;
};

TEST_F(GpuQueueTest, ReadsPlanIntoEngineBlocksWithSgl) {
  Config s = Defaults();
  ASSERT_NO_FATAL_FAILURE(Start(s));
  ASSERT_EQ(queue_->bounce_descriptor().use_sgl, 1u);
  TestPlan t = MakePlan(4, 24, 8, s.model.namespace_blocks, 1);
  GpuReadOutcome out = Read(t);
  EXPECT_TRUE(out.ok());
  EXPECT_EQ(out.summary.done, 96u);
  EXPECT_EQ(out.summary.commands, 96u);
  EXPECT_EQ(out.summary.layers_ready, 4u);
  EXPECT_EQ(VerifyLanded(t, out), 96u);
  EXPECT_EQ(Words(4), std::vector<uint32_t>(4, kTicket));
  EXPECT_EQ(model_->counters().reads, 96u);
  for (uint32_t i = 0; i < 96; ++i) EXPECT_EQ(out.ios[i].order, i);  // completed in order
}

TEST_F(GpuQueueTest, ReadsWithPrpListsWhenTheControllerHasNoSgl) {
  Config s = Defaults();
  s.model.sgl = false;
  ASSERT_NO_FATAL_FAILURE(Start(s));
  ASSERT_EQ(queue_->bounce_descriptor().use_sgl, 0u);
  TestPlan t = MakePlan(3, 20, 16, s.model.namespace_blocks, 2);  // 64 KiB: a PRP list each
  GpuReadOutcome out = Read(t);
  EXPECT_TRUE(out.ok());
  EXPECT_EQ(VerifyLanded(t, out), 60u);
  EXPECT_EQ(Words(3), std::vector<uint32_t>(3, kTicket));
}

TEST_F(GpuQueueTest, CompletionsOutOfOrder) {
  Config s = Defaults();
  s.model.reorder = true;  // each fetched batch completes in reverse
  ASSERT_NO_FATAL_FAILURE(Start(s));
  TestPlan t = MakePlan(2, 100, 2, s.model.namespace_blocks, 3);
  GpuReadOutcome out = Read(t);
  EXPECT_TRUE(out.ok());
  EXPECT_EQ(VerifyLanded(t, out), 200u);
  EXPECT_EQ(Words(2), std::vector<uint32_t>(2, kTicket));
  uint32_t inversions = 0;  // a later I/O of the plan retired before an earlier one
  for (uint32_t i = 1; i < 200; ++i) inversions += out.ios[i].order < out.ios[i - 1].order;
  EXPECT_GT(inversions, 0u);
}

TEST_F(GpuQueueTest, WrapAroundAndPhaseFlipOverManyCommandsAndLaunches) {
  Config s = Defaults();
  s.controller.io_queue_depth = 16;
  s.queue.slots = 15;
  s.queue.slot_bytes = 4096;
  ASSERT_NO_FATAL_FAILURE(Start(s));
  uint32_t laps = 0;
  for (uint32_t launch = 0; launch < 3; ++launch) {  // the ring carries on across launches
    TestPlan t = MakePlan(5, 333, 1, s.model.namespace_blocks, 10 + launch);
    GpuReadOutcome out = Read(t);
    EXPECT_TRUE(out.ok()) << "launch " << launch;
    EXPECT_EQ(VerifyLanded(t, out), 1665u);
    EXPECT_EQ(Words(5), std::vector<uint32_t>(5, kTicket));
    laps += out.summary.cq_laps;
  }
  EXPECT_EQ(laps, 3u * 1665 / 16);  // 4995 completions on a 16-entry CQ
  EXPECT_EQ(model_->counters().reads, 4995u);
}

TEST_F(GpuQueueTest, ErrorStatusFailsItsIoAndLayerOnly) {
  Config s = Defaults();
  ASSERT_NO_FATAL_FAILURE(Start(s));
  TestPlan t = MakePlan(3, 10, 4, s.model.namespace_blocks, 4);
  const uint32_t bad = 13;  // layer 1
  t.plan.ios[bad].slba = 4000;
  FaultRule rule;
  rule.slba = 4000;
  rule.status = kStatusUnrecoveredRead;
  model_->AddFault(rule);
  t.plan.ios[25].slba = s.model.namespace_blocks - 2;  // layer 2: past the end of the namespace
  GpuReadOutcome out = Read(t);
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(out.ios[bad].state, kGpuIoFailed);
  EXPECT_EQ(out.ios[bad].status, kStatusUnrecoveredRead);
  EXPECT_EQ(out.ios[25].state, kGpuIoFailed);
  EXPECT_EQ(out.ios[25].status, kStatusLbaOutOfRange);
  EXPECT_EQ(out.summary.failed, 2u);
  EXPECT_EQ(VerifyLanded(t, out), 28u);
  EXPECT_EQ(Words(3), (std::vector<uint32_t>{kTicket, 0, 0}));
  EXPECT_EQ(out.layer_ready, (std::vector<bool>{true, false, false}));
  EXPECT_FALSE(out.summary.gave_up);
}

TEST_F(GpuQueueTest, StallTimesOutOnTheGpuAndAbortRecoversTheQueue) {
  Config s = Defaults();
  ASSERT_NO_FATAL_FAILURE(Start(s));
  TestPlan t = MakePlan(2, 40, 2, s.model.namespace_blocks, 5);
  t.plan.ios[5].slba = 3000;
  FaultRule rule;
  rule.slba = 3000;
  rule.action = FaultAction::kStall;
  model_->AddFault(rule);
  GpuReadOutcome out = Read(t);
  EXPECT_TRUE(out.summary.gave_up);
  EXPECT_EQ(out.ios[5].state, kGpuIoTimedOut);
  EXPECT_EQ(out.summary.timed_out, 1u);
  EXPECT_EQ(out.summary.done, 79u);  // everything else landed while it waited
  EXPECT_EQ(out.aborted, 1u);
  EXPECT_FALSE(out.reset);
  EXPECT_EQ(model_->counters().aborts, 1u);
  EXPECT_EQ(controller_->resets(), 0u);
  EXPECT_EQ(Words(2), (std::vector<uint32_t>{0, kTicket}));
  // The queue carries on after the Abort's completion was drained by the host.
  TestPlan again = MakePlan(2, 40, 2, s.model.namespace_blocks, 6);
  GpuReadOutcome next = Read(again);
  EXPECT_TRUE(next.ok());
  EXPECT_EQ(VerifyLanded(again, next), 80u);
}

TEST_F(GpuQueueTest, LostCompletionResetsTheControllerAndTheQueueCarriesOn) {
  Config s = Defaults();
  ASSERT_NO_FATAL_FAILURE(Start(s));
  TestPlan t = MakePlan(1, 20, 2, s.model.namespace_blocks, 7);
  t.plan.ios[3].slba = 2500;
  FaultRule rule;
  rule.slba = 2500;
  rule.action = FaultAction::kDropCompletion;  // nothing for Abort to abort
  model_->AddFault(rule);
  GpuReadOutcome out = Read(t);
  EXPECT_TRUE(out.summary.gave_up);
  EXPECT_EQ(out.ios[3].state, kGpuIoTimedOut);
  EXPECT_TRUE(out.reset);
  EXPECT_EQ(controller_->resets(), 1u);
  EXPECT_EQ(Words(1), std::vector<uint32_t>{0});
  TestPlan again = MakePlan(2, 50, 2, s.model.namespace_blocks, 8);
  GpuReadOutcome next = Read(again);
  EXPECT_TRUE(next.ok());
  EXPECT_EQ(VerifyLanded(again, next), 100u);
}

TEST_F(GpuQueueTest, IoTooLargeForASlotIsReportedNotSent) {
  Config s = Defaults();
  ASSERT_NO_FATAL_FAILURE(Start(s));
  TestPlan t = MakePlan(2, 4, 2, s.model.namespace_blocks, 9);
  t.plan.ios[6].blocks = 32;  // 128 KiB > 64 KiB slots
  GpuReadOutcome out = Read(t);
  EXPECT_EQ(out.ios[6].state, kGpuIoBadRequest);
  EXPECT_EQ(out.summary.commands, 7u);
  EXPECT_EQ(Words(2), (std::vector<uint32_t>{kTicket, 0}));
}

TEST_F(GpuQueueTest, PlanOutsideTheEngineMemoryIsRefused) {
  Config s = Defaults();
  ASSERT_NO_FATAL_FAILURE(Start(s));
  TestPlan t = MakePlan(1, 4, 2, s.model.namespace_blocks, 9);
  t.plan.pieces[3].dst_offset = t.engine_bytes;  // one past the end
  auto out = queue_->Read(t.plan, nullptr, t.engine_bytes, nullptr, 1, stream_);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
}

// I/O-memory doorbells (BAR0 through vfio) cannot be had here: host memory is not I/O memory,
// and without root or the open module the check refuses first. Either way: the reason, to fall
// back with.
TEST_F(GpuQueueTest, IoMemoryDoorbellsFallBackWithTheReason) {
  Config s = Defaults();
  auto model = ControllerModel::Create(s.model);
  ASSERT_TRUE(model.ok());
  model_ = std::move(*model);
  auto controller = Controller::Create(s.controller, model_.get(), model_.get());
  ASSERT_TRUE(controller.ok()) << controller.status();
  controller_ = std::move(*controller);
  s.queue.doorbells = DoorbellMemory::kIoMemory;
  auto queue = GpuQueue::Create(s.queue, controller_.get(), model_.get());
  ASSERT_EQ(queue.status().code(), absl::StatusCode::kFailedPrecondition) << queue.status();
  EXPECT_NE(queue.status().message().find("GPU doorbells"), absl::string_view::npos)
      << queue.status();
  std::cout << "fallback reason: " << queue.status().message() << "\n";
}

}  // namespace
}  // namespace tutti::io::nvme::gpu

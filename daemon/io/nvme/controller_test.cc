// The controller driver and its queue pairs against the software controller model: bring-up,
// Identify, data round trips through PRPs and SGLs, ring wrap-around, errors per request, the
// timeout -> Abort -> reset ladder, fatal status recovery, Flush and shutdown.
#include "daemon/io/nvme/controller.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/clock.h"
#include "daemon/io/nvme/model/controller_model.h"
#include "daemon/io/nvme/queue_pair.h"
#include "gtest/gtest.h"

namespace tutti::io::nvme {
namespace {

constexpr uint32_t kBlock = 4096;

class ControllerTest : public ::testing::Test {
 protected:
  void Start(ModelOptions mo = {}, ControllerOptions co = {}) {
    model_ = ControllerModel::Create(mo).value();
    if (co.clock == nullptr) co.clock = &clock_;
    auto c = Controller::Create(co, model_.get(), model_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    controller_ = std::move(c).value();
    buffer_ = model_->Allocate(8 << 20).value();
    auto r = controller_->Register(*buffer_);
    ASSERT_TRUE(r.ok()) << r.status();
    region_ = std::move(r).value();
  }
  void TearDown() override {
    region_.reset();
    buffer_.reset();
    controller_.reset();
  }
  QueuePair* qp() { return controller_->queue_pair(0); }
  NvmeRequest Io(NvmeOp op, uint64_t lba, uint32_t blocks, uint64_t offset) {
    NvmeRequest r;
    r.op = op;
    r.lba = lba;
    r.blocks = blocks;
    r.region = region_.get();
    r.offset = offset;
    return r;
  }
  void Fill(uint64_t offset, uint64_t len, uint32_t seed) {
    for (uint64_t i = 0; i < len; ++i)
      buffer_->host()[offset + i] = static_cast<uint8_t>(seed + i * 31 + i / 4096);
  }
  bool Check(uint64_t offset, uint64_t len, uint32_t seed) {
    for (uint64_t i = 0; i < len; ++i) {
      if (buffer_->host()[offset + i] != static_cast<uint8_t>(seed + i * 31 + i / 4096))
        return false;
    }
    return true;
  }
  // Polls until `pred` holds (real-time bound only against a hang, never for synchronisation).
  template <typename Pred>
  bool PollUntil(Pred pred) {
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!pred()) {
      qp()->Poll();
      if (std::chrono::steady_clock::now() > end) return false;
    }
    return true;
  }

  ManualClock clock_{1000};
  std::unique_ptr<ControllerModel> model_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<DmaBuffer> buffer_;
  std::unique_ptr<RegisteredRegion> region_;
};

TEST_F(ControllerTest, BringUpAndIdentify) {
  ModelOptions mo;
  mo.namespace_blocks = 5000;
  mo.mdts = 4;
  mo.max_io_queues = 3;
  mo.volatile_write_cache = false;
  mo.sgl = false;
  ControllerOptions co;
  co.io_queues = 4;  // more than granted
  co.io_queue_depth = 64;
  Start(mo, co);
  const ControllerInfo& info = controller_->info();
  EXPECT_EQ(info.serial, "TUTTIMODEL0001");
  EXPECT_EQ(info.model, "tutti nvme controller model");
  EXPECT_EQ(info.firmware, "1.0");
  EXPECT_EQ(info.version, 0x00010400u);
  EXPECT_EQ(info.mdts_bytes, 64u << 10);
  EXPECT_EQ(info.max_queue_entries, 1024u);
  EXPECT_EQ(info.ready_timeout_ms, 1000u);
  EXPECT_FALSE(info.volatile_write_cache);
  EXPECT_FALSE(info.sgl);
  EXPECT_FALSE(controller_->uses_sgl());
  EXPECT_EQ(controller_->max_transfer(), 64u << 10);
  EXPECT_EQ(controller_->ns().blocks, 5000u);
  EXPECT_EQ(controller_->ns().lba_size(), 4096u);
  EXPECT_EQ(controller_->num_queue_pairs(), 3u);
  EXPECT_EQ(qp()->depth(), 64u);
  EXPECT_EQ(model_->Read32(kRegCsts) & kCstsReady, kCstsReady);
  EXPECT_NE(region_->list_bytes(), 0u) << "PRP lists built at registration";
}

TEST_F(ControllerTest, BringUpFailsForAMissingNamespace) {
  model_ = ControllerModel::Create(ModelOptions{}).value();
  ControllerOptions co;
  co.nsid = 2;
  co.clock = &clock_;
  auto c = Controller::Create(co, model_.get(), model_.get());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(
      c.status().message().find("Identify Namespace 2 failed: SCT 0 SC 0xb (Invalid Namespace"),
      std::string::npos)
      << c.status();
}

class RoundTripTest : public ControllerTest, public ::testing::WithParamInterface<bool> {};

// Writes from one part of the region, reads into another, both through the descriptor form the
// parameter picks; checks the bytes on the "media" and back in memory. Transfers cross pages, list
// windows and use every size up to max_transfer.
TEST_P(RoundTripTest, DataSurvivesWriteThenRead) {
  ModelOptions mo;
  mo.sgl = GetParam();
  mo.lba_shift = 9;
  mo.doorbell_stride = 2;
  Start(mo);
  ASSERT_EQ(controller_->uses_sgl(), GetParam());
  std::vector<NvmeRequest> writes, reads;
  uint64_t lba = 0, off = 0;
  for (uint32_t pages = 1; pages <= 32; ++pages) {
    uint64_t shift = pages % 2 == 0 ? 512 : 0;  // PRP1 with an offset into its page
    uint32_t blocks = pages * 8 - (shift != 0 ? 1 : 0);
    if (pages == 32) blocks = 256;  // exactly max_transfer
    Fill(off + shift, blocks * 512, pages);
    writes.push_back(Io(NvmeOp::kWrite, lba, blocks, off + shift));
    lba += blocks;
    off += pages * kBlock;
  }
  ASSERT_LE(off, 4u << 20);
  qp()->Execute(absl::MakeSpan(writes));
  for (const auto& w : writes) ASSERT_EQ(w.result, int64_t{w.blocks} * 512) << w.lba;
  // The media holds what was written (the model's namespace, 512-byte LBAs).
  EXPECT_EQ(std::memcmp(model_->namespace_data() + writes[5].lba * 512,
                        buffer_->host() + writes[5].offset, writes[5].blocks * 512),
            0);
  std::memset(buffer_->host(), 0, buffer_->size());
  for (const auto& w : writes)
    reads.push_back(Io(NvmeOp::kRead, w.lba, w.blocks, w.offset + (4 << 20)));
  qp()->Execute(absl::MakeSpan(reads));
  for (size_t i = 0; i < reads.size(); ++i) {
    ASSERT_EQ(reads[i].result, int64_t{reads[i].blocks} * 512);
    EXPECT_TRUE(Check(reads[i].offset, reads[i].blocks * 512, i + 1)) << "pages " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(PrpAndSgl, RoundTripTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Sgl" : "Prp"; });

// 2000 commands through an 8-entry queue pair: the SQ tail and CQ head wrap ~250 times and the
// phase flips each lap; with reordering the controller completes each fetched batch backwards.
class WrapTest : public ControllerTest, public ::testing::WithParamInterface<bool> {};

TEST_P(WrapTest, ManyMoreCommandsThanTheQueueDepth) {
  ModelOptions mo;
  mo.reorder = GetParam();
  ControllerOptions co;
  co.io_queue_depth = 8;
  Start(mo, co);
  for (uint32_t i = 0; i < 512; ++i) Fill(i * kBlock, kBlock, i);
  std::vector<NvmeRequest> batch;
  for (uint32_t i = 0; i < 512; ++i) batch.push_back(Io(NvmeOp::kWrite, i, 1, i * kBlock));
  qp()->Execute(absl::MakeSpan(batch));
  for (const auto& r : batch) ASSERT_EQ(r.result, kBlock);
  std::memset(buffer_->host(), 0, buffer_->size());
  for (int round = 0; round < 3; ++round) {
    batch.clear();
    for (uint32_t i = 0; i < 512; ++i)
      batch.push_back(Io(NvmeOp::kRead, 511 - i, 1, (511 - i) * kBlock));
    qp()->Execute(absl::MakeSpan(batch));
    for (const auto& r : batch) ASSERT_EQ(r.result, kBlock);
  }
  for (uint32_t i = 0; i < 512; ++i) ASSERT_TRUE(Check(i * kBlock, kBlock, i)) << i;
  EXPECT_EQ(model_->counters().reads, 3u * 512);
  EXPECT_EQ(qp()->in_flight(), 0u);
}

INSTANTIATE_TEST_SUITE_P(InOrderAndReordered, WrapTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Reordered" : "InOrder"; });

// A batch in which some requests fail: each one's own result says so, the others complete.
TEST_F(ControllerTest, ErrorsAndPartialCompletionReachTheRightRequests) {
  ModelOptions mo;
  mo.reorder = true;
  Start(mo);
  model_->AddFault(FaultRule{false, kNvmRead, 3, FaultAction::kStatus, kStatusUnrecoveredRead, 1});
  std::vector<NvmeRequest> batch;
  for (uint32_t i = 0; i < 8; ++i) batch.push_back(Io(NvmeOp::kRead, i, 1, i * kBlock));
  batch[5].lba = controller_->ns().blocks - 1;  // runs past the namespace's end
  batch[5].blocks = 2;
  batch[6].offset = buffer_->size();  // not inside the region: cannot be encoded
  qp()->Execute(absl::MakeSpan(batch));
  for (uint32_t i = 0; i < 8; ++i) {
    if (i == 3) {
      EXPECT_EQ(batch[i].result, -EIO);
      EXPECT_EQ(batch[i].status, kStatusUnrecoveredRead);
    } else if (i == 5) {
      EXPECT_EQ(batch[i].result, -EINVAL);
      EXPECT_EQ(batch[i].status, kStatusLbaOutOfRange);
    } else if (i == 6) {
      EXPECT_EQ(batch[i].result, -EINVAL);
      EXPECT_EQ(batch[i].status, 0) << "never reached the controller";
    } else {
      EXPECT_EQ(batch[i].result, kBlock) << i;
      EXPECT_EQ(batch[i].status, 0);
    }
  }
}

// Partial completion: while one command stalls, the rest of its batch completes and is reported.
TEST_F(ControllerTest, StallTimesOutAndIsAborted) {
  ControllerOptions co;
  co.io_timeout_ms = 1000;
  Start({}, co);
  model_->AddFault(FaultRule{false, kNvmWrite, 4, FaultAction::kStall, 0, 1});
  std::vector<NvmeRequest> batch;
  for (uint32_t i = 0; i < 8; ++i) batch.push_back(Io(NvmeOp::kWrite, i, 1, i * kBlock));
  qp()->Submit(absl::MakeSpan(batch));
  ASSERT_TRUE(PollUntil([&] { return qp()->in_flight() == 1; }));
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(batch[i].done, i != 4) << i;
  clock_.AdvanceMs(999);
  qp()->Poll();
  EXPECT_FALSE(batch[4].done) << "not yet timed out";
  clock_.AdvanceMs(1);
  ASSERT_TRUE(PollUntil([&] { return batch[4].done; }));
  EXPECT_EQ(batch[4].result, -ETIMEDOUT);
  EXPECT_EQ(batch[4].status, kStatusAbortRequested);
  EXPECT_EQ(model_->counters().aborts, 1u);
  EXPECT_EQ(controller_->resets(), 0u) << "Abort sufficed";
  NvmeRequest again = Io(NvmeOp::kWrite, 4, 1, 4 * kBlock);
  qp()->Execute(absl::MakeSpan(&again, 1));
  EXPECT_EQ(again.result, kBlock);
}

// A lost completion: Abort finds nothing to abort; a timeout later the controller is reset, the
// command fails with -ETIMEDOUT and the re-created queues serve I/O.
TEST_F(ControllerTest, DroppedCompletionEndsInReset) {
  ControllerOptions co;
  co.io_timeout_ms = 500;
  Start({}, co);
  model_->AddFault(FaultRule{false, kNvmRead, 2, FaultAction::kDropCompletion, 0, 1});
  NvmeRequest r = Io(NvmeOp::kRead, 2, 1, 0);
  qp()->Submit(absl::MakeSpan(&r, 1));
  ASSERT_TRUE(PollUntil([&] { return model_->counters().reads == 1; }));
  clock_.AdvanceMs(500);
  qp()->Poll();  // Abort: "not aborted"
  EXPECT_FALSE(r.done);
  EXPECT_EQ(controller_->resets(), 0u);
  clock_.AdvanceMs(500);
  qp()->Poll();
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.result, -ETIMEDOUT);
  EXPECT_EQ(controller_->resets(), 1u);
  EXPECT_EQ(model_->counters().resets, 1u);
  NvmeRequest after = Io(NvmeOp::kRead, 2, 1, 0);
  qp()->Execute(absl::MakeSpan(&after, 1));
  EXPECT_EQ(after.result, kBlock);
}

TEST_F(ControllerTest, RefusedAbortResets) {
  ControllerOptions co;
  co.io_timeout_ms = 100;
  Start({}, co);
  model_->AddFault(FaultRule{false, kNvmRead, -1, FaultAction::kStall, 0, 1});
  model_->AddFault(
      FaultRule{true, kAdminAbort, -1, FaultAction::kStatus, kStatusAbortLimitExceeded, 1});
  NvmeRequest r = Io(NvmeOp::kRead, 0, 1, 0);
  qp()->Submit(absl::MakeSpan(&r, 1));
  clock_.AdvanceMs(100);
  ASSERT_TRUE(PollUntil([&] { return r.done; }));
  EXPECT_EQ(r.result, -ETIMEDOUT);
  EXPECT_EQ(controller_->resets(), 1u);
}

// CSTS.CFS: the commands in flight are lost; the timeout finds the fatal status and resets; the
// queues are re-created and I/O (data checked) works again. Requests still waiting for a slot
// survive the reset and go out afterwards.
TEST_F(ControllerTest, FatalStatusResetRecreatesQueues) {
  ControllerOptions co;
  co.io_timeout_ms = 200;
  co.io_queue_depth = 4;
  co.io_queues = 2;
  Start({}, co);
  Fill(0, 16 * kBlock, 9);
  std::vector<NvmeRequest> before;
  for (uint32_t i = 0; i < 16; ++i) before.push_back(Io(NvmeOp::kWrite, 100 + i, 1, i * kBlock));
  qp()->Execute(absl::MakeSpan(before));
  model_->SetFatal();
  ASSERT_TRUE(controller_->Fatal());
  std::vector<NvmeRequest> batch;
  for (uint32_t i = 0; i < 6; ++i)
    batch.push_back(Io(NvmeOp::kRead, 100 + i, 1, (64 + i) * kBlock));
  qp()->Submit(absl::MakeSpan(batch));
  EXPECT_EQ(qp()->in_flight(), 3u);
  EXPECT_EQ(qp()->waiting(), 3u);
  clock_.AdvanceMs(200);
  qp()->Poll();
  EXPECT_EQ(controller_->resets(), 1u);
  EXPECT_FALSE(controller_->Fatal());
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(batch[i].result, -EIO) << "lost to the reset";
  ASSERT_TRUE(PollUntil([&] { return batch[5].done; }));
  for (uint32_t i = 3; i < 6; ++i) {
    EXPECT_EQ(batch[i].result, kBlock) << i;
    EXPECT_TRUE(Check((64 + i) * kBlock, kBlock, 9 + i * kBlock * 31 + i)) << i;
  }
  // The second queue pair was re-created too.
  NvmeRequest other = Io(NvmeOp::kRead, 100, 1, 200 * kBlock);
  controller_->queue_pair(1)->Execute(absl::MakeSpan(&other, 1));
  EXPECT_EQ(other.result, kBlock);
  EXPECT_TRUE(Check(200 * kBlock, kBlock, 9));
}

TEST_F(ControllerTest, FlushIsSentOnlyWithAVolatileWriteCache) {
  Start();
  ASSERT_TRUE(controller_->info().volatile_write_cache);
  EXPECT_TRUE(qp()->Flush().ok());
  EXPECT_EQ(model_->counters().flushes, 1u);
  model_->AddFault(FaultRule{false, kNvmFlush, -1, FaultAction::kStatus, kStatusWriteFault, 1});
  absl::Status failed = qp()->Flush();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_NE(failed.message().find("Write Fault"), std::string::npos) << failed;
  TearDown();
  ModelOptions mo;
  mo.volatile_write_cache = false;
  Start(mo);
  EXPECT_TRUE(qp()->Flush().ok());
  EXPECT_EQ(model_->counters().flushes, 0u);
}

// An admin command the controller never answers: DEADLINE_EXCEEDED naming it (real clock: the
// timeout itself is what is tested).
TEST_F(ControllerTest, AdminTimeoutNamesTheCommand) {
  ControllerOptions co;
  co.clock = Clock::Real();
  co.admin_timeout_ms = 50;
  Start({}, co);
  model_->AddFault(FaultRule{true, kAdminGetFeatures, -1, FaultAction::kStall, 0, 1});
  Sqe e = {};
  e.cdw0 = Cdw0(kAdminGetFeatures, 0, kPsdtPrp);
  e.cdw10 = kFeatureVolatileWriteCache;
  auto r = controller_->AdminCommand(e, "Get Features (VWC)");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("nvme0: Get Features (VWC) (admin) timed out after 50 ms"),
            std::string::npos)
      << r.status();
  // The late answer never comes; the next command is matched by its own CID.
  auto again = controller_->AdminCommand(e, "Get Features (VWC)");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 1u);
}

TEST_F(ControllerTest, OrderlyShutdown) {
  Start();
  ASSERT_TRUE(controller_->Shutdown().ok());
  EXPECT_EQ(model_->Read32(kRegCsts) & kCstsShstMask, kCstsShstComplete);
  EXPECT_EQ(model_->Read32(kRegCc) & kCcShnMask, kCcShnNormal);
  NvmeRequest r = Io(NvmeOp::kRead, 0, 1, 0);
  qp()->Execute(absl::MakeSpan(&r, 1));
  EXPECT_EQ(r.result, -EIO);
}

}  // namespace
}  // namespace tutti::io::nvme

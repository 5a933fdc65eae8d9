// The fake EngineIo keeps a cuda EngineIo's contract: words after copies, signals below
// num_layers, the newer captured ticket, nothing written after Close; and it records every call.
#include "daemon/engine/fake_engine_io.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::engine {
namespace {

using Call = FakeEngineLog::Call;
using Signals = FakeEngineLog::Signals;

FakeEngineOptions Device() {
  FakeEngineOptions o;
  o.kind = "fake_cuda_ipc";
  o.is_device = true;
  o.has_ready_words = true;
  o.num_layers = 2;
  o.num_blocks = 4;
  return o;
}

TEST(FakeEngineIoTest, SaysWhatItIs) {
  FakeEngineLog log;
  auto io = MakeFakeEngineIo(Device(), nullptr, &log);
  EXPECT_EQ(io->kind(), "fake_cuda_ipc");
  EXPECT_EQ(io->num_blocks(), 4u);
  EXPECT_TRUE(io->is_device());
  EXPECT_TRUE(io->has_ready_words());
  auto inner = MakeFakeEngineIo(Device(), MakeNoMemoryEngineIo(), &log);
  EXPECT_EQ(inner->num_blocks(), 0u);  // the inner one's
}

TEST(FakeEngineIoTest, WritesWordsAfterCopiesAndBelowNumLayers) {
  FakeEngineLog log;
  auto io = MakeFakeEngineIo(Device(), nullptr, &log);
  uint8_t staging[8] = {};
  const std::vector<CopyOp> ops = {{1, 0, staging}};
  ASSERT_TRUE(io->ScatterLayer(0, ops, 7).ok());
  ASSERT_TRUE(io->EnqueueLayer(1, ops, 7).ok());
  ASSERT_TRUE(io->Drain().ok());
  ASSERT_TRUE(io->SignalLayers(0, 5, 8).ok());
  ASSERT_TRUE(io->SignalCaptured(9).ok());
  ASSERT_TRUE(io->SignalCaptured(3).ok());  // older: the word keeps 9
  EXPECT_EQ(log.Take(), (Signals{{0, 7}, {1, 7}, {0, 8}, {1, 8}, {2, 9}, {2, 9}}));
  absl::MutexLock lock(&log.mu);
  EXPECT_EQ(log.enqueued, (std::vector<uint32_t>{1}));
  EXPECT_EQ(log.drains, 1);
  ASSERT_EQ(log.calls.size(), 6u);
  EXPECT_EQ(log.calls[0].kind, Call::kScatter);
  ASSERT_EQ(log.calls[0].ops.size(), 1u);
  EXPECT_EQ(log.calls[0].ops[0].block, 1u);
  EXPECT_EQ(log.calls[3].kind, Call::kSignalLayers);
  EXPECT_EQ(log.calls[3].end, 5u);
}

TEST(FakeEngineIoTest, InjectedErrorsWriteNothing) {
  FakeEngineLog log;
  auto io = MakeFakeEngineIo(Device(), nullptr, &log);
  {
    absl::MutexLock lock(&log.mu);
    log.fail_layer = 1;
    log.gather_error = absl::DataLossError("injected");
  }
  EXPECT_TRUE(io->ScatterLayer(0, {}, 4).ok());
  EXPECT_EQ(io->ScatterLayer(1, {}, 4).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(io->Gather({}).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(log.Take(), (Signals{{0, 4}}));
}

TEST(FakeEngineIoTest, HostMemoryHasNoWords) {
  FakeEngineLog log;
  FakeEngineOptions o;
  o.num_layers = 2;
  auto io = MakeFakeEngineIo(o, nullptr, &log);
  EXPECT_EQ(io->kind(), "fake");
  EXPECT_FALSE(io->is_device());
  ASSERT_TRUE(io->ScatterLayer(0, {}, 1).ok());
  ASSERT_TRUE(io->SignalLayers(0, 2, 1).ok());
  ASSERT_TRUE(io->SignalCaptured(1).ok());
  EXPECT_TRUE(log.Take().empty());
}

TEST(FakeEngineIoTest, CloseStopsEverythingAndClosesTheInnerOne) {
  FakeEngineLog log;
  FakeEngineLog inner_log;
  auto io = MakeFakeEngineIo(Device(), MakeFakeEngineIo(Device(), nullptr, &inner_log), &log);
  io->Close();
  io->Close();  // idempotent
  EXPECT_EQ(io->ScatterLayer(0, {}, 1).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(io->SignalLayers(0, 2, 1).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(io->Gather({}).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(io->SignalCaptured(1).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(log.Take().empty());
  absl::MutexLock lock(&log.mu);
  ASSERT_EQ(log.calls.size(), 5u);  // the close, then the refused calls
  EXPECT_EQ(log.calls[0].kind, Call::kClose);
  absl::MutexLock inner_lock(&inner_log.mu);
  ASSERT_EQ(inner_log.calls.size(), 1u);
  EXPECT_EQ(inner_log.calls[0].kind, Call::kClose);
}

}  // namespace
}  // namespace tutti::engine

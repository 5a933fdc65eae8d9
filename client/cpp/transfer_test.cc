// The transfer state machine: layers land in order, failed blocks are reported, and a transfer
// that breaks (tuttid gone, bad stream) fails every block and releases every layer wait, in cuda
// mode by force-releasing the ready words to the transfer's ticket.
#include "client/cpp/transfer.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tutti::client {
namespace {

class RecordingWords : public internal::ReadyWords {
 public:
  uint32_t count() const override { return 5; }
  absl::StatusOr<tutti::v1::CudaIpcRegion> Export() const override {
    return tutti::v1::CudaIpcRegion();
  }
  absl::Status EnqueueWait(void* stream, uint32_t index, uint32_t ticket) override {
    waits.push_back({index, ticket});
    last_stream = stream;
    return absl::OkStatus();
  }
  absl::Status ForceRelease(uint32_t ticket) override {
    released.push_back(ticket);
    return absl::OkStatus();
  }
  std::vector<std::pair<uint32_t, uint32_t>> waits;
  std::vector<uint32_t> released;
  void* last_stream = nullptr;
};

TEST(TransferTest, AllLayersLandWithOneFailedBlock) {
  Retrieval::Rep t(3, 0, 4, 7, nullptr);
  const uint32_t failed1[] = {1};
  t.OnProgress(0, {});
  t.OnProgress(1, failed1);
  t.OnProgress(2, {});
  t.OnProgress(3, {});
  t.OnEnd(absl::OkStatus());
  const RetrieveOutcome& out = t.Wait();
  EXPECT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.failed, std::vector<uint32_t>({1}));
  EXPECT_EQ(out.layers_done, 4u);
  EXPECT_TRUE(t.WaitLayer(3, nullptr).ok());
}

TEST(TransferTest, HostWaitLayerBlocksUntilThatLayerLands) {
  Retrieval::Rep t(2, 0, 3, 1, nullptr);
  std::atomic<int> landed{-1};
  std::thread engine([&] {
    for (uint32_t l = 0; l < 3; ++l) {
      ASSERT_TRUE(t.WaitLayer(l, nullptr).ok());
      landed.store(static_cast<int>(l));
    }
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(landed.load(), -1);
  t.OnProgress(0, {});
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(landed.load(), 0);
  t.OnProgress(1, {});
  t.OnProgress(2, {});
  engine.join();
  EXPECT_EQ(landed.load(), 2);
  t.OnEnd(absl::OkStatus());
}

TEST(TransferTest, BrokenStreamFailsEveryBlockAndReleasesWaiters) {
  Retrieval::Rep t(4, 0, 4, 9, nullptr);
  t.OnProgress(0, {});
  std::thread engine([&] {
    Status s = t.WaitLayer(2, nullptr);
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
    EXPECT_NE(s.message().find("UNAVAILABLE"), std::string::npos) << s.ToString();
  });
  absl::SleepFor(absl::Milliseconds(20));
  t.OnEnd(absl::UnavailableError("socket closed"));
  engine.join();
  const RetrieveOutcome& out = t.Wait();
  EXPECT_EQ(out.status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(out.failed, std::vector<uint32_t>({0, 1, 2, 3}));
  EXPECT_EQ(out.layers_done, 1u);
  EXPECT_TRUE(t.WaitLayer(0, nullptr).ok());  // layer 0 did land
}

TEST(TransferTest, CudaWaitsGoToTheReadyWordsAndABreakForceReleasesTheTicket) {
  RecordingWords words;
  Retrieval::Rep t(2, 1, 4, 42, &words);
  int stream = 0;
  EXPECT_TRUE(t.WaitLayer(1, &stream).ok());
  EXPECT_TRUE(t.WaitLayer(3, &stream).ok());
  EXPECT_EQ(t.WaitLayer(0, &stream).code(), StatusCode::kInvalidArgument);  // not in [1, 4)
  EXPECT_EQ(t.WaitLayer(2, nullptr).code(), StatusCode::kInvalidArgument);  // no stream
  ASSERT_EQ(words.waits.size(), 2u);
  EXPECT_EQ(words.waits[0], std::make_pair(1u, 42u));
  EXPECT_EQ(words.waits[1], std::make_pair(3u, 42u));
  EXPECT_EQ(words.last_stream, &stream);
  t.OnProgress(1, {});
  t.OnEnd(absl::UnavailableError("tuttid died"));
  EXPECT_EQ(words.released, std::vector<uint32_t>({42}));
  EXPECT_EQ(t.Wait().failed, std::vector<uint32_t>({0, 1}));
}

TEST(TransferTest, CompleteCudaTransferReleasesNothing) {
  RecordingWords words;
  Retrieval::Rep t(1, 0, 2, 5, &words);
  t.OnProgress(0, {});
  t.OnProgress(1, {});
  t.OnEnd(absl::OkStatus());
  EXPECT_TRUE(words.released.empty());
  EXPECT_TRUE(t.Wait().failed.empty());
}

TEST(TransferTest, MissingOrOutOfOrderLayersAreAnError) {
  {
    RecordingWords words;
    Retrieval::Rep t(1, 0, 3, 5, &words);
    t.OnProgress(0, {});
    t.OnEnd(absl::OkStatus());  // stream ended after 1 of 3 layers
    EXPECT_EQ(t.Wait().status.code(), StatusCode::kInternal);
    EXPECT_EQ(t.Wait().failed, std::vector<uint32_t>({0}));
    EXPECT_EQ(words.released, std::vector<uint32_t>({5}));
  }
  {
    Retrieval::Rep t(1, 0, 2, 5, nullptr);
    t.OnProgress(1, {});
    t.OnProgress(0, {});
    t.OnEnd(absl::OkStatus());
    EXPECT_EQ(t.Wait().status.code(), StatusCode::kInternal);
  }
}

}  // namespace
}  // namespace tutti::client

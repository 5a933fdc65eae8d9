#include "gpu/ready_words.h"

#include <cuda_runtime.h>

#include <chrono>
#include <thread>

#include "gpu/testing/test_util.h"
#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

// cudaMemsetAsync(flag, 1, 4) sets every byte to 1.
constexpr int kFlagSet = 0x01010101;

// An engine stream, ready words, and the daemon side over the same words.
class ReadyWordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TUTTI_SKIP_WITHOUT_GPU();
    auto io = IoStream::Create({0, 8, 0});
    ASSERT_TRUE(io.ok()) << io.status();
    io_ = std::move(*io);
    auto array = ReadyWordArray::Create(0, 4);
    ASSERT_TRUE(array.ok()) << array.status();
    array_ = std::move(*array);
    auto words = ReadyWords::WrapLocal(array_->word(0), 4, io_.get());
    ASSERT_TRUE(words.ok()) << words.status();
    words_ = std::move(*words);
    ASSERT_EQ(cudaStreamCreateWithFlags(&engine_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&flag_, sizeof(int)), cudaSuccess);
    ASSERT_EQ(cudaMemset(flag_, 0, sizeof(int)), cudaSuccess);
  }
  void TearDown() override {
    if (engine_ != nullptr) {
      // Never leave the stream blocked, whatever failed.
      (void)array_->ForceRelease(0x7fffffff);
      cudaStreamSynchronize(engine_);
      cudaStreamDestroy(engine_);
    }
    if (flag_ != nullptr) cudaFree(flag_);
  }

  // The engine waits for word `index` >= ticket, then sets the flag.
  void EngineWaits(uint32_t index, uint32_t ticket) {
    ASSERT_EQ(cudaMemset(flag_, 0, sizeof(int)), cudaSuccess);
    ASSERT_TRUE(WaitLayer(engine_, array_->word(index), ticket).ok());
    ASSERT_EQ(cudaMemsetAsync(flag_, 1, sizeof(int), engine_), cudaSuccess);
  }
  // True if the engine stream finishes within `ms` milliseconds.
  bool EngineDoneWithin(int ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < deadline) {
      cudaError_t e = cudaStreamQuery(engine_);
      if (e == cudaSuccess) return true;
      EXPECT_EQ(e, cudaErrorNotReady);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
  int Flag() {
    int v = -1;
    EXPECT_EQ(cudaMemcpy(&v, flag_, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  void Signal(uint32_t index, uint32_t ticket) {
    ASSERT_TRUE(words_->Signal(index, ticket).ok());
    ASSERT_TRUE(io_->Synchronize().ok());
  }

  std::unique_ptr<IoStream> io_;
  std::unique_ptr<ReadyWordArray> array_;
  std::unique_ptr<ReadyWords> words_;
  cudaStream_t engine_ = nullptr;
  int* flag_ = nullptr;
};

TEST_F(ReadyWordsTest, EngineStreamWaitsForItsTicket) {
  EngineWaits(2, 7);
  EXPECT_FALSE(EngineDoneWithin(100));
  EXPECT_EQ(Flag(), 0);
  Signal(2, 6);  // an older ticket does not release it
  EXPECT_FALSE(EngineDoneWithin(50));
  Signal(1, 7);  // nor does another layer's word
  EXPECT_FALSE(EngineDoneWithin(50));
  Signal(2, 7);
  EXPECT_TRUE(EngineDoneWithin(5000));
  EXPECT_EQ(Flag(), kFlagSet);
}

TEST_F(ReadyWordsTest, ALaterTicketReleasesAnEarlierWait) {
  EngineWaits(1, 3);
  Signal(1, 10);
  EXPECT_TRUE(EngineDoneWithin(5000));
  EXPECT_EQ(Flag(), kFlagSet);
}

TEST_F(ReadyWordsTest, ComparisonSurvivesWrapAround) {
  Signal(0, 0xfffffff0u);
  EngineWaits(0, 0xfffffff8u);
  EXPECT_FALSE(EngineDoneWithin(50));
  Signal(0, 2);  // 2 comes after 0xfffffff8 in wrap-around order
  EXPECT_TRUE(EngineDoneWithin(5000));
}

TEST_F(ReadyWordsTest, ForceReleaseFreesAWaitingStream) {
  EngineWaits(3, 100);
  EXPECT_FALSE(EngineDoneWithin(50));
  ASSERT_TRUE(array_->ForceRelease(100).ok());
  EXPECT_TRUE(EngineDoneWithin(5000));
  EXPECT_EQ(Flag(), kFlagSet);
}

TEST_F(ReadyWordsTest, SignalOutOfRangeIsRejected) {
  EXPECT_EQ(words_->Signal(4, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ReadyWordsTest, ExportNamesThisGpu) {
  absl::StatusOr<IpcRegion> region = array_->ExportIpc();
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(region->handle.size(), 64u);
  EXPECT_EQ(region->size_bytes, 16u);
  EXPECT_EQ(region->gpu_uuid, Probe()->uuid_text);
}

}  // namespace
}  // namespace tutti::gpu

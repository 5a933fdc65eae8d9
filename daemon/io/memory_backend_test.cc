#include "daemon/io/memory_backend.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/io/aligned_buffer.h"
#include "gtest/gtest.h"

namespace tutti::io {
namespace {

constexpr uint64_t kFileBytes = 1 << 20;
constexpr uint32_t kPage = kAlignment;

class MemoryBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = MemoryBackend::Create({kFileBytes, kFileBytes});
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = *std::move(b);
  }

  // Writes `len` bytes of `byte` at `offset` of `file`; returns the result.
  int64_t Write(uint32_t file, uint64_t offset, uint32_t len, uint8_t byte) {
    AlignedBuffer buf(len);
    std::memset(buf.data(), byte, len);
    IoRequest r{Op::kWrite, file, offset, buf.data(), len};
    backend_->Execute(absl::MakeSpan(&r, 1));
    return r.result;
  }

  // Reads `len` bytes at `offset` of `file` into `*out`; returns the result.
  int64_t Read(uint32_t file, uint64_t offset, uint32_t len, std::string* out) {
    AlignedBuffer buf(len);
    std::memset(buf.data(), 0xEE, len);
    IoRequest r{Op::kRead, file, offset, buf.data(), len};
    backend_->Execute(absl::MakeSpan(&r, 1));
    out->assign(reinterpret_cast<char*>(buf.data()), len);
    return r.result;
  }

  MemoryDisk& disk() { return backend_->disk(); }

  std::unique_ptr<MemoryBackend> backend_;
};

TEST_F(MemoryBackendTest, CreateRejectsBadSizes) {
  EXPECT_EQ(MemoryBackend::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MemoryBackend::Create({4096, 100}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MemoryBackend::Create({0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MemoryBackendTest, ReadsWhatWasWrittenAndZerosElsewhere) {
  EXPECT_EQ(backend_->name(), "memory");
  EXPECT_EQ(backend_->num_files(), 2u);
  EXPECT_EQ(backend_->file_size(1), kFileBytes);
  EXPECT_EQ(Write(1, 8192, 3 * kPage, 0xAB), 3 * kPage);
  std::string got;
  EXPECT_EQ(Read(1, 4096, 5 * kPage, &got), 5 * kPage);
  EXPECT_EQ(got,
            std::string(kPage, '\0') + std::string(3 * kPage, '\xAB') + std::string(kPage, '\0'));
  EXPECT_EQ(Read(0, 8192, kPage, &got), kPage);
  EXPECT_EQ(got, std::string(kPage, '\0'));
  EXPECT_EQ(disk().counts(1).writes, 1u);
  EXPECT_EQ(disk().counts(1).bytes_read, 5u * kPage);
}

TEST_F(MemoryBackendTest, InvalidRequestsCompleteWithEinval) {
  AlignedBuffer buf(2 * kPage);
  std::vector<IoRequest> batch = {
      {Op::kRead, 0, 100, buf.data(), kPage},
      {Op::kRead, 0, 0, buf.data() + 1, kPage},
      {Op::kRead, 0, kFileBytes, buf.data(), kPage},
      {Op::kRead, 2, 0, buf.data(), kPage},
      {Op::kWrite, 0, 0, buf.data(), 0},
      {Op::kWrite, 0, 0, buf.data(), kPage},
  };
  backend_->Execute(absl::MakeSpan(batch));
  for (size_t i = 0; i + 1 < batch.size(); ++i) EXPECT_EQ(batch[i].result, -EINVAL) << i;
  EXPECT_EQ(batch.back().result, kPage);
}

TEST_F(MemoryBackendTest, DoneRunsOnTheWorkerThreadInSubmissionOrder) {
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  absl::Notification last;
  for (int i = 0; i < 5; ++i) {
    backend_->Submit({}, [&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
      if (i == 4) last.Notify();
    });
  }
  last.WaitForNotification();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  for (auto id : threads) EXPECT_NE(id, std::this_thread::get_id());
}

TEST_F(MemoryBackendTest, RequestsOfABatchGoInOrder) {
  ASSERT_EQ(Write(0, 0, kPage, 'o'), kPage);
  AlignedBuffer w(kPage), r(kPage);
  std::memset(w.data(), 'n', kPage);
  std::vector<IoRequest> batch = {{Op::kWrite, 0, 0, w.data(), kPage},
                                  {Op::kRead, 0, 0, r.data(), kPage}};
  backend_->Execute(absl::MakeSpan(batch));
  EXPECT_EQ(r.data()[0], 'n');
  EXPECT_EQ(disk().Peek(0, 0, 1), "n");
  // A read listed before a write sees what was there before it.
  std::memset(w.data(), 'm', kPage);
  batch = {{Op::kRead, 0, 0, r.data(), kPage}, {Op::kWrite, 0, 0, w.data(), kPage}};
  backend_->Execute(absl::MakeSpan(batch));
  EXPECT_EQ(r.data()[0], 'n');
  EXPECT_EQ(disk().Peek(0, 0, 1), "m");
}

TEST_F(MemoryBackendTest, InjectedFailuresAndShortReads) {
  ASSERT_EQ(Write(0, 0, 4 * kPage, 0x11), 4 * kPage);
  disk().FailNext(0, Op::kRead, 2, EIO);
  std::string got;
  EXPECT_EQ(Read(0, 0, kPage, &got), -EIO);
  EXPECT_EQ(Read(0, 0, kPage, &got), -EIO);
  EXPECT_EQ(Read(1, 0, kPage, &got), kPage) << "other files are unaffected";
  EXPECT_EQ(Read(0, 0, kPage, &got), kPage);

  disk().FailNext(0, Op::kWrite, 1, ENOSPC);
  EXPECT_EQ(Write(0, 0, kPage, 0x22), -ENOSPC);
  EXPECT_EQ(Read(0, 0, kPage, &got), kPage);
  EXPECT_EQ(got, std::string(kPage, '\x11')) << "a failed write changes nothing";

  disk().ShortenNextReads(0, 1, kPage);
  EXPECT_EQ(Read(0, 0, 4 * kPage, &got), kPage);
  EXPECT_EQ(got.substr(0, kPage), std::string(kPage, '\x11'));
  EXPECT_EQ(got.substr(kPage, kPage), std::string(kPage, '\xEE')) << "bytes past a short read";
  EXPECT_EQ(Read(0, 0, 4 * kPage, &got), 4 * kPage);

  disk().FailNextSync(1, 1, EIO);
  EXPECT_EQ(backend_->Sync(1).code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(backend_->Sync(1).ok());
  EXPECT_EQ(backend_->Sync(9).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(disk().counts(0).faults, 4u);
}

TEST_F(MemoryBackendTest, CorruptFlipsBytesDurably) {
  ASSERT_EQ(Write(0, 0, kPage, 0x0F), kPage);
  ASSERT_TRUE(backend_->Sync(0).ok());
  disk().Corrupt(0, 10, 2);
  std::string got;
  ASSERT_EQ(Read(0, 0, kPage, &got), kPage);
  EXPECT_EQ(got[9], '\x0F');
  EXPECT_EQ(got[10], '\xF0');
  EXPECT_EQ(got[11], '\xF0');
  EXPECT_EQ(got[12], '\x0F');
  disk().SimulateCrash();
  EXPECT_EQ(disk().Peek(0, 10, 1), "\xF0");
}

TEST_F(MemoryBackendTest, CrashDropsOnlyUnsyncedWrites) {
  ASSERT_EQ(Write(0, 0, 2 * kPage, 'A'), 2 * kPage);
  ASSERT_EQ(Write(1, 0, kPage, 'a'), kPage);
  ASSERT_TRUE(backend_->Sync(0).ok());                    // file 1 is never synced
  ASSERT_EQ(Write(0, kPage, 2 * kPage, 'B'), 2 * kPage);  // overwrites one synced page
  EXPECT_EQ(disk().UnsyncedPages(0), 2u);
  EXPECT_EQ(disk().Peek(0, kPage, 1), "B");

  disk().SimulateCrash();
  EXPECT_EQ(disk().UnsyncedPages(0), 0u);
  EXPECT_EQ(disk().Peek(0, 0, 2 * kPage), std::string(2 * kPage, 'A'));
  EXPECT_EQ(disk().Peek(0, 2 * kPage, kPage), std::string(kPage, '\0'));
  EXPECT_EQ(disk().Peek(1, 0, kPage), std::string(kPage, '\0'));
  std::string got;
  EXPECT_EQ(Read(0, 0, kPage, &got), kPage) << "the disk works again after the restart";
}

TEST_F(MemoryBackendTest, PowerCutFailsEverythingUntilRestart) {
  ASSERT_EQ(Write(0, 0, kPage, 'A'), kPage);
  disk().PowerCut();
  std::string got;
  EXPECT_EQ(Read(0, 0, kPage, &got), -EIO);
  EXPECT_EQ(Write(0, 0, kPage, 'B'), -EIO);
  EXPECT_FALSE(backend_->Sync(0).ok());
  disk().Restart();
  EXPECT_EQ(disk().Peek(0, 0, kPage), std::string(kPage, '\0'));
}

TEST_F(MemoryBackendTest, TornCrashKeepsAWholePageSubsetDeterministically) {
  constexpr uint32_t kPages = 64;
  auto torn_state = [&](uint64_t seed) {
    auto b = MemoryBackend::Create({kFileBytes});
    EXPECT_TRUE(b.ok());
    backend_ = *std::move(b);
    EXPECT_EQ(Write(0, 0, kPages * kPage, 'o'), kPages * kPage);
    EXPECT_TRUE(backend_->Sync(0).ok());
    EXPECT_EQ(Write(0, 0, kPages * kPage, 'n'), kPages * kPage);
    disk().SimulateCrash(MemoryDisk::CrashMode::kTear, seed);
    std::string pages;
    for (uint32_t p = 0; p < kPages; ++p) {
      const std::string page = disk().Peek(0, uint64_t{p} * kPage, kPage);
      EXPECT_TRUE(page == std::string(kPage, 'o') || page == std::string(kPage, 'n')) << p;
      pages.push_back(page[0]);
    }
    return pages;
  };
  const std::string a = torn_state(7);
  EXPECT_EQ(a, torn_state(7));
  EXPECT_NE(a, torn_state(8));
  EXPECT_NE(a.find('o'), std::string::npos);
  EXPECT_NE(a.find('n'), std::string::npos);
}

TEST_F(MemoryBackendTest, DiskOutlivesBackendForRestartTests) {
  std::shared_ptr<MemoryDisk> disk = backend_->shared_disk();
  ASSERT_EQ(Write(0, 0, kPage, 'A'), kPage);
  ASSERT_TRUE(backend_->Sync(0).ok());
  ASSERT_EQ(Write(0, kPage, kPage, 'B'), kPage);
  disk->PowerCut();
  backend_.reset();
  disk->Restart();
  backend_ = MemoryBackend::CreateOn(disk);
  std::string got;
  ASSERT_EQ(Read(0, 0, 2 * kPage, &got), 2 * kPage);
  EXPECT_EQ(got, std::string(kPage, 'A') + std::string(kPage, '\0'));
}

TEST_F(MemoryBackendTest, PausedBackendHoldsBatchesAndDestructorFinishesThem) {
  backend_->SetPaused(true);
  std::atomic<int> done{0};
  AlignedBuffer buf(kPage);
  IoRequest r{Op::kWrite, 0, 0, buf.data(), kPage};
  backend_->Submit(absl::MakeSpan(&r, 1), [&] { done.fetch_add(1); });
  backend_->Submit({}, [&] { done.fetch_add(1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(done.load(), 0);
  EXPECT_EQ(backend_->queued_batches(), 2u);
  backend_.reset();
  EXPECT_EQ(done.load(), 2);
  EXPECT_EQ(r.result, kPage);
}

TEST_F(MemoryBackendTest, RegisterBufferOnce) {
  AlignedBuffer buf(kPage);
  EXPECT_TRUE(backend_->RegisterBuffer(buf.span()).ok());
  EXPECT_EQ(backend_->RegisterBuffer(buf.span()).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tutti::io

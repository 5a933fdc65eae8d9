// A Store batch's transfer over the scheduler and the memory backend: merged writes land where
// the layout puts each object and header; a failed write names exactly the blocks it covered and
// keeps its file out of those written whole.
#include "daemon/datapath/write_transfer.h"

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/io/memory_backend.h"
#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

constexpr uint32_t kFrame = 4096;
constexpr uint32_t kObjects = 2;

class WriteTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 2 files, G = 2: object j of slots 0 and 1 are adjacent frames of file j % 2; the headers of
    // slots 0 and 1 are the first header pages of files 0 and 1.
    layout_ = pool::PoolLayout::Compute(64 << 20, 2, kFrame, kObjects, 2).value();
    std::vector<uint64_t> sizes(2, layout_.file_bytes());
    backend_ = io::MemoryBackend::Create(sizes).value();
    sink_ = BackendSink(backend_.get());
    IoSchedulerOptions o;
    o.num_devices = 2;
    scheduler_ = IoScheduler::Create(o, sink_.get(), &clock_).value();
    // Interleaved staging: object 0 of slots 0 and 1, then object 1 of both.
    for (uint32_t i = 0; i < kObjects * 2; ++i)
      std::memset(frames_.data() + i * kFrame, 'a' + i, kFrame);
    for (uint32_t b = 0; b < 2; ++b) {
      std::memset(headers_.data() + b * kFrame, 'H' + b, kFrame);
      for (uint32_t j = 0; j < kObjects; ++j)
        ptrs_[b].push_back(frames_.data() + (j * 2 + b) * kFrame);
    }
  }

  std::vector<WriteBlock> Blocks(uint32_t first_index, uint32_t second_index) {
    return {WriteBlock{first_index, 0, ptrs_[0], kFrame, headers_.data()},
            WriteBlock{second_index, 1, ptrs_[1], kFrame, headers_.data() + kFrame}};
  }

  void PostAndWait(WriteTransfer* t) {
    absl::Notification done;
    t->Post(scheduler_.get(), [&done] { done.Notify(); });
    done.WaitForNotification();
  }

  std::string At(pool::Location l) { return backend_->disk().Peek(l.file, l.offset, kFrame); }

  pool::PoolLayout layout_;
  ManualClock clock_{1000};
  std::unique_ptr<io::MemoryBackend> backend_;
  std::unique_ptr<IoSink> sink_;
  std::unique_ptr<IoScheduler> scheduler_;
  io::AlignedBuffer frames_{kObjects * 2 * kFrame}, headers_{2 * kFrame};
  std::vector<uint8_t*> ptrs_[2];
};

TEST_F(WriteTransferTest, MergedWritesLandWhereTheLayoutPutsEachPiece) {
  std::vector<WriteBlock> blocks = Blocks(0, 1);
  auto t = WriteTransfer::Prepare(layout_, blocks, 1u << 20);
  EXPECT_EQ(t->num_writes(), 4u);  // object 0 of both, object 1 of both, two headers
  PostAndWait(t.get());
  for (uint32_t b = 0; b < 2; ++b) {
    for (uint32_t j = 0; j < kObjects; ++j) {
      EXPECT_EQ(At(layout_.ObjectLocation(b, j)), std::string(kFrame, 'a' + j * 2 + b));
    }
    EXPECT_EQ(At(layout_.HeaderLocation(b)), std::string(kFrame, 'H' + b));
  }
  EXPECT_TRUE(t->FailedBlocks().empty());
  EXPECT_TRUE(t->FailedWrites().empty());
  std::vector<bool> files(2, false);
  t->MarkFilesWritten(&files);
  EXPECT_EQ(files, (std::vector<bool>{true, true}));
}

TEST_F(WriteTransferTest, FailedWritesNameTheCallersBlocksTheyCovered) {
  std::vector<WriteBlock> blocks = Blocks(3, 5);
  auto t = WriteTransfer::Prepare(layout_, blocks, 1u << 20);
  backend_->disk().FailNext(1, io::Op::kWrite, 2, EIO);  // both of file 1: header 1, objects 1
  PostAndWait(t.get());
  EXPECT_EQ(t->FailedBlocks(), (std::vector<uint32_t>{3, 5}));
  const std::vector<FailedWrite> failed = t->FailedWrites();
  ASSERT_EQ(failed.size(), 2u);
  EXPECT_EQ(failed[0].request.file, 1u);
  EXPECT_EQ(failed[0].request.result, -EIO);
  EXPECT_EQ(failed[0].first_block, 5u);  // slot 1's header
  EXPECT_EQ(failed[0].num_pieces, 1u);
  EXPECT_EQ(failed[1].first_block, 3u);  // object 1 of slots 0 and 1, merged
  EXPECT_EQ(failed[1].num_pieces, 2u);
  std::vector<bool> files(2, false);
  t->MarkFilesWritten(&files);
  EXPECT_EQ(files, (std::vector<bool>{true, false}));
}

TEST_F(WriteTransferTest, NothingToWriteCompletesInsidePost) {
  auto t = WriteTransfer::Prepare(layout_, {}, 1u << 20);
  EXPECT_EQ(t->num_writes(), 0u);
  bool done = false;
  t->Post(scheduler_.get(), [&done] { done = true; });
  EXPECT_TRUE(done);
  EXPECT_TRUE(t->FailedBlocks().empty());
}

}  // namespace
}  // namespace tutti::datapath

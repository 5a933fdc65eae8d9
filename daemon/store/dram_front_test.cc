#include "daemon/store/dram_front.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::store {
namespace {

constexpr uint64_t kChunk = 4096;

Key K(uint8_t i) {
  Key k;
  k.bytes[0] = i;
  return k;
}

class DramFrontTest : public ::testing::Test {
 protected:
  // Room for `chunks` chunks, of which `max_blocks` may be kept.
  void Make(uint64_t chunks, uint64_t max_blocks) {
    region_.assign(chunks * kChunk, 0);
    front_ = std::make_unique<DramFront>(absl::MakeSpan(region_), kChunk, max_blocks);
  }
  // Takes a chunk, fills it with `fill`, and keeps it as block i of namespace 1.
  bool Keep(uint8_t i, uint8_t fill) {
    uint8_t* c = front_->TakeChunk(&dropped_);
    if (c == nullptr) return false;
    std::memset(c, fill, kChunk);
    front_->Insert(1, K(i), 1024, 4, c, &dropped_);
    return true;
  }
  std::vector<uint8_t> region_;
  std::unique_ptr<DramFront> front_;
  uint64_t dropped_ = 0;
};

TEST_F(DramFrontTest, KeepsAtMostMaxBlocksLeastRecentlyInsertedOutFirst) {
  Make(/*chunks=*/4, /*max_blocks=*/2);
  ASSERT_TRUE(Keep(1, 0x11));
  ASSERT_TRUE(Keep(2, 0x22));
  ASSERT_TRUE(Keep(3, 0x33));  // evicts 1
  EXPECT_EQ(dropped_, 1u);
  EXPECT_EQ(front_->Find(1, K(1)), nullptr);
  ASSERT_NE(front_->Find(1, K(2)), nullptr);
  EXPECT_EQ(front_->Find(1, K(3))->data->data[0], 0x33);
  EXPECT_EQ(front_->kept(), 2u);
  EXPECT_EQ(front_->CountNamespace(1), 2u);
  EXPECT_EQ(front_->CountNamespace(2), 0u);
}

TEST_F(DramFrontTest, PinnedBlocksAreNeverEvicted) {
  Make(4, 2);
  ASSERT_TRUE(Keep(1, 1));
  ASSERT_TRUE(Keep(2, 2));
  ++front_->Find(1, K(1))->pins;
  ASSERT_TRUE(Keep(3, 3));  // 2 goes, not the pinned 1
  EXPECT_NE(front_->Find(1, K(1)), nullptr);
  EXPECT_EQ(front_->Find(1, K(2)), nullptr);
  EXPECT_EQ(front_->EraseNamespace(1), 1u);  // 3 only: 1 is pinned
  EXPECT_NE(front_->Find(1, K(1)), nullptr);
}

TEST_F(DramFrontTest, PromotingBlocksLeaveTheBoundAndStayReadable) {
  Make(3, 2);
  ASSERT_TRUE(Keep(1, 0x11));
  ASSERT_TRUE(Keep(2, 0x22));
  ++front_->Find(1, K(1))->pins;
  std::shared_ptr<const DramBlock> data = front_->BeginPromotion(1, K(1));
  EXPECT_EQ(front_->kept(), 1u);
  ASSERT_TRUE(Keep(3, 0x33));  // the third chunk: nothing evicted, 1 is not counted
  EXPECT_EQ(dropped_, 0u);
  EXPECT_TRUE(front_->Find(1, K(1))->promoting);
  // Every chunk is held (1 promoting, 2 and 3 kept): the next takes 2's.
  ASSERT_TRUE(Keep(4, 0x44));
  EXPECT_EQ(dropped_, 1u);
  EXPECT_EQ(front_->Find(1, K(2)), nullptr);
  EXPECT_EQ(front_->EndPromotion(1, K(1)), 1u);  // its pin comes back to the caller
  EXPECT_EQ(front_->Find(1, K(1)), nullptr);
  EXPECT_EQ(data->data[0], 0x11);  // still held by the writer
  // Its chunk returns once the holder lets go.
  front_->Find(1, K(3))->pins = 1;
  front_->Find(1, K(4))->pins = 1;
  EXPECT_FALSE(Keep(5, 5));
  data.reset();
  EXPECT_TRUE(Keep(5, 5));
}

TEST_F(DramFrontTest, OffWithoutRoomForAChunk) {
  Make(0, 2);
  EXPECT_FALSE(front_->enabled());
  EXPECT_FALSE(Keep(1, 1));
}

}  // namespace
}  // namespace tutti::store

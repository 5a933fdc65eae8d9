#include "daemon/datapath/write_plan.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

constexpr uint32_t kPage = 4096;

// Memory the pieces point into (only addresses matter).
alignas(4096) uint8_t g_mem[64 * kPage];
const uint8_t* Mem(uint32_t page) { return g_mem + page * kPage; }

TEST(WritePlanTest, PiecesAdjacentInFileAndMemoryShareOneWriteInFileOrder) {
  // Given out of order: block 1's piece follows block 0's in file 0 and in memory.
  WritePlan plan = PlanWrites({WritePiece{1, 0, 8 * kPage, Mem(2), 2 * kPage},
                               WritePiece{0, 0, 6 * kPage, Mem(0), 2 * kPage}},
                              1 << 20);
  ASSERT_EQ(plan.writes.size(), 1u);
  EXPECT_EQ(plan.writes[0].op, io::Op::kWrite);
  EXPECT_EQ(plan.writes[0].file, 0u);
  EXPECT_EQ(plan.writes[0].offset, 6 * kPage);
  EXPECT_EQ(plan.writes[0].buf, Mem(0));
  EXPECT_EQ(plan.writes[0].len, 4 * kPage);
  ASSERT_EQ(plan.covers.size(), 1u);
  EXPECT_EQ(plan.covers[0].first_piece, 0u);
  EXPECT_EQ(plan.covers[0].num_pieces, 2u);
  EXPECT_EQ(plan.pieces[0].block, 0u);
  EXPECT_EQ(plan.pieces[1].block, 1u);
}

TEST(WritePlanTest, AdjacentInOnlyOneOfFileAndMemoryStaysApart) {
  WritePlan plan = PlanWrites(
      {
          WritePiece{0, 0, 0, Mem(0), kPage},
          WritePiece{1, 0, kPage, Mem(5), kPage},      // next in the file, not in memory
          WritePiece{2, 1, 2 * kPage, Mem(6), kPage},  // next in memory, another file
          WritePiece{3, 1, 9 * kPage, Mem(7), kPage},  // next in memory, a gap in the file
      },
      1 << 20);
  ASSERT_EQ(plan.writes.size(), 4u);
  for (const io::IoRequest& w : plan.writes) EXPECT_EQ(w.len, kPage);
}

TEST(WritePlanTest, AMergedWriteStaysWithinTheBoundAndNoPieceIsSplit) {
  std::vector<WritePiece> pieces;
  for (uint32_t i = 0; i < 5; ++i) pieces.push_back(WritePiece{i, 2, i * kPage, Mem(i), kPage});
  pieces.push_back(WritePiece{5, 2, 5 * kPage, Mem(5), 4 * kPage});  // larger than the bound
  WritePlan plan = PlanWrites(pieces, 2 * kPage);
  ASSERT_EQ(plan.writes.size(), 4u);
  EXPECT_EQ(plan.writes[0].len, 2 * kPage);
  EXPECT_EQ(plan.writes[1].len, 2 * kPage);
  EXPECT_EQ(plan.writes[2].len, kPage);
  EXPECT_EQ(plan.writes[3].len, 4 * kPage);
  EXPECT_EQ(plan.covers[3].num_pieces, 1u);
}

TEST(WritePlanTest, AFailedWriteFailsExactlyTheBlocksItCovered) {
  WritePlan plan = PlanWrites(
      {
          WritePiece{0, 0, 0, Mem(0), kPage},
          WritePiece{1, 0, kPage, Mem(1), kPage},      // merged with block 0's
          WritePiece{2, 1, 0, Mem(2), kPage},          // its own write
          WritePiece{1, 1, 8 * kPage, Mem(9), kPage},  // block 1 again, its own write
      },
      1 << 20);
  ASSERT_EQ(plan.writes.size(), 3u);
  for (io::IoRequest& w : plan.writes) w.result = w.len;
  uint64_t failed_writes = 0;
  EXPECT_EQ(BlocksOfFailedWrites(plan, 4, &failed_writes), std::vector<bool>(4, false));
  EXPECT_EQ(failed_writes, 0u);

  plan.writes[0].result = -EIO;  // blocks 0 and 1
  EXPECT_EQ(BlocksOfFailedWrites(plan, 4, &failed_writes),
            (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(failed_writes, 1u);

  plan.writes[0].result = plan.writes[0].len;
  plan.writes[2].result = kPage / 2;  // short: block 1 only
  EXPECT_EQ(BlocksOfFailedWrites(plan, 4, &failed_writes),
            (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(failed_writes, 1u);
}

TEST(WritePlanTest, NoPiecesNoWrites) {
  WritePlan plan = PlanWrites({}, 1 << 20);
  EXPECT_TRUE(plan.writes.empty());
  uint64_t failed_writes = 7;
  EXPECT_EQ(BlocksOfFailedWrites(plan, 2, &failed_writes), std::vector<bool>(2, false));
  EXPECT_EQ(failed_writes, 0u);
}

}  // namespace
}  // namespace tutti::datapath

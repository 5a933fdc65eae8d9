#include "daemon/gpu/check_take.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::gpu {
namespace {

struct Job {
  uint64_t scratch_bytes = 0;
  uint32_t objects = 0;
  int id = 0;
};

std::vector<int> Ids(const std::vector<Job>& jobs) {
  std::vector<int> ids;
  for (const Job& j : jobs) ids.push_back(j.id);
  return ids;
}

// One stream queued (a Retrieve alone): a check takes up to max_objects, shared cap or not.
TEST(CheckTakeTest, OneStreamFillsTheWholeCheck) {
  datapath::FairQueue<Job> q;
  for (int i = 0; i < 10; ++i) q.Push(1, Job{0, 32, i});
  const std::vector<Job> taken = TakeForCheck(q, CheckCaps{1 << 20, 128, 32});
  EXPECT_EQ(Ids(taken), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(q.size(), 6u);
}

// Two streams queued: the check stops at shared_objects, the streams in turn.
TEST(CheckTakeTest, TwoStreamsTakeTheSharedCapInTurn) {
  datapath::FairQueue<Job> q;
  for (int i = 0; i < 10; ++i) q.Push(1, Job{0, 16, i});
  q.Push(2, Job{0, 16, 100});
  const std::vector<Job> taken = TakeForCheck(q, CheckCaps{1 << 20, 128, 32});
  EXPECT_EQ(Ids(taken), (std::vector<int>{0, 100}));
  // Once the small stream has nothing queued, the next check is whole again.
  EXPECT_EQ(Ids(TakeForCheck(q, CheckCaps{1 << 20, 128, 32})),
            (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
}

// No shared cap (0, the default): two streams fill the check as one does.
TEST(CheckTakeTest, WithoutASharedCapTwoStreamsFillTheCheck) {
  datapath::FairQueue<Job> q;
  for (int i = 0; i < 10; ++i) q.Push(1, Job{0, 16, i});
  q.Push(2, Job{0, 16, 100});
  EXPECT_EQ(Ids(TakeForCheck(q, CheckCaps{1 << 20, 64, 0})), (std::vector<int>{0, 100, 1, 2}));
}

// A job over the shared cap (but within max_objects) still goes: a free check never leaves empty
// while jobs wait.
TEST(CheckTakeTest, TheFirstJobGoesEvenOverTheSharedCap) {
  datapath::FairQueue<Job> q;
  q.Push(1, Job{0, 64, 1});
  q.Push(2, Job{0, 64, 2});
  EXPECT_EQ(Ids(TakeForCheck(q, CheckCaps{1 << 20, 128, 16})), (std::vector<int>{1}));
  EXPECT_EQ(Ids(TakeForCheck(q, CheckCaps{1 << 20, 128, 16})), (std::vector<int>{2}));
  EXPECT_TRUE(q.empty());
}

// Scratch bounds a check as before, whatever the object caps.
TEST(CheckTakeTest, ScratchBoundsTheCheck) {
  datapath::FairQueue<Job> q;
  for (int i = 0; i < 4; ++i) q.Push(1, Job{4096, 1, i});
  EXPECT_EQ(Ids(TakeForCheck(q, CheckCaps{8192, 128, 0})), (std::vector<int>{0, 1}));
  EXPECT_TRUE(TakeForCheck(q, CheckCaps{0, 128, 0}).empty());  // nothing fits: nothing taken
  EXPECT_EQ(q.size(), 2u);
}

}  // namespace
}  // namespace tutti::gpu

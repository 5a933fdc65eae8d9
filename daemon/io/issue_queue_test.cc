#include "daemon/io/issue_queue.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::io {
namespace {

std::vector<int> Drain(IssueQueue<int>& q, bool reads_may_go) {
  std::vector<int> out;
  while (std::optional<int> i = q.Pop(reads_may_go)) out.push_back(*i);
  return out;
}

TEST(IssueQueueTest, IssuesInArrivalOrderWhateverTheClass) {
  IssueQueue<int> q;
  q.Push(1, Op::kWrite);
  q.Push(2, Op::kRead);
  q.Push(3, Op::kWrite);
  q.Push(4, Op::kRead);
  q.Push(5, Op::kRead);
  EXPECT_EQ(Drain(q, true), (std::vector<int>{1, 2, 3, 4, 5}));
  EXPECT_TRUE(q.empty());
}

TEST(IssueQueueTest, HeldReadsLetLaterWritesPass) {
  IssueQueue<int> q;
  q.Push(1, Op::kRead);
  q.Push(2, Op::kRead);
  q.Push(3, Op::kWrite);
  q.Push(4, Op::kRead);
  q.Push(5, Op::kWrite);
  ASSERT_TRUE(q.has_writes());
  EXPECT_EQ(Drain(q, false), (std::vector<int>{3, 5}));
  EXPECT_FALSE(q.has_writes());
  EXPECT_FALSE(q.empty());
  EXPECT_EQ(q.Pop(false), std::nullopt);  // only held reads left
  EXPECT_EQ(Drain(q, true), (std::vector<int>{1, 2, 4}));
}

TEST(IssueQueueTest, ARetryGoesBeforeEverythingQueued) {
  IssueQueue<int> q;
  q.Push(1, Op::kRead);
  q.Push(2, Op::kWrite);
  q.PushFront(0, Op::kWrite);
  q.PushFront(-1, Op::kRead);
  EXPECT_EQ(Drain(q, true), (std::vector<int>{-1, 0, 1, 2}));
}

TEST(IssueQueueTest, EmptyQueuePopsNothing) {
  IssueQueue<int> q;
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.Pop(true), std::nullopt);
  EXPECT_EQ(q.Pop(false), std::nullopt);
}

}  // namespace
}  // namespace tutti::io

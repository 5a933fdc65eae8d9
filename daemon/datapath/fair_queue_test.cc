#include "daemon/datapath/fair_queue.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

std::vector<std::string> Drain(FairQueue<std::string>* q) {
  std::vector<std::string> out;
  while (!q->empty()) out.push_back(q->Pop());
  return out;
}

TEST(FairQueueTest, OneStreamIsAFifo) {
  FairQueue<std::string> q;
  for (const char* s : {"a", "b", "c"}) q.Push(7, s);
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.streams(), 1u);
  EXPECT_EQ(Drain(&q), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(q.streams(), 0u);
}

TEST(FairQueueTest, StreamsTakeTurnsInTheOrderTheyCame) {
  FairQueue<std::string> q;
  for (const char* s : {"a1", "a2", "a3", "a4"}) q.Push(1, s);
  q.Push(2, "b1");
  q.Push(2, "b2");
  q.Push(3, "c1");
  EXPECT_EQ(q.streams(), 3u);
  EXPECT_EQ(Drain(&q), (std::vector<std::string>{"a1", "b1", "c1", "a2", "b2", "a3", "a4"}));
}

TEST(FairQueueTest, ALateStreamWaitsOneTurnNotTheWholeBacklog) {
  FairQueue<std::string> q;
  for (int i = 0; i < 1000; ++i) q.Push(1, "a");
  EXPECT_EQ(q.Pop(), "a");
  q.Push(2, "b");
  EXPECT_EQ(q.Pop(), "a");  // stream 1's turn came first
  EXPECT_EQ(q.Pop(), "b");
  EXPECT_EQ(q.size(), 998u);
}

TEST(FairQueueTest, AnEmptiedStreamRejoinsAtTheBack) {
  FairQueue<std::string> q;
  q.Push(1, "a1");
  q.Push(2, "b1");
  q.Push(2, "b2");
  EXPECT_EQ(q.Pop(), "a1");  // stream 1 holds no turn now
  q.Push(1, "a2");           // behind stream 2
  EXPECT_EQ(Drain(&q), (std::vector<std::string>{"b1", "a2", "b2"}));
}

TEST(FairQueueTest, MoveOnlyItems) {
  FairQueue<std::unique_ptr<int>> q;
  q.Push(1, std::make_unique<int>(5));
  q.Push(2, std::make_unique<int>(6));
  EXPECT_EQ(*q.Pop(), 5);
  EXPECT_EQ(*q.Pop(), 6);
  EXPECT_TRUE(q.empty());
}

// By cost, a turn is worth the quantum: a stream of items a quarter the cost of another's takes
// four per turn.
TEST(FairQueueTest, ByCostStreamsTakeEqualCostNotEqualItems) {
  FairQueue<std::string> q(/*quantum=*/4);
  for (int i = 0; i < 6; ++i) q.Push(1, "a", 4);
  for (int i = 0; i < 8; ++i) q.Push(2, "b", 1);
  std::string order;
  while (!q.empty()) order += q.Pop();
  EXPECT_EQ(order, "abbbbabbbbaaaa");
}

// An item costing more than a turn is worth is taken when the stream's turn comes, and paid off
// from its next turns, which it passes until it is out of debt.
TEST(FairQueueTest, ByCostAnItemDearerThanATurnIsPaidFromTheNextTurns) {
  FairQueue<std::string> q(/*quantum=*/2);
  q.Push(1, "A", 6);
  q.Push(1, "A", 6);
  for (int i = 0; i < 6; ++i) q.Push(2, "b", 2);
  std::string order;
  while (!q.empty()) {
    const std::string front = q.Front();  // what Pop takes
    const std::string popped = q.Pop();
    EXPECT_EQ(front, popped);
    order += popped;
  }
  EXPECT_EQ(order, "AbbbAbbb");
}

// A stream emptied loses its credit and debt: when it queues again it starts afresh.
TEST(FairQueueTest, ByCostAnEmptiedStreamStartsAfresh) {
  FairQueue<std::string> q(/*quantum=*/2);
  q.Push(1, "A", 10);  // deep in debt once taken
  q.Push(2, "b", 2);
  EXPECT_EQ(q.Pop(), "A");
  q.Push(1, "a", 1);  // behind stream 2, with no debt
  EXPECT_EQ(q.Pop(), "b");
  EXPECT_EQ(q.Pop(), "a");
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace tutti::datapath

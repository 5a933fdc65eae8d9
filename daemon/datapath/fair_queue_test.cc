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

}  // namespace
}  // namespace tutti::datapath

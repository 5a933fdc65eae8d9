// The event hub alone: seq order, ring overflow, resume inside and outside the ring, namespace
// isolation, wake-ups and shutdown.
#include "daemon/store/events.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::store {
namespace {

using ::testing::HasSubstr;

Key K(uint8_t i) {
  Key k;
  k.bytes.fill(i);
  return k;
}

// A deadline already passed: Next returns what is there without waiting.
absl::Time Now() { return absl::InfinitePast(); }

std::vector<uint64_t> Seqs(const std::vector<BlockEvent>& events) {
  std::vector<uint64_t> seqs;
  for (const BlockEvent& e : events) seqs.push_back(e.seq);
  return seqs;
}

TEST(EventHubTest, SeqsStartAtOnePerNamespaceAndComeInOrder) {
  EventHub hub({8, 77, 0});
  bool resumed = true;
  EventHub::Cursor c = hub.Subscribe(1, 0, 0, &resumed);
  EXPECT_FALSE(resumed);
  hub.Publish(1, BlockEventKind::kStored, K(1));
  hub.Publish(2, BlockEventKind::kStored, K(9));
  hub.Publish(1, BlockEventKind::kRemoved, K(1));
  std::vector<BlockEvent> got;
  ASSERT_TRUE(hub.Next(&c, Now(), 100, &got).ok());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].seq, 1u);
  EXPECT_EQ(got[0].kind, BlockEventKind::kStored);
  EXPECT_EQ(got[0].key, K(1));
  EXPECT_EQ(got[1].seq, 2u);
  EXPECT_EQ(got[1].kind, BlockEventKind::kRemoved);
  EXPECT_EQ(c.after_seq, 2u);
  EXPECT_EQ(hub.last_seq(2), 1u) << "namespace 2 counts from 1 of its own";
  EXPECT_EQ(hub.pool_id(), 77u);
  EXPECT_NE(hub.boot_id(), 0u);
}

TEST(EventHubTest, NamespacesAreIsolated) {
  EventHub hub({8, 0, 0});
  bool resumed;
  EventHub::Cursor c = hub.Subscribe(1, 0, 0, &resumed);
  hub.Publish(2, BlockEventKind::kStored, K(2));
  std::vector<BlockEvent> got;
  ASSERT_TRUE(hub.Next(&c, Now(), 100, &got).ok());
  EXPECT_TRUE(got.empty()) << "namespace 2's event reached namespace 1's subscriber";
}

TEST(EventHubTest, NextTakesAtMostMaxEventsAndContinuesWhereItStopped) {
  EventHub hub({16, 0, 0});
  bool resumed;
  EventHub::Cursor c = hub.Subscribe(1, 0, 0, &resumed);
  for (int i = 0; i < 5; ++i) hub.Publish(1, BlockEventKind::kStored, K(i));
  std::vector<BlockEvent> got;
  ASSERT_TRUE(hub.Next(&c, Now(), 3, &got).ok());
  EXPECT_EQ(Seqs(got), (std::vector<uint64_t>{1, 2, 3}));
  ASSERT_TRUE(hub.Next(&c, Now(), 3, &got).ok());
  EXPECT_EQ(Seqs(got), (std::vector<uint64_t>{1, 2, 3, 4, 5}));
}

TEST(EventHubTest, ASubscriberFurtherBehindThanTheRingIsCutOffNamingTheLimit) {
  EventHub hub({4, 0, 0});
  bool resumed;
  EventHub::Cursor slow = hub.Subscribe(1, 0, 0, &resumed);
  for (int i = 0; i < 4; ++i) hub.Publish(1, BlockEventKind::kStored, K(i));
  EventHub::Cursor exact = slow;  // 4 behind, the ring holds 4: still fine
  std::vector<BlockEvent> got;
  ASSERT_TRUE(hub.Next(&exact, Now(), 100, &got).ok());
  EXPECT_EQ(Seqs(got), (std::vector<uint64_t>{1, 2, 3, 4}));
  hub.Publish(1, BlockEventKind::kStored, K(4));  // seq 1 leaves the ring
  absl::Status s = hub.Next(&slow, Now(), 100, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("limits.max_pending_events"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("keeps 4"));
}

TEST(EventHubTest, ResumeInsideTheRingGivesExactlyTheEventsAfter) {
  EventHub hub({4, 0, 0});
  for (int i = 0; i < 6; ++i) hub.Publish(1, BlockEventKind::kStored, K(i));  // ring: 3..6
  bool resumed = false;
  EventHub::Cursor c = hub.Subscribe(1, 2, hub.boot_id(), &resumed);
  EXPECT_TRUE(resumed);
  std::vector<BlockEvent> got;
  ASSERT_TRUE(hub.Next(&c, Now(), 100, &got).ok());
  EXPECT_EQ(Seqs(got), (std::vector<uint64_t>{3, 4, 5, 6}));
  // At the last event: resumed, nothing yet.
  c = hub.Subscribe(1, 6, hub.boot_id(), &resumed);
  EXPECT_TRUE(resumed);
  got.clear();
  ASSERT_TRUE(hub.Next(&c, Now(), 100, &got).ok());
  EXPECT_TRUE(got.empty());
}

TEST(EventHubTest, ResumeOutsideTheRingOrOfAnotherRunStartsFromNow) {
  EventHub hub({4, 0, 0});
  for (int i = 0; i < 6; ++i) hub.Publish(1, BlockEventKind::kStored, K(i));
  bool resumed = true;
  EventHub::Cursor c = hub.Subscribe(1, 1, hub.boot_id(), &resumed);  // seq 2 is gone
  EXPECT_FALSE(resumed);
  EXPECT_EQ(c.after_seq, 6u);
  c = hub.Subscribe(1, 3, hub.boot_id() + 1, &resumed);  // another run's seq 3
  EXPECT_FALSE(resumed);
  EXPECT_EQ(c.after_seq, 6u);
  c = hub.Subscribe(1, 9, hub.boot_id(), &resumed);  // a seq this run never had
  EXPECT_FALSE(resumed);
  EXPECT_EQ(c.after_seq, 6u);
  hub.Publish(1, BlockEventKind::kRemoved, K(0));
  std::vector<BlockEvent> got;
  ASSERT_TRUE(hub.Next(&c, Now(), 100, &got).ok());
  EXPECT_EQ(Seqs(got), (std::vector<uint64_t>{7}));
}

TEST(EventHubTest, AWaitingSubscriberIsWokenByAnEventOfItsNamespace) {
  EventHub hub({8, 0, 0});
  bool resumed;
  EventHub::Cursor c = hub.Subscribe(1, 0, 0, &resumed);
  absl::Notification waiting;
  std::vector<BlockEvent> got;
  absl::Status s;
  std::thread reader([&] {
    waiting.Notify();
    s = hub.Next(&c, absl::InfiniteFuture(), 100, &got);
  });
  waiting.WaitForNotification();
  hub.Publish(1, BlockEventKind::kStored, K(5));  // before or during the wait: either way seen
  reader.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Seqs(got), (std::vector<uint64_t>{1}));
}

TEST(EventHubTest, ShutdownWakesWaitersWithUnavailable) {
  EventHub hub({8, 0, 0});
  bool resumed;
  EventHub::Cursor c = hub.Subscribe(1, 0, 0, &resumed);
  std::vector<BlockEvent> got;
  absl::Status s;
  std::thread reader([&] { s = hub.Next(&c, absl::InfiniteFuture(), 100, &got); });
  hub.Shutdown();
  reader.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST(EventHubTest, PastTheTotalTheOldestHistoriesAreCutAndTheirSubscribersStartOver) {
  EventHub hub({8, 0, 0, /*max_pending_events_total=*/10});
  bool resumed;
  EventHub::Cursor behind = hub.Subscribe(1, 0, hub.boot_id(), &resumed);
  for (int i = 0; i < 6; ++i) hub.Publish(1, BlockEventKind::kStored, K(i));
  for (int i = 0; i < 6; ++i) hub.Publish(2, BlockEventKind::kStored, K(i));
  EXPECT_EQ(hub.events_kept(), 10u) << "namespace 1's two oldest events left";
  std::vector<BlockEvent> got;
  absl::Status s = hub.Next(&behind, Now(), 100, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("limits.max_pending_events_total"));
  hub.Subscribe(1, 1, hub.boot_id(), &resumed);
  EXPECT_FALSE(resumed) << "seq 2 is gone";
  EventHub::Cursor c = hub.Subscribe(1, 2, hub.boot_id(), &resumed);
  EXPECT_TRUE(resumed);
  ASSERT_TRUE(hub.Next(&c, Now(), 100, &got).ok());
  EXPECT_EQ(Seqs(got), (std::vector<uint64_t>{3, 4, 5, 6}));
  // A busy namespace keeps its own ring's worth; the others keep the newest of what is left.
  for (int i = 0; i < 20; ++i) hub.Publish(3, BlockEventKind::kStored, K(i));
  EXPECT_EQ(hub.events_kept(), 10u);
  c = hub.Subscribe(3, 12, hub.boot_id(), &resumed);
  EXPECT_TRUE(resumed) << "namespace 3 keeps seqs 13..20";
  hub.Subscribe(2, 4, hub.boot_id(), &resumed);
  EXPECT_TRUE(resumed) << "namespace 2 keeps seqs 5 and 6";
  hub.Subscribe(2, 3, hub.boot_id(), &resumed);
  EXPECT_FALSE(resumed);
  hub.Subscribe(1, 5, hub.boot_id(), &resumed);
  EXPECT_FALSE(resumed) << "namespace 1 keeps nothing";
  c = hub.Subscribe(1, 6, hub.boot_id(), &resumed);
  EXPECT_TRUE(resumed) << "at its last event: nothing is missing";
  hub.Publish(1, BlockEventKind::kRemoved, K(0));
  got.clear();
  ASSERT_TRUE(hub.Next(&c, Now(), 100, &got).ok());
  EXPECT_EQ(Seqs(got), (std::vector<uint64_t>{7})) << "its sequence goes on";
}

TEST(EventHubTest, ManyNamespacesKeepNoMoreThanTheTotal) {
  EventHub hub({64, 0, 0, /*max_pending_events_total=*/1000});
  for (int round = 0; round < 64; ++round) {
    for (NamespaceId ns = 1; ns <= 1024; ++ns) hub.Publish(ns, BlockEventKind::kStored, K(round));
    EXPECT_LE(hub.events_kept(), 1000u);
  }
  EXPECT_EQ(hub.events_kept(), 1000u);
  EXPECT_EQ(hub.last_seq(1024), 64u);
  bool resumed;
  hub.Subscribe(1024, 63, hub.boot_id(), &resumed);
  EXPECT_TRUE(resumed) << "the newest events are kept";
}

TEST(EventHubTest, PoolIdIsTheUuidsFirstEightBytesBigEndian) {
  std::array<uint8_t, 16> uuid{0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xff};
  EXPECT_EQ(PoolIdOf(uuid), 0x0123456789abcdefull);
  EXPECT_NE(EventHub({8, 0, 0}).pool_id(), 0u) << "no pool id given: a random nonzero one";
  EXPECT_NE(EventHub({8, 5, 0}).boot_id(), EventHub({8, 5, 0}).boot_id());
}

}  // namespace
}  // namespace tutti::store

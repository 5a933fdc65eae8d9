// The heartbeat pets the watchdog and sends the summary only while the liveness check passes.
#include "daemon/service/heartbeat.h"

#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/service/fake_notifier.h"
#include "daemon/service/health.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti::service {
namespace {

using ::testing::ElementsAre;

TEST(HeartbeatTest, AliveBeatPetsAndSummarises) {
  FakeNotifier notifier(absl::Seconds(30));
  Heartbeat beat(&notifier, [] { return absl::OkStatus(); }, [] { return "serving: x"; });
  EXPECT_TRUE(beat.Beat().ok());
  EXPECT_THAT(notifier.Take(), ElementsAre("WATCHDOG=1", "STATUS=serving: x"));
}

TEST(HeartbeatTest, FailedCheckPetsNothingAndSaysWhy) {
  FakeNotifier notifier(absl::Seconds(30));
  bool alive = false;
  Heartbeat beat(
      &notifier,
      [&] { return alive ? absl::OkStatus() : absl::UnavailableError("the writer is stuck"); },
      [] { return "serving"; });
  EXPECT_EQ(beat.Beat().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(notifier.Take(), ElementsAre("STATUS=unhealthy: the writer is stuck"));
  alive = true;
  EXPECT_TRUE(beat.Beat().ok());
  EXPECT_THAT(notifier.Take(), ElementsAre("WATCHDOG=1", "STATUS=serving")) << "recovers";
}

TEST(HeartbeatTest, WithoutWatchdogOnlyStatus) {
  FakeNotifier notifier;
  Heartbeat beat(&notifier, [] { return absl::OkStatus(); }, [] { return "serving"; });
  EXPECT_TRUE(beat.Beat().ok());
  EXPECT_THAT(notifier.Take(), ElementsAre("STATUS=serving"));
  EXPECT_EQ(beat.period(), Heartbeat::kStatusPeriod);
}

TEST(HeartbeatTest, PeriodIsHalfTheWatchdogAtMostTheStatusPeriod) {
  auto period = [](absl::Duration watchdog) {
    FakeNotifier notifier(watchdog);
    return Heartbeat(&notifier, [] { return absl::OkStatus(); }, [] { return ""; }).period();
  };
  EXPECT_EQ(period(absl::Seconds(30)), absl::Seconds(10));
  EXPECT_EQ(period(absl::Seconds(4)), absl::Seconds(2));
  EXPECT_EQ(period(absl::Milliseconds(400)), absl::Milliseconds(200));
}

TEST(HeartbeatTest, ThreadBeatsAtOnceAndStops) {
  FakeNotifier notifier(absl::Seconds(30));
  absl::Notification first;
  Heartbeat beat(
      &notifier,
      [&] {
        if (!first.HasBeenNotified()) first.Notify();
        return absl::OkStatus();
      },
      [] { return "serving"; });
  beat.Start();
  first.WaitForNotification();
  beat.Stop();  // returns at once, not after the 10 s period
  beat.Stop();  // idempotent
  const std::vector<std::string> sent = notifier.Sent();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0], "WATCHDOG=1");
}

TEST(HealthTest, SummaryLine) {
  store::StoreStats st;
  st.slots_used = 130;
  st.slots_total = 4096;
  st.write_backlog_blocks = 3;
  st.write_backlog_bytes = 6u << 20;
  st.write_backlog_age_ms = 14;
  EXPECT_EQ(SummaryLine(2, st),
            "serving: 2 sessions, 130 of 4096 slots used, write backlog 3 blocks / 6 MiB "
            "(oldest 14 ms)");
  EXPECT_EQ(SummaryLine(1, {}).substr(0, 20), "serving: 1 session, ");
}

TEST(HealthTest, WriterThatHoldsABlockPastTheBoundIsStuck) {
  store::StoreStats st;
  EXPECT_TRUE(CheckWriterMoves(st, absl::Seconds(30)).ok()) << "an empty backlog";
  st.write_backlog_blocks = 4;
  st.write_backlog_age_ms = 30000;
  EXPECT_TRUE(CheckWriterMoves(st, absl::Seconds(30)).ok());
  st.write_backlog_age_ms = 30001;
  const absl::Status stuck = CheckWriterMoves(st, absl::Seconds(30));
  EXPECT_EQ(stuck.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(stuck.message(),
            "the store's writer is stuck: the oldest of 4 queued blocks has waited 30001 ms (more "
            "than 30s)");
}

TEST(HealthTest, AnOperatorApiThatDoesNotAnswerIsDown) {
  const Heartbeat::Check check = MakeLivenessCheck(
      "unix:/nonexistent/tuttid.sock.admin", /*store=*/nullptr, absl::Milliseconds(500),
      absl::Seconds(30));
  const absl::Status down = check();
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(down.message()),
              ::testing::HasSubstr("the operator API on unix:/nonexistent/tuttid.sock.admin did "
                                   "not answer Status within 500ms"));
}

}  // namespace
}  // namespace tutti::service

#include "daemon/server/call_gate.h"

#include <optional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tutti::server {
namespace {

TEST(CallGateTest, CountsAdmittedCalls) {
  CallGate gate;
  {
    auto a = gate.Enter();
    auto b = gate.Enter();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(gate.in_flight(), 2u);
  }
  EXPECT_EQ(gate.in_flight(), 0u);
}

TEST(CallGateTest, CloseWaitsForRunningCallsAndRefusesNewOnes) {
  CallGate gate;
  std::optional<absl::StatusOr<CallGate::Pass>> running(gate.Enter());
  absl::Notification closing;
  std::thread finisher([&] {
    closing.WaitForNotification();
    absl::SleepFor(absl::Milliseconds(50));
    running.reset();  // the call finishes
  });
  closing.Notify();
  const absl::Time start = absl::Now();
  EXPECT_EQ(gate.Close(absl::Seconds(10)), 0u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  finisher.join();
  auto late = gate.Enter();
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
}

TEST(CallGateTest, CloseGivesUpAfterTheGrace) {
  CallGate gate;
  auto stuck = gate.Enter();
  EXPECT_EQ(gate.Close(absl::Milliseconds(20)), 1u);
}

TEST(CallGateTest, ServeCallTranslatesAndRefusesWhenClosed) {
  CallGate gate;
  grpc::Status s = ServeCall(&gate, [] { return absl::NotFoundError("no such lease"); });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "no such lease");
  EXPECT_TRUE(ServeCall(&gate, [] { return absl::OkStatus(); }).ok());
  gate.Close(absl::ZeroDuration());
  bool ran = false;
  s = ServeCall(&gate, [&] {
    ran = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace tutti::server

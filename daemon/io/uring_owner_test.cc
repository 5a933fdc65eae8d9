// UringOwner's wake-up: work posted while the owner waits in the kernel on a write that does not
// complete is issued at once, not when that write completes; with a read in flight it waits for a
// completion. The ring's fd is one end of a socket pair: a "slow" item receives from it (it
// completes only when the test writes the other end), a "fast" item sends one byte (it completes
// at once). Each item says whether it stands for a read or a write (TestItem::op).
#include "daemon/io/uring_owner.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace tutti::io::internal {
namespace {

struct TestItem {
  UringPart* part = nullptr;
  bool slow = false;
  Op kind = Op::kRead;
  bool empty() const { return part == nullptr; }
  Op op() const { return kind; }
};

class SocketOps final : public UringItemOps<TestItem> {
 public:
  void Prepare(io_uring_sqe* sqe, TestItem& item, int target) override {
    if (item.slow) {
      io_uring_prep_recv(sqe, target, &in_, sizeof(in_), 0);
    } else {
      io_uring_prep_send(sqe, target, &out_, sizeof(out_), 0);
    }
  }
  bool Complete(TestItem& item, int res) override {
    (item.slow ? slow_res : fast_res).store(res);
    FinishRequest(item.part);
    return false;
  }
  std::atomic<int> slow_res{-1000}, fast_res{-1000};

 private:
  char in_ = 0;
  const char out_ = 'x';
};

// Posts one item as a batch of its own; `done` is notified when it completes. By default the slow
// item stands for a long write and the fast one for a read posted behind it.
void PostItem(UringOwner<TestItem>* owner, bool slow, absl::Notification* done,
              std::optional<Op> as = std::nullopt) {
  const Op kind = as.value_or(slow ? Op::kWrite : Op::kRead);
  auto* batch = new UringBatch;
  batch->done = [done] { done->Notify(); };
  batch->parts.emplace_back();
  batch->parts_left.store(1);
  UringPart* part = &batch->parts[0];
  part->batch = batch;
  part->left = 1;
  owner->Post(part, {TestItem{part, slow, kind}});
}

class UringOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);
    UringOwnerOptions o;
    o.name = "test socket";
    o.depth = 4;
    absl::StatusOr<std::unique_ptr<UringOwner<TestItem>>> owner =
        UringOwner<TestItem>::Create(fds_[0], o, &ops_);
    if (!owner.ok() && absl::IsUnavailable(owner.status())) {
      GTEST_SKIP() << "no io_uring here: " << owner.status();
    }
    ASSERT_TRUE(owner.ok()) << owner.status();
    owner_ = *std::move(owner);
  }
  void TearDown() override {
    owner_.reset();  // completes every item first; the test released the slow one
    close(fds_[1]);
  }

  // Waits until the owner has entered the kernel with the slow item in flight (its enter counted).
  void AwaitSlowInFlight() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (owner_->enter_calls() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GT(owner_->enter_calls(), 0u);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // into its wait
  }
  void ReleaseSlow() {
    const char b = 'y';
    ASSERT_EQ(write(fds_[1], &b, 1), 1);
  }

  int fds_[2] = {-1, -1};
  SocketOps ops_;
  std::unique_ptr<UringOwner<TestItem>> owner_;
};

TEST_F(UringOwnerTest, WorkPostedDuringAWaitIsIssuedWithoutWaitingForTheRequestInFlight) {
  absl::Notification slow_done, fast_done;
  PostItem(owner_.get(), /*slow=*/true, &slow_done);
  AwaitSlowInFlight();
  PostItem(owner_.get(), /*slow=*/false, &fast_done);
  // Without the wake-up the owner sleeps until the slow item completes, which only the test's
  // write below makes it do: the fast item would never complete before it.
  const bool fast_first = fast_done.WaitForNotificationWithTimeout(absl::Seconds(10));
  EXPECT_FALSE(slow_done.HasBeenNotified());
  ReleaseSlow();
  ASSERT_TRUE(slow_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(fast_first) << "the item posted during the wait waited for the one in flight";
  EXPECT_EQ(ops_.fast_res.load(), 1);
  EXPECT_EQ(ops_.slow_res.load(), 1);
  EXPECT_GE(owner_->wakes(), 1u);
  char got = 0;
  EXPECT_EQ(read(fds_[1], &got, 1), 1);  // the fast item's byte reached the other end
  EXPECT_EQ(got, 'x');
}

TEST_F(UringOwnerTest, WorkPostedWhileAReadIsInFlightWaitsForACompletion) {
  // The policy's other half: a read in flight completes soon on a real device, so the owner is
  // not woken for each post (the posts that arrive meanwhile go in one submission).
  absl::Notification slow_done, fast_done;
  PostItem(owner_.get(), /*slow=*/true, &slow_done, Op::kRead);
  PostItem(owner_.get(), /*slow=*/false, &fast_done, Op::kRead);  // may go with the slow one
  ASSERT_TRUE(fast_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  AwaitSlowInFlight();
  absl::Notification late_done;
  PostItem(owner_.get(), /*slow=*/false, &late_done, Op::kWrite);
  EXPECT_FALSE(late_done.WaitForNotificationWithTimeout(absl::Milliseconds(200)))
      << "the owner was woken while a read was in flight";
  EXPECT_EQ(owner_->wakes(), 0u);
  ReleaseSlow();
  ASSERT_TRUE(slow_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(late_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  char got[2] = {0, 0};
  ASSERT_EQ(read(fds_[1], got, 2), 2);  // both fast items' bytes (a stream: may come together)
}

// Process CPU seconds, user and system.
double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

TEST_F(UringOwnerTest, StoppingWithAWriteInFlightWaitsForItWithoutSpinning) {
  absl::Notification slow_done;
  PostItem(owner_.get(), /*slow=*/true, &slow_done);
  AwaitSlowInFlight();
  std::thread destroyer([this] { owner_.reset(); });  // waits for the write in flight
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double cpu0 = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double spent = CpuSeconds() - cpu0;
  EXPECT_FALSE(slow_done.HasBeenNotified());
  ReleaseSlow();
  destroyer.join();
  EXPECT_TRUE(slow_done.HasBeenNotified());
  // An owner that spun until the write completed would have used about all of the 300 ms.
  EXPECT_LT(spent, 0.1) << "the stopping owner spun while waiting for its write";
}

TEST_F(UringOwnerTest, ManyPostsDuringWaitsAllComplete) {
  absl::Notification slow_done;
  PostItem(owner_.get(), /*slow=*/true, &slow_done);
  AwaitSlowInFlight();
  // Posts from several threads at once, each waiting for its item: none is lost between the
  // owner's look at the mailbox and its wait.
  constexpr int kThreads = 4, kEach = 200;
  // Reads the bytes the fast items send as they arrive: a full socket buffer would hold sends.
  std::thread drainer([this] {
    char buf[256];
    for (int got = 0; got < kThreads * kEach;) {
      const ssize_t n = read(fds_[1], buf, sizeof(buf));
      if (n <= 0) return;
      got += static_cast<int>(n);
    }
  });
  std::atomic<int> completed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        absl::Notification done;
        PostItem(owner_.get(), /*slow=*/false, &done);
        if (done.WaitForNotificationWithTimeout(absl::Seconds(10))) ++completed;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  drainer.join();
  EXPECT_EQ(completed.load(), kThreads * kEach);
  EXPECT_FALSE(slow_done.HasBeenNotified());
  ReleaseSlow();
  ASSERT_TRUE(slow_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

}  // namespace
}  // namespace tutti::io::internal

// The I/O scheduler through a sink drained by hand, with a manual clock: read priority, the write
// caps, partial and failed completions, done exactly once, multi-device batches.
#include "daemon/datapath/scheduler.h"

#include <algorithm>
#include <cerrno>
#include <deque>
#include <string>

#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

constexpr uint32_t kKiB = 1024;

// Records emissions; the test completes them by hand, in any order.
class HandSink : public IoSink {
 public:
  struct Emitted {
    absl::Span<io::IoRequest> reqs;
    std::function<void()> done;
  };
  void Emit(absl::Span<io::IoRequest> batch, std::function<void()> done) override {
    emitted_.push_back(Emitted{batch, std::move(done)});
  }
  size_t pending() const { return emitted_.size(); }
  Emitted& at(size_t i) { return emitted_[i]; }
  // Completes emission `i` (every request in full unless told otherwise) and forgets it.
  void Complete(size_t i, std::function<int64_t(const io::IoRequest&)> result = nullptr) {
    Emitted e = std::move(emitted_[i]);
    emitted_.erase(emitted_.begin() + static_cast<long>(i));
    for (io::IoRequest& r : e.reqs) r.result = result ? result(r) : r.len;
    e.done();
  }

 private:
  std::deque<Emitted> emitted_;
};

io::IoRequest Req(uint32_t file, uint64_t offset, uint32_t len) {
  return io::IoRequest{io::Op::kRead, file, offset, nullptr, len, -1};
}

class SchedulerTest : public ::testing::Test {
 protected:
  void Make(uint32_t devices, uint64_t while_reading = 64 * kKiB, uint64_t max = 256 * kKiB) {
    IoSchedulerOptions o;
    o.num_devices = devices;
    o.write_bytes_in_flight_while_reading = while_reading;
    o.max_write_bytes_in_flight = max;
    auto s = IoScheduler::Create(o, &sink_, &clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    sched_ = std::move(s).value();
  }
  // Posts `reqs` and counts its done calls in *calls.
  void Post(IoClass cls, std::vector<io::IoRequest>* reqs, int* calls) {
    sched_->Post(cls, absl::MakeSpan(*reqs), [calls] { ++*calls; });
  }

  ManualClock clock_{1000};
  HandSink sink_;
  std::unique_ptr<IoScheduler> sched_;
};

TEST_F(SchedulerTest, CreateRefusesBadOptions) {
  IoSchedulerOptions o;
  EXPECT_EQ(IoScheduler::Create(o, nullptr, &clock_).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.num_devices = 0;
  EXPECT_EQ(IoScheduler::Create(o, &sink_, &clock_).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.num_devices = 1;
  o.write_bytes_in_flight_while_reading = 0;
  EXPECT_EQ(IoScheduler::Create(o, &sink_, &clock_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, ReadPostedAfterQueuedWritesIsEmittedBeforeThem) {
  Make(1, /*while_reading=*/64 * kKiB, /*max=*/64 * kKiB);
  std::vector<io::IoRequest> w1{Req(0, 0, 64 * kKiB)}, w2{Req(0, 1 << 20, 64 * kKiB)};
  std::vector<io::IoRequest> r{Req(0, 2 << 20, 4 * kKiB)};
  int w1_done = 0, w2_done = 0, r_done = 0;
  Post(IoClass::kWrite, &w1, &w1_done);
  Post(IoClass::kWrite, &w2, &w2_done);  // waits: the cap is full
  ASSERT_EQ(sink_.pending(), 1u);
  Post(IoClass::kRead, &r, &r_done);
  ASSERT_EQ(sink_.pending(), 2u) << "the read goes at once, past the queued write";
  EXPECT_EQ(sink_.at(1).reqs[0].op, io::Op::kRead);
  EXPECT_EQ(sink_.at(1).reqs[0].offset, 2u << 20);
  sink_.Complete(0);  // w1
  EXPECT_EQ(w1_done, 1);
  ASSERT_EQ(sink_.pending(), 2u) << "w2 goes once w1's bytes leave the cap";
  EXPECT_EQ(sink_.at(1).reqs[0].op, io::Op::kWrite);
  EXPECT_EQ(sink_.at(1).reqs[0].offset, 1u << 20);
  sink_.Complete(0);
  sink_.Complete(0);
  EXPECT_EQ(r_done, 1);
  EXPECT_EQ(w2_done, 1);
}

TEST_F(SchedulerTest, SmallerEmissionsTopADeviceUpAsPartsOfItsWritesComplete) {
  IoSchedulerOptions o;
  o.num_devices = 1;
  o.write_bytes_in_flight_while_reading = 64 * kKiB;
  o.max_write_bytes_in_flight = 256 * kKiB;
  o.write_emission_bytes = 64 * kKiB;
  auto s = IoScheduler::Create(o, &sink_, &clock_);
  ASSERT_TRUE(s.ok()) << s.status();
  sched_ = std::move(s).value();
  std::vector<io::IoRequest> w;
  for (uint32_t i = 0; i < 12; ++i) w.push_back(Req(0, i * 32 * kKiB, 32 * kKiB));
  int w_done = 0;
  Post(IoClass::kWrite, &w, &w_done);
  // 256 KiB in flight, as four emissions of two 32 KiB writes, in posting order.
  ASSERT_EQ(sink_.pending(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(sink_.at(i).reqs.size(), 2u);
    EXPECT_EQ(sink_.at(i).reqs[0].offset, i * 64 * kKiB);
  }
  EXPECT_EQ(sched_->stats().writes_queued, 4u);
  // One emission completes: 64 KiB more go at once while the other three stay in flight.
  sink_.Complete(0);
  ASSERT_EQ(sink_.pending(), 4u);
  EXPECT_EQ(sink_.at(3).reqs.size(), 2u);
  EXPECT_EQ(sink_.at(3).reqs[0].offset, 256 * kKiB);
  EXPECT_EQ(sched_->stats().devices[0].write_bytes_in_flight, 256 * kKiB);
  while (sink_.pending() > 0) sink_.Complete(0);
  EXPECT_EQ(w_done, 1);
  for (const io::IoRequest& r : w) EXPECT_EQ(r.result, static_cast<int64_t>(r.len));
}

TEST_F(SchedulerTest, WritesStayUnderTheCapWhileReadingAndDrainOnceReadsStop) {
  Make(1, /*while_reading=*/64 * kKiB, /*max=*/256 * kKiB);
  std::vector<io::IoRequest> r{Req(0, 0, 4 * kKiB)};
  int r_done = 0, w_done = 0;
  Post(IoClass::kRead, &r, &r_done);
  ASSERT_EQ(sink_.pending(), 1u);
  std::vector<io::IoRequest> w;
  for (uint32_t i = 0; i < 8; ++i) w.push_back(Req(0, (i + 1) * 64 * kKiB, 32 * kKiB));
  Post(IoClass::kWrite, &w, &w_done);
  ASSERT_EQ(sink_.pending(), 2u);
  EXPECT_EQ(sink_.at(1).reqs.size(), 2u) << "64 KiB of 32 KiB writes while a read is in flight";
  EXPECT_EQ(sched_->stats().writes_queued, 6u);
  // Completing writes while the read stays in flight lets only another 64 KiB go.
  sink_.Complete(1);
  ASSERT_EQ(sink_.pending(), 2u);
  EXPECT_EQ(sink_.at(1).reqs.size(), 2u);
  // The read completes: the rest (128 KiB, under the 256 KiB cap) goes with the next completion.
  sink_.Complete(0);
  EXPECT_EQ(r_done, 1);
  ASSERT_EQ(sink_.pending(), 2u);
  EXPECT_EQ(sink_.at(1).reqs.size(), 4u) << "with no read, up to 256 KiB in flight";
  EXPECT_EQ(sched_->stats().writes_queued, 0u);
  sink_.Complete(0);
  sink_.Complete(0);
  EXPECT_EQ(w_done, 1);
  const IoSchedulerStats st = sched_->stats();
  EXPECT_EQ(st.writes_posted, 8u);
  EXPECT_EQ(st.writes_emitted, 8u);
  EXPECT_EQ(st.write_bytes, 8u * 32 * kKiB);
  EXPECT_EQ(st.reads_posted, 1u);
  EXPECT_EQ(st.reads_emitted, 1u);
  EXPECT_EQ(st.read_bytes, 4u * kKiB);
}

TEST_F(SchedulerTest, WriteLargerThanTheCapGoesAlone) {
  Make(1, /*while_reading=*/64 * kKiB, /*max=*/64 * kKiB);
  std::vector<io::IoRequest> w{Req(0, 0, 256 * kKiB), Req(0, 1 << 20, 4 * kKiB)};
  int done = 0;
  Post(IoClass::kWrite, &w, &done);
  ASSERT_EQ(sink_.pending(), 1u);
  EXPECT_EQ(sink_.at(0).reqs.size(), 1u);
  sink_.Complete(0);
  ASSERT_EQ(sink_.pending(), 1u);
  sink_.Complete(0);
  EXPECT_EQ(done, 1);
}

TEST_F(SchedulerTest, WriteWaitIsMeasuredOnTheClock) {
  Make(1, /*while_reading=*/4 * kKiB, /*max=*/4 * kKiB);
  std::vector<io::IoRequest> w{Req(0, 0, 4 * kKiB), Req(0, 4 * kKiB, 4 * kKiB)};
  int done = 0;
  Post(IoClass::kWrite, &w, &done);
  clock_.AdvanceMs(70);
  sink_.Complete(0);
  clock_.AdvanceMs(5);
  sink_.Complete(0);
  EXPECT_EQ(done, 1);
  EXPECT_EQ(sched_->stats().write_wait_ms, 70u);
  EXPECT_EQ(sched_->stats().write_wait_max_ms, 70u);
}

// Completion latency goes into the device's histogram of its class, one count per request, in the
// bucket of the clock's time from emission to completion; in-flight figures are per device.
TEST_F(SchedulerTest, CompletionLatencyIsMeasuredPerDeviceAndClass) {
  Make(2);
  std::vector<io::IoRequest> r{Req(1, 0, 4 * kKiB), Req(1, 4 * kKiB, 4 * kKiB)};
  std::vector<io::IoRequest> w{Req(0, 0, 8 * kKiB)};
  int done = 0;
  Post(IoClass::kRead, &r, &done);
  Post(IoClass::kWrite, &w, &done);
  IoSchedulerStats s = sched_->stats();
  ASSERT_EQ(s.devices.size(), 2u);
  EXPECT_EQ(s.devices[1].reads_in_flight, 2u);
  EXPECT_EQ(s.devices[0].write_bytes_in_flight, 8 * kKiB);
  clock_.AdvanceMs(3);
  sink_.Complete(0);  // the reads: 3 ms
  clock_.AdvanceMs(40);
  sink_.Complete(0);  // the write: 43 ms
  EXPECT_EQ(done, 2);
  s = sched_->stats();
  const LatencyHistogram& reads = s.devices[1].read_latency;
  EXPECT_EQ(reads.count, 2u);
  EXPECT_EQ(reads.sum_us, 6000u);
  EXPECT_EQ(reads.counts[6], 2u);  // (2.5 ms, 5 ms]
  const LatencyHistogram& writes = s.devices[0].write_latency;
  EXPECT_EQ(writes.count, 1u);
  EXPECT_EQ(writes.sum_us, 43000u);
  EXPECT_EQ(writes.counts[9], 1u);  // (25 ms, 50 ms]
  EXPECT_EQ(s.devices[0].read_latency.count, 0u);
  EXPECT_EQ(s.devices[1].write_latency.count, 0u);
  EXPECT_EQ(s.devices[1].reads_in_flight, 0u);
  EXPECT_EQ(s.devices[0].write_bytes_in_flight, 0u);
}

TEST(LatencyHistogramTest, BoundsAreInclusiveAndTheLastBucketTakesTheRest) {
  LatencyHistogram h;
  h.Record(-5, 1);       // 0
  h.Record(50, 1);       // <= 50 us
  h.Record(51, 1);       // (50, 100]
  h.Record(5000000, 2);  // past 1 s
  EXPECT_EQ(h.counts[0], 2u);
  EXPECT_EQ(h.counts[1], 1u);
  EXPECT_EQ(h.counts[kLatencyBoundsUs.size()], 2u);
  EXPECT_EQ(h.count, 5u);
  EXPECT_EQ(h.sum_us, 50u + 51u + 10000000u);
}

TEST_F(SchedulerTest, PartialAndFailedResultsReachTheCaller) {
  Make(1);
  std::vector<io::IoRequest> r{Req(0, 0, 8 * kKiB), Req(0, 8 * kKiB, 8 * kKiB),
                               Req(0, 16 * kKiB, 8 * kKiB)};
  int done = 0;
  Post(IoClass::kRead, &r, &done);
  ASSERT_EQ(sink_.pending(), 1u);
  sink_.Complete(0, [](const io::IoRequest& q) -> int64_t {
    if (q.offset == 0) return q.len;
    if (q.offset == 8 * kKiB) return 4 * kKiB;  // short
    return -EIO;
  });
  EXPECT_EQ(done, 1);
  EXPECT_EQ(r[0].result, 8 * kKiB);
  EXPECT_EQ(r[1].result, 4 * kKiB);
  EXPECT_EQ(r[2].result, -EIO);
}

TEST_F(SchedulerTest, MultiDeviceBatchIsSplitAndJoinedCompletedInAnyOrder) {
  Make(3);
  std::vector<io::IoRequest> r{Req(2, 0, 4 * kKiB), Req(0, 0, 4 * kKiB), Req(2, 4 * kKiB, 4 * kKiB),
                               Req(1, 0, 4 * kKiB)};
  int done = 0;
  Post(IoClass::kRead, &r, &done);
  ASSERT_EQ(sink_.pending(), 3u) << "one emission per device";
  for (size_t i = 0; i < 3; ++i) {
    const auto& reqs = sink_.at(i).reqs;
    for (const io::IoRequest& q : reqs) EXPECT_EQ(q.file, reqs[0].file);
  }
  // The device-2 emission holds both of its requests, in posted order.
  size_t two = 0;
  while (sink_.at(two).reqs[0].file != 2) ++two;
  ASSERT_EQ(sink_.at(two).reqs.size(), 2u);
  EXPECT_EQ(sink_.at(two).reqs[1].offset, 4 * kKiB);
  sink_.Complete(
      two, [](const io::IoRequest& q) { return q.offset == 0 ? int64_t{-EIO} : int64_t{q.len}; });
  EXPECT_EQ(done, 0);
  sink_.Complete(1);
  EXPECT_EQ(done, 0);
  sink_.Complete(0);
  EXPECT_EQ(done, 1) << "once, after the last device";
  EXPECT_EQ(r[0].result, -EIO);
  EXPECT_EQ(r[1].result, 4 * kKiB);
  EXPECT_EQ(r[2].result, 4 * kKiB);
  EXPECT_EQ(r[3].result, 4 * kKiB);
}

TEST_F(SchedulerTest, WritesOfOneDeviceDoNotWaitForAnotherDevicesReads) {
  Make(2, /*while_reading=*/4 * kKiB, /*max=*/64 * kKiB);
  std::vector<io::IoRequest> r{Req(0, 0, 4 * kKiB)};
  std::vector<io::IoRequest> w{Req(1, 0, 16 * kKiB), Req(1, 16 * kKiB, 16 * kKiB)};
  int r_done = 0, w_done = 0;
  Post(IoClass::kRead, &r, &r_done);
  Post(IoClass::kWrite, &w, &w_done);
  ASSERT_EQ(sink_.pending(), 2u);
  EXPECT_EQ(sink_.at(1).reqs.size(), 2u) << "device 1 reads nothing: its full cap applies";
  sink_.Complete(1);
  sink_.Complete(0);
  EXPECT_EQ(r_done, 1);
  EXPECT_EQ(w_done, 1);
}

// Bytes emitted are counted per device and op (tutti_io_device_bytes_total), a queued write only
// once it is emitted; the totals are their sums.
TEST_F(SchedulerTest, BytesEmittedAreCountedPerDevice) {
  Make(3, /*while_reading=*/4 * kKiB, /*max=*/64 * kKiB);
  std::vector<io::IoRequest> r{Req(2, 0, 8 * kKiB), Req(0, 0, 4 * kKiB),
                               Req(2, 8 * kKiB, 4 * kKiB)};
  std::vector<io::IoRequest> w{Req(2, 0, 16 * kKiB), Req(2, 16 * kKiB, 16 * kKiB),
                               Req(1, 0, 32 * kKiB)};
  int r_done = 0, w_done = 0;
  Post(IoClass::kRead, &r, &r_done);
  Post(IoClass::kWrite, &w, &w_done);
  IoSchedulerStats st = sched_->stats();
  ASSERT_EQ(st.devices.size(), 3u);
  EXPECT_EQ(st.devices[0].read_bytes, 4 * kKiB);
  EXPECT_EQ(st.devices[1].read_bytes, 0u);
  EXPECT_EQ(st.devices[2].read_bytes, 12 * kKiB);
  EXPECT_EQ(st.devices[1].write_bytes, 32 * kKiB) << "device 1 reads nothing: its write goes";
  // Device 2 reads: its first write goes alone (larger than the 4 KiB cap), the second waits.
  EXPECT_EQ(st.devices[2].write_bytes, 16 * kKiB) << "the queued write is not counted yet";
  while (sink_.pending() > 0) sink_.Complete(0);
  st = sched_->stats();
  EXPECT_EQ(st.devices[2].write_bytes, 32 * kKiB);
  EXPECT_EQ(st.read_bytes, st.devices[0].read_bytes + st.devices[1].read_bytes +
                               st.devices[2].read_bytes);
  EXPECT_EQ(st.write_bytes, 64 * kKiB);
  EXPECT_EQ(r_done, 1);
  EXPECT_EQ(w_done, 1);
}

TEST_F(SchedulerTest, EmptyBatchAndBadFileCompleteAtOnce) {
  Make(1);
  std::vector<io::IoRequest> none;
  int done = 0;
  Post(IoClass::kRead, &none, &done);
  EXPECT_EQ(done, 1);
  std::vector<io::IoRequest> bad{Req(5, 0, 4 * kKiB)};
  Post(IoClass::kWrite, &bad, &done);
  EXPECT_EQ(done, 2);
  EXPECT_EQ(bad[0].result, -EINVAL);
  EXPECT_EQ(sink_.pending(), 0u);
  std::vector<io::IoRequest> mixed{Req(5, 0, 4 * kKiB), Req(0, 0, 4 * kKiB)};
  Post(IoClass::kRead, &mixed, &done);
  EXPECT_EQ(done, 2) << "the valid request is still in flight";
  sink_.Complete(0);
  EXPECT_EQ(done, 3);
  EXPECT_EQ(mixed[0].result, -EINVAL);
  EXPECT_EQ(mixed[1].result, 4 * kKiB);
}

// A sink that completes inside Emit: the caller's done may run inside Post, and may Post again.
class InlineSink : public IoSink {
 public:
  void Emit(absl::Span<io::IoRequest> batch, std::function<void()> done) override {
    for (io::IoRequest& r : batch) r.result = r.len;
    ++emissions;
    done();
  }
  int emissions = 0;
};

TEST(SchedulerInlineTest, DoneMayPostAgain) {
  ManualClock clock;
  InlineSink sink;
  auto sched = IoScheduler::Create(IoSchedulerOptions{}, &sink, &clock);
  ASSERT_TRUE(sched.ok());
  std::vector<io::IoRequest> a{Req(0, 0, 4 * kKiB)}, b{Req(0, 4 * kKiB, 4 * kKiB)};
  int done = 0;
  (*sched)->Post(IoClass::kWrite, absl::MakeSpan(a), [&] {
    ++done;
    (*sched)->Post(IoClass::kRead, absl::MakeSpan(b), [&] { ++done; });
  });
  EXPECT_EQ(done, 2);
  EXPECT_EQ(sink.emissions, 2);
  EXPECT_EQ(b[0].result, 4 * kKiB);
}

// The write window with a latency target: late writes halve it, on-time ones grow it.
class WriteWindowTest : public SchedulerTest {
 protected:
  void MakeTargeted(int64_t target_us, uint64_t emission_bytes = 0) {
    IoSchedulerOptions o;
    o.num_devices = 1;
    o.write_bytes_in_flight_while_reading = 64 * kKiB;
    o.max_write_bytes_in_flight = 256 * kKiB;
    o.write_emission_bytes = emission_bytes;
    o.write_latency_target_us = target_us;
    auto s = IoScheduler::Create(o, &sink_, &clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    sched_ = std::move(s).value();
  }
  uint64_t Window() const { return sched_->stats().devices[0].write_window; }
  uint64_t Cuts() const { return sched_->stats().devices[0].write_window_cuts; }
  // A 4 KiB read of device 0, emitted and completed now (writes pending stay pending).
  void ReadOnce() {
    std::vector<io::IoRequest> r{Req(0, 1ull << 30, 4 * kKiB)};
    int done = 0;
    const size_t before = sink_.pending();
    Post(IoClass::kRead, &r, &done);  // emitted at once, after what is pending
    ASSERT_EQ(sink_.pending(), before + 1);
    sink_.Complete(before);
    ASSERT_EQ(done, 1);
  }
  std::vector<io::IoRequest> Writes(int n) {
    std::vector<io::IoRequest> w;
    for (int i = 0; i < n; ++i) w.push_back(Req(0, uint64_t(i) << 20, 64 * kKiB));
    return w;
  }
};

TEST_F(WriteWindowTest, LateWritesHalveTheWindowAndOnTimeOnesGrowIt) {
  MakeTargeted(/*target_us=*/5000);
  ReadOnce();  // reads are near: latency counts
  std::vector<io::IoRequest> w = Writes(8);
  int calls = 0;
  Post(IoClass::kWrite, &w, &calls);
  ASSERT_EQ(sink_.pending(), 1u);
  EXPECT_EQ(sink_.at(0).reqs.size(), 4u);  // the whole window, 256 KiB
  EXPECT_EQ(Window(), 256 * kKiB);
  clock_.AdvanceMs(10);  // later than 5 ms
  sink_.Complete(0);
  EXPECT_EQ(Window(), 128 * kKiB);
  EXPECT_EQ(sched_->stats().devices[0].write_window_cuts, 1u);
  ASSERT_EQ(sink_.pending(), 1u);
  EXPECT_EQ(sink_.at(0).reqs.size(), 2u);  // what the halved window lets go
  clock_.AdvanceMs(1);  // on time
  sink_.Complete(0);
  EXPECT_EQ(Window(), 256 * kKiB);  // grown by the emission's 128 KiB, up to the maximum
  ASSERT_EQ(sink_.pending(), 1u);
  EXPECT_EQ(sink_.at(0).reqs.size(), 2u);  // the last two
  sink_.Complete(0);
  EXPECT_EQ(calls, 1);
}

TEST_F(WriteWindowTest, EmissionsLateTogetherCutOnceAndNeverBelowTheReadingCap) {
  MakeTargeted(/*target_us=*/5000, /*emission_bytes=*/64 * kKiB);
  ReadOnce();  // reads are near for the whole test (80 ms of 1 s)
  std::vector<io::IoRequest> w = Writes(16);
  int calls = 0;
  Post(IoClass::kWrite, &w, &calls);
  ASSERT_EQ(sink_.pending(), 4u);  // four emissions of 64 KiB fill the 256 KiB window
  clock_.AdvanceMs(20);
  for (int i = 0; i < 4; ++i) sink_.Complete(0);  // all late, at the same instant
  EXPECT_EQ(Window(), 128 * kKiB);                // one cut for the four
  EXPECT_EQ(sched_->stats().devices[0].write_window_cuts, 1u);
  // Late again, one target interval on each time (only what was in flight before the clock
  // moved; what those completions let go waits for the next round): 64 KiB, and it stays there.
  for (int round = 0; round < 3 && sink_.pending() > 0; ++round) {
    clock_.AdvanceMs(20);
    for (size_t n = sink_.pending(); n > 0; --n) sink_.Complete(0);
  }
  EXPECT_EQ(Window(), 64 * kKiB);
  EXPECT_EQ(sched_->stats().devices[0].write_window_cuts, 2u);  // 256 -> 128 -> 64, then floor
  while (sink_.pending() > 0) sink_.Complete(0);
  EXPECT_EQ(calls, 1);
}

TEST_F(WriteWindowTest, LateWritesWithNoReadNearLeaveTheWindowWhole) {
  MakeTargeted(/*target_us=*/5000);
  std::vector<io::IoRequest> w = Writes(8);
  int calls = 0;
  Post(IoClass::kWrite, &w, &calls);  // no read ever: a device that only writes
  clock_.AdvanceMs(10);
  sink_.Complete(0);
  EXPECT_EQ(Window(), 256 * kKiB);
  EXPECT_EQ(Cuts(), 0u);
  ASSERT_EQ(sink_.pending(), 1u);
  EXPECT_EQ(sink_.at(0).reqs.size(), 4u);  // the whole window again
  // A read, then late writes: cut. Once the read is more than read_memory_us behind: not.
  ReadOnce();
  clock_.AdvanceMs(10);
  sink_.Complete(0);
  EXPECT_EQ(Window(), 128 * kKiB);
  EXPECT_EQ(Cuts(), 1u);
  std::vector<io::IoRequest> more = Writes(8);
  Post(IoClass::kWrite, &more, &calls);
  clock_.AdvanceMs(1001);  // the read is now 1001 ms old (read_memory_us: 1 s)
  for (size_t n = sink_.pending(); n > 0; --n) sink_.Complete(0);
  EXPECT_EQ(Cuts(), 1u);
  EXPECT_GT(Window(), 128 * kKiB);  // grown by what completed, late as it was
  while (sink_.pending() > 0) sink_.Complete(0);
  EXPECT_EQ(calls, 2);
}

TEST_F(WriteWindowTest, AReadInFlightMakesLateWritesCut) {
  MakeTargeted(/*target_us=*/5000);
  std::vector<io::IoRequest> w = Writes(8);
  int calls = 0, read_done = 0;
  Post(IoClass::kWrite, &w, &calls);  // emission 0: 256 KiB of writes
  clock_.AdvanceMs(2000);             // long after any read (there was none)
  std::vector<io::IoRequest> r{Req(0, 1ull << 30, 4 * kKiB)};
  Post(IoClass::kRead, &r, &read_done);  // emission 1, left in flight
  clock_.AdvanceMs(10);
  sink_.Complete(0);  // the writes, late, with a read in flight
  EXPECT_EQ(Cuts(), 1u);
  EXPECT_EQ(Window(), 128 * kKiB);
  while (sink_.pending() > 0) sink_.Complete(0);
  EXPECT_EQ(read_done, 1);
  EXPECT_EQ(calls, 1);
}

TEST_F(WriteWindowTest, WithoutATargetTheWindowStaysAtTheMaximum) {
  MakeTargeted(/*target_us=*/0);
  std::vector<io::IoRequest> w = Writes(8);
  int calls = 0;
  Post(IoClass::kWrite, &w, &calls);
  clock_.AdvanceMs(1000);
  sink_.Complete(0);
  EXPECT_EQ(Window(), 256 * kKiB);
  ASSERT_EQ(sink_.pending(), 1u);
  EXPECT_EQ(sink_.at(0).reqs.size(), 4u);
  sink_.Complete(0);
  EXPECT_EQ(calls, 1);
}

TEST_F(WriteWindowTest, CreateRefusesANegativeTarget) {
  IoSchedulerOptions o;
  o.write_latency_target_us = -1;
  EXPECT_EQ(IoScheduler::Create(o, &sink_, &clock_).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.write_latency_target_us = 0;
  o.read_memory_us = -1;
  EXPECT_EQ(IoScheduler::Create(o, &sink_, &clock_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --- the read cap and streams' turns ------------------------------------------------------------

class ReadTurnsTest : public SchedulerTest {
 protected:
  void MakeCapped(uint32_t devices, uint64_t read_cap, uint64_t turn_bytes = 0) {
    IoSchedulerOptions o;
    o.num_devices = devices;
    o.max_read_bytes_in_flight = read_cap;
    o.read_turn_bytes = turn_bytes;
    o.write_bytes_in_flight_while_reading = 64 * kKiB;
    o.max_write_bytes_in_flight = 256 * kKiB;
    auto s = IoScheduler::Create(o, &sink_, &clock_);
    ASSERT_TRUE(s.ok()) << s.status();
    sched_ = std::move(s).value();
  }
  // Posts each of `parts` as a batch of its own (one 64 KiB read of device `file` each) for
  // `stream`, counting done calls in *calls.
  void PostParts(uint64_t stream, std::vector<std::vector<io::IoRequest>>* parts, int* calls) {
    for (auto& p : *parts) {
      sched_->Post(
          IoClass::kRead, absl::MakeSpan(p), [calls] { ++*calls; }, stream);
    }
  }
  static std::vector<std::vector<io::IoRequest>> Parts(uint32_t file, uint64_t base, int n) {
    std::vector<std::vector<io::IoRequest>> out;
    for (int i = 0; i < n; ++i) out.push_back({Req(file, base + i * 64 * kKiB, 64 * kKiB)});
    return out;
  }
};

TEST_F(ReadTurnsTest, NoCapEmitsEveryReadAtOnce) {
  Make(1);
  auto a = Parts(0, 0, 8);
  int a_done = 0;
  PostParts(1, &a, &a_done);
  EXPECT_EQ(sink_.pending(), 8u);
  EXPECT_EQ(sched_->stats().devices[0].reads_queued, 0u);
  while (sink_.pending() > 0) sink_.Complete(0);
  EXPECT_EQ(a_done, 8);
}

TEST_F(ReadTurnsTest, ReadsPastTheCapWaitAndGoAsOthersComplete) {
  MakeCapped(1, 128 * kKiB);
  auto a = Parts(0, 0, 6);
  int a_done = 0;
  PostParts(1, &a, &a_done);
  ASSERT_EQ(sink_.pending(), 2u) << "128 KiB in flight, the rest waits";
  EXPECT_EQ(sched_->stats().devices[0].reads_queued, 4u);
  EXPECT_EQ(sched_->stats().devices[0].reads_in_flight, 2u);
  sink_.Complete(0);
  EXPECT_EQ(a_done, 1);
  ASSERT_EQ(sink_.pending(), 2u) << "one completed, one more went";
  EXPECT_EQ(sink_.at(1).reqs[0].offset, 2 * 64 * kKiB) << "one stream keeps its order";
  while (sink_.pending() > 0) sink_.Complete(0);
  EXPECT_EQ(a_done, 6);
  EXPECT_EQ(sched_->stats().devices[0].reads_queued, 0u);
  EXPECT_EQ(sched_->stats().reads_emitted, 6u);
}

TEST_F(ReadTurnsTest, ALaterStreamGoesNextNotBehindTheBacklog) {
  MakeCapped(1, 128 * kKiB);
  auto big = Parts(0, 0, 100);
  auto small = Parts(0, 1ull << 30, 3);
  int big_done = 0, small_done = 0;
  PostParts(1, &big, &big_done);
  PostParts(2, &small, &small_done);
  ASSERT_EQ(sink_.pending(), 2u);
  // As reads complete, the two streams alternate, the big one's turn first (it queued first): the
  // small one's three reads are all out after six completions, not after the big one's 98.
  std::vector<uint64_t> order;
  for (int i = 0; i < 6; ++i) {
    sink_.Complete(0);
    order.push_back(sink_.at(sink_.pending() - 1).reqs[0].offset >= (1ull << 30) ? 2 : 1);
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 2, 1, 2, 1, 2}));
  while (sink_.pending() > 0) sink_.Complete(0);
  EXPECT_EQ(small_done, 3);
  EXPECT_EQ(big_done, 100);
}

// The order in which parts of a big stream (256 KiB each, 'B') and a small one (64 KiB, 's')
// queued behind it are emitted, completing the oldest emission each time, under a 256 KiB cap.
std::string EmissionOrder(HandSink* sink, IoScheduler* sched, size_t emissions) {
  std::vector<std::vector<io::IoRequest>> big, small;
  for (int i = 0; i < 40; ++i) big.push_back({Req(0, i * 256 * kKiB, 256 * kKiB)});
  for (int i = 0; i < 40; ++i) small.push_back({Req(0, (1ull << 30) + i * 64 * kKiB, 64 * kKiB)});
  for (auto& p : big) {
    sched->Post(
        IoClass::kRead, absl::MakeSpan(p), [] {}, /*stream=*/1);
  }
  for (auto& p : small) {
    sched->Post(
        IoClass::kRead, absl::MakeSpan(p), [] {}, /*stream=*/2);
  }
  auto kind = [&](size_t i) { return sink->at(i).reqs[0].offset >= (1ull << 30) ? 's' : 'B'; };
  std::string order;
  for (size_t i = 0; i < sink->pending(); ++i) order += kind(i);
  while (order.size() < emissions && sink->pending() > 0) {
    const size_t before = sink->pending();
    sink->Complete(0);
    for (size_t i = before - 1; i < sink->pending(); ++i) order += kind(i);
  }
  while (sink->pending() > 0) sink->Complete(0);
  return order.substr(0, emissions);
}

// With turns worth 256 KiB, the small stream's 64 KiB parts go four to each of the big one's
// 256 KiB parts: as many bytes each. With turns of one part each it would get a quarter of the
// big one's bytes.
TEST_F(ReadTurnsTest, TurnsWorthBytesGiveSmallPartsAsManyBytes) {
  MakeCapped(1, 256 * kKiB, /*turn_bytes=*/256 * kKiB);
  const std::string by_bytes = EmissionOrder(&sink_, sched_.get(), 22);
  MakeCapped(1, 256 * kKiB);
  const std::string by_parts = EmissionOrder(&sink_, sched_.get(), 22);
  auto bytes = [](const std::string& order, char k) {
    return std::count(order.begin(), order.end(), k) * (k == 's' ? 64 : 256);
  };
  // The first big part went before the small stream queued; from then on, whole rounds.
  EXPECT_EQ(by_bytes, "BBssssBssssBssssBssssB");
  EXPECT_EQ(by_parts, "BBsBsBsBsBsBsBsBsBsBsB");
  EXPECT_EQ(bytes(by_bytes.substr(1, 20), 's'), bytes(by_bytes.substr(1, 20), 'B'));
  EXPECT_EQ(bytes(by_parts.substr(1, 20), 's') * 4, bytes(by_parts.substr(1, 20), 'B'));
}

TEST_F(ReadTurnsTest, DevicesHaveCapsAndTurnsOfTheirOwn) {
  MakeCapped(2, 64 * kKiB);
  std::vector<io::IoRequest> both{Req(0, 0, 64 * kKiB), Req(1, 0, 64 * kKiB)};
  std::vector<io::IoRequest> more{Req(0, 64 * kKiB, 64 * kKiB), Req(1, 64 * kKiB, 64 * kKiB)};
  int both_done = 0, more_done = 0;
  Post(IoClass::kRead, &both, &both_done);
  Post(IoClass::kRead, &more, &more_done);
  ASSERT_EQ(sink_.pending(), 2u) << "one read in flight on each device";
  EXPECT_EQ(sched_->stats().devices[0].reads_queued, 1u);
  EXPECT_EQ(sched_->stats().devices[1].reads_queued, 1u);
  sink_.Complete(1);  // device 1's first read
  ASSERT_EQ(sink_.pending(), 2u);
  EXPECT_EQ(sink_.at(1).reqs[0].file, 1u) << "device 1's queued read went; device 0's waits";
  EXPECT_EQ(sched_->stats().devices[0].reads_queued, 1u);
  while (sink_.pending() > 0) sink_.Complete(0);
  EXPECT_EQ(both_done, 1);
  EXPECT_EQ(more_done, 1);
}

TEST_F(ReadTurnsTest, QueuedReadsKeepWritesToTheWhileReadingCap) {
  MakeCapped(1, 64 * kKiB);
  auto r = Parts(0, 0, 3);
  std::vector<io::IoRequest> w{Req(0, 1ull << 30, 64 * kKiB),
                               Req(0, (1ull << 30) + 64 * kKiB, 64 * kKiB)};
  int r_done = 0, w_done = 0;
  PostParts(1, &r, &r_done);
  Post(IoClass::kWrite, &w, &w_done);
  // One read in flight, two queued: the device is reading, so 64 KiB of writes, not 256.
  ASSERT_EQ(sink_.pending(), 2u);
  EXPECT_EQ(sink_.at(0).reqs[0].op, io::Op::kRead);
  EXPECT_EQ(sink_.at(1).reqs[0].op, io::Op::kWrite);
  EXPECT_EQ(sink_.at(1).reqs.size(), 1u);
  EXPECT_EQ(sched_->stats().writes_queued, 1u);
  sink_.Complete(0);  // the read: the next queued read goes at once
  ASSERT_EQ(sink_.pending(), 2u);
  EXPECT_EQ(sink_.at(1).reqs[0].op, io::Op::kRead);
  EXPECT_EQ(sched_->stats().writes_queued, 1u);
  while (sink_.pending() > 0) sink_.Complete(0);
  EXPECT_EQ(r_done, 3);
  EXPECT_EQ(w_done, 1);
  EXPECT_EQ(sched_->stats().writes_queued, 0u);
}

}  // namespace
}  // namespace tutti::datapath

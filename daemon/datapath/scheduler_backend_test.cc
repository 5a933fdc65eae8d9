// The scheduler over a backend end to end: the backends issue a file's requests in arrival order
// (io_backend.h), so reads going before writes is the scheduler's doing alone. Here over the
// memory backend, paused while the test posts, so the order shows in the data each read sees.
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/datapath/scheduler.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/io/memory_backend.h"
#include "gtest/gtest.h"

namespace tutti::datapath {
namespace {

constexpr uint32_t kPage = io::kAlignment;
constexpr uint32_t kPages = 8;

TEST(SchedulerOverBackendTest, ReadsPostedAfterQueuedWritesSeeTheOldData) {
  auto backend = io::MemoryBackend::Create({kPages * kPage}).value();
  auto sink = BackendSink(backend.get());
  ManualClock clock(1000);
  IoSchedulerOptions o;
  o.write_bytes_in_flight_while_reading = kPage;
  o.max_write_bytes_in_flight = kPage;  // one write in flight: the rest wait in the scheduler
  auto sched = IoScheduler::Create(o, sink.get(), &clock).value();

  io::AlignedBuffer old_data(kPage), new_data(kPages * kPage), seen(kPages * kPage);
  std::memset(old_data.data(), 'o', kPage);
  std::memset(new_data.data(), 'n', kPages * kPage);
  for (uint32_t p = 0; p < kPages; ++p) {
    io::IoRequest w{io::Op::kWrite, 0, p * kPage, old_data.data(), kPage};
    backend->Execute(absl::MakeSpan(&w, 1));
    ASSERT_EQ(w.result, kPage);
  }

  backend->SetPaused(true);  // nothing completes until every batch is posted
  std::vector<io::IoRequest> writes, reads;
  for (uint32_t p = 0; p < kPages; ++p) {
    writes.push_back({io::Op::kWrite, 0, p * kPage, new_data.data() + p * kPage, kPage});
    reads.push_back({io::Op::kRead, 0, p * kPage, seen.data() + p * kPage, kPage});
  }
  std::atomic<int> order{0};
  int writes_done_at = -1, reads_done_at = -1;
  absl::Notification writes_done, reads_done;
  sched->Post(IoClass::kWrite, absl::MakeSpan(writes), [&] {
    writes_done_at = order++;
    writes_done.Notify();
  });
  sched->Post(IoClass::kRead, absl::MakeSpan(reads), [&] {
    reads_done_at = order++;
    reads_done.Notify();
  });
  backend->SetPaused(false);
  reads_done.WaitForNotification();
  writes_done.WaitForNotification();

  EXPECT_EQ(reads_done_at, 0);
  EXPECT_EQ(writes_done_at, 1);
  for (const io::IoRequest& r : reads) ASSERT_EQ(r.result, kPage);
  for (const io::IoRequest& w : writes) ASSERT_EQ(w.result, kPage);
  // The first write was with the backend before the reads; the others waited in the scheduler.
  EXPECT_EQ(seen.data()[0], 'n');
  for (uint32_t p = 1; p < kPages; ++p) EXPECT_EQ(seen.data()[p * kPage], 'o') << "page " << p;
  EXPECT_EQ(backend->disk().Peek(0, 0, kPages * kPage), std::string(kPages * kPage, 'n'));
}

}  // namespace
}  // namespace tutti::datapath

// The per-device I/O scheduler (the data path's "post" step, in Seastar's manner): reads always
// go first, writes fill the time reads leave. It is the only place that orders reads before
// writes: the backends issue a file's requests in arrival order (io_backend.h).
//
// Callers Post batches of requests of one class (reads or writes) with io::IoBackend::Submit's
// contract. The scheduler splits each batch by device (a device is a pool file index), keeps one
// queue per device and emits per-device batches into an IoSink: production's sink submits to an
// io::IoBackend (BackendSink), tests record the emissions and complete them by hand.
//
// Policy, per device:
//  - Reads go before writes. With `max_read_bytes_in_flight` 0 they are emitted at once, never
//    held back. With a cap, a device has at most about that many bytes of reads in flight (a
//    part goes while fewer are), and the rest wait in the scheduler, each Post's part of a device
//    in the queue of its `stream` (one Retrieve): the streams take turns (fair_queue.h), each
//    turn worth `read_turn_bytes` of parts, so a Retrieve that starts while another has a
//    gigabyte queued waits for one turn of each stream ahead of it, not for the gigabyte, and
//    gets as many bytes a turn as they do. Either way, in the backend reads wait at most behind the
//    writes already emitted, which the caps below bound.
//  - Writes wait in FIFO order. While the device has reads in flight, at most
//    `write_bytes_in_flight_while_reading` bytes of writes are in flight; with none, at most the
//    device's write window. A write larger than the cap goes alone when no write is in flight, so
//    every write makes progress.
//  - The write window is `max_write_bytes_in_flight`, or with `write_latency_target_us` set, it
//    adapts to the device (additive increase, multiplicative decrease, as TCP's congestion window
//    and Kyber's latency targets do): an emission of writes that completed later than the target
//    halves it (at most once per target interval), one on time grows it by its own bytes; it stays
//    within [write_bytes_in_flight_while_reading, max_write_bytes_in_flight]. So a read that
//    arrives while writes are in flight waits behind about one target's worth of them, on a slow
//    device as on a fast one, instead of behind max_write_bytes_in_flight.
//    Latency is a cost only to reads: a late emission halves the window only while the device
//    has reads in flight or saw one within `read_memory_us` (as Linux's writeback throttling
//    answers to reads); otherwise it grows it as an on-time one does, so a device that only
//    writes (a store with no retrieve near it) writes with the whole window. On a device whose
//    writes run one at a time (a tmpfs file), halving for latency alone cut stores to a third.
//  - Writes taken at once go out in emissions of at most `write_emission_bytes`.
//  - Each time an emission completes, the device's queue is looked at again: writes drain once
//    reads stop.
//
// Thread-safety: Post and stats() may be called from any thread, concurrently. The scheduler
// never calls the sink or a caller's `done` with its lock held, so `done` may Post again and a
// sink may complete an emission inside Emit (on the posting thread). A caller's `done` runs on
// the thread that completes the batch's last request: a sink's thread, or the caller's own inside
// Post (an empty batch, a request naming no device, or a sink that completes inline).
#ifndef TUTTI_DAEMON_DATAPATH_SCHEDULER_H_
#define TUTTI_DAEMON_DATAPATH_SCHEDULER_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "daemon/datapath/fair_queue.h"
#include "daemon/io/io_backend.h"

namespace tutti::datapath {

enum class IoClass : uint8_t { kRead, kWrite };

// Where the scheduler's per-device batches go.
class IoSink {
 public:
  virtual ~IoSink() = default;
  // Starts every request of `batch` (all of one device and one class) and returns. `done` must
  // run exactly once, after every request's `result` is set (len, a short count, or -errno), on
  // any thread, possibly inside Emit. `batch`'s memory and buffers stay valid until then.
  virtual void Emit(absl::Span<io::IoRequest> batch, std::function<void()> done) = 0;
};

// A sink that submits each emission to `backend` (io::IoBackend::Submit), which must outlive it.
std::unique_ptr<IoSink> BackendSink(io::IoBackend* backend);

struct IoSchedulerOptions {
  uint32_t num_devices = 1;  // requests naming a file >= this complete with -EINVAL
  // Per device, the bytes of reads in flight past which further reads wait their stream's turn;
  // 0: every read emitted at once (no turns). A cap of a few times what the device's queue
  // holds keeps it as busy as no cap.
  uint64_t max_read_bytes_in_flight = 0;
  // With a read cap: what one stream's turn is worth, in bytes of its parts (fair_queue.h, by
  // cost), so a Retrieve whose parts are small (few blocks a device) gets as many bytes per turn
  // as one whose parts are large; 0: a turn is one part, whatever its bytes.
  uint64_t read_turn_bytes = 0;
  uint64_t write_bytes_in_flight_while_reading = 1ull << 20;
  uint64_t max_write_bytes_in_flight = 8ull << 20;
  // Writes taken at once are handed to the sink in emissions of at most this many bytes (at
  // least one request each); 0: one emission. An emission's bytes count as in flight until all
  // of it completes, so smaller emissions let a device be topped up as parts of what it has in
  // flight complete, instead of in waves.
  uint64_t write_emission_bytes = 0;
  // Completion latency the writes in flight should keep to, in clock microseconds; 0: no
  // adaptation (the window stays max_write_bytes_in_flight).
  int64_t write_latency_target_us = 0;
  // How long after a device's last read (emitted or completed) late writes still cut its window.
  int64_t read_memory_us = 1000000;
};

// Completion latency of emitted requests, from their emission to the sink until the sink
// completes them, in clock microseconds. counts[i] (not cumulative) holds latencies <=
// kLatencyBoundsUs[i] and above the bound before; the last bucket holds the rest.
inline constexpr std::array<int64_t, 13> kLatencyBoundsUs = {
    50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000};
struct LatencyHistogram {
  std::array<uint64_t, kLatencyBoundsUs.size() + 1> counts{};
  uint64_t count = 0;
  uint64_t sum_us = 0;
  // Adds `n` requests that took `us` (negative: 0).
  void Record(int64_t us, uint64_t n);
};

// One device's (pool file's) latency per class and what it has in flight now.
struct DeviceIoStats {
  LatencyHistogram read_latency, write_latency;
  uint64_t reads_in_flight = 0, write_bytes_in_flight = 0;
  uint64_t reads_queued = 0;  // requests waiting for their stream's turn (a read cap is set)
  uint64_t write_window = 0;  // bytes: the cap on writes in flight while nothing is read
  uint64_t write_window_cuts = 0;  // times a late write halved it
  uint64_t read_bytes = 0, write_bytes = 0;  // bytes of the requests emitted to this device
};

struct IoSchedulerStats {
  uint64_t reads_posted = 0, writes_posted = 0;    // requests
  uint64_t reads_emitted = 0, writes_emitted = 0;  // requests handed to the sink
  uint64_t read_bytes = 0, write_bytes = 0;        // bytes of the requests emitted
  // Summed over written requests: clock ms from Post to emission; and the longest such wait.
  uint64_t write_wait_ms = 0, write_wait_max_ms = 0;
  uint64_t writes_queued = 0, write_bytes_queued = 0;  // waiting now, every device
  std::vector<DeviceIoStats> devices;                  // one per device, by index
};

class IoScheduler {
 public:
  // INVALID_ARGUMENT for a null sink or clock, zero devices, or a zero write cap. `sink` and
  // `clock` must outlive the scheduler.
  static absl::StatusOr<std::unique_ptr<IoScheduler>> Create(const IoSchedulerOptions& options,
                                                             IoSink* sink, Clock* clock);
  // Precondition: nothing posted is still in flight (every `done` has run).
  ~IoScheduler();

  // io::IoBackend::Submit's contract: starts every request of `batch` (their `op` is ignored:
  // `cls` says which) and returns; when each has its `result`, `done` runs once. `batch`'s memory
  // and every buffer must stay valid until `done` runs. A request naming a file >= num_devices
  // completes with -EINVAL without reaching the sink. `stream` names whose reads these are (one
  // Retrieve's): with a read cap, streams take turns per device; writes ignore it.
  void Post(IoClass cls, absl::Span<io::IoRequest> batch, std::function<void()> done,
            uint64_t stream = 0);

  IoSchedulerStats stats() const;

 private:
  struct Batch;
  struct Emission;
  // One caller's request waiting or in flight.
  struct Item {
    io::IoRequest* req;
    std::shared_ptr<Batch> batch;
    int64_t posted_ms;
  };
  struct Device {
    std::deque<Item> writes;  // queued, FIFO
    // Reads waiting for the cap: one entry per Post's part of this device, by stream.
    FairQueue<std::vector<Item>> reads;
    uint64_t reads_queued = 0;     // requests in `reads`
    uint64_t reads_in_flight = 0;  // requests emitted and not completed
    uint64_t read_bytes_in_flight = 0;
    uint64_t write_bytes_in_flight = 0;
    LatencyHistogram read_latency, write_latency;
    uint64_t write_window = 0;
    uint64_t write_window_cuts = 0;
    int64_t last_cut_us = 0;  // clock time of the last halving; 0: none yet
    int64_t last_read_us = 0;  // clock time of the last read emitted or completed; 0: none yet
    uint64_t read_bytes = 0, write_bytes = 0;  // emitted
  };

  IoScheduler(const IoSchedulerOptions& options, IoSink* sink, Clock* clock);
  // Takes the queued writes of `device` that its cap lets go now, as emissions of at most
  // write_emission_bytes each, appended to `out`.
  void TakeWritesLocked(uint32_t device, std::vector<std::unique_ptr<Emission>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<Emission> MakeReadsLocked(uint32_t device, std::vector<Item> items)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the queued reads of `device` that its read cap lets go now, each stream in turn, as
  // emissions appended to `out`.
  void TakeReadsLocked(uint32_t device, std::vector<std::unique_ptr<Emission>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands `em` to the sink; OnDone runs when the sink completes it.
  void Send(std::unique_ptr<Emission> em);
  void OnDone(Emission* em);
  // Adapts `dev`'s write window to a write emission of `bytes` that took `latency_us`.
  void AdaptWindowLocked(Device& dev, uint64_t bytes, int64_t latency_us, int64_t now_us)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const IoSchedulerOptions options_;
  IoSink* const sink_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::vector<Device> devices_ ABSL_GUARDED_BY(mu_);
  IoSchedulerStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_SCHEDULER_H_

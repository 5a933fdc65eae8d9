#include "daemon/datapath/scheduler.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tutti::datapath {
namespace {

class BackendSinkImpl final : public IoSink {
 public:
  explicit BackendSinkImpl(io::IoBackend* backend) : backend_(backend) {}
  void Emit(absl::Span<io::IoRequest> batch, std::function<void()> done) override {
    backend_->Submit(batch, std::move(done));
  }

 private:
  io::IoBackend* const backend_;
};

}  // namespace

std::unique_ptr<IoSink> BackendSink(io::IoBackend* backend) {
  return std::make_unique<BackendSinkImpl>(backend);
}

// A caller's batch: `done` runs when the last of its `remaining` requests has its result.
struct IoScheduler::Batch {
  Batch(std::function<void()> d, size_t n) : done(std::move(d)), remaining(n) {}
  std::function<void()> done;
  std::atomic<size_t> remaining;
};

// One per-device batch handed to the sink: copies of the callers' requests (contiguous, as the
// sink needs them), and where each came from.
struct IoScheduler::Emission {
  uint32_t device = 0;
  IoClass cls = IoClass::kRead;
  std::vector<io::IoRequest> reqs;
  std::vector<Item> items;  // items[i] is reqs[i]'s origin
  uint64_t bytes = 0;
  int64_t emitted_us = 0;  // clock time handed to the sink

  void Add(Item item, io::Op op) {
    reqs.push_back(*item.req);
    reqs.back().op = op;
    reqs.back().result = 0;
    bytes += item.req->len;
    items.push_back(std::move(item));
  }
};

namespace {

// Counts `n` requests of `batch` complete; runs its `done` after the last.
template <typename BatchPtr>
void Finish(const BatchPtr& batch, size_t n) {
  if (batch->remaining.fetch_sub(n) == n) batch->done();
}

}  // namespace

void LatencyHistogram::Record(int64_t us, uint64_t n) {
  us = std::max<int64_t>(us, 0);
  const auto bound = std::lower_bound(kLatencyBoundsUs.begin(), kLatencyBoundsUs.end(), us);
  counts[bound - kLatencyBoundsUs.begin()] += n;
  count += n;
  sum_us += static_cast<uint64_t>(us) * n;
}

absl::StatusOr<std::unique_ptr<IoScheduler>> IoScheduler::Create(const IoSchedulerOptions& options,
                                                                 IoSink* sink, Clock* clock) {
  if (sink == nullptr || clock == nullptr) {
    return absl::InvalidArgumentError("IoScheduler::Create needs a sink and a clock");
  }
  if (options.num_devices == 0) {
    return absl::InvalidArgumentError("IoSchedulerOptions.num_devices must be > 0");
  }
  if (options.read_memory_us < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IoSchedulerOptions.read_memory_us must be >= 0, got ", options.read_memory_us));
  }
  if (options.write_latency_target_us < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IoSchedulerOptions.write_latency_target_us must be >= 0, got ",
        options.write_latency_target_us));
  }
  if (options.write_bytes_in_flight_while_reading == 0 || options.max_write_bytes_in_flight == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IoSchedulerOptions: write_bytes_in_flight_while_reading (",
        options.write_bytes_in_flight_while_reading, ") and max_write_bytes_in_flight (",
        options.max_write_bytes_in_flight, ") must be > 0"));
  }
  return std::unique_ptr<IoScheduler>(new IoScheduler(options, sink, clock));
}

IoScheduler::IoScheduler(const IoSchedulerOptions& options, IoSink* sink, Clock* clock)
    : options_(options), sink_(sink), clock_(clock), devices_(options.num_devices) {
  for (Device& d : devices_) {
    d.write_window = options_.max_write_bytes_in_flight;
    d.reads = FairQueue<std::vector<Item>>(options_.read_turn_bytes);
  }
}

IoScheduler::~IoScheduler() = default;

void IoScheduler::Post(IoClass cls, absl::Span<io::IoRequest> batch, std::function<void()> done,
                       uint64_t stream) {
  if (batch.empty()) {
    done();
    return;
  }
  auto b = std::make_shared<Batch>(std::move(done), batch.size());
  const int64_t now = clock_->NowMs();
  size_t invalid = 0;
  std::vector<std::unique_ptr<Emission>> out;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::vector<Item>> reads(cls == IoClass::kRead ? devices_.size() : 0);
    std::vector<bool> wrote(cls == IoClass::kWrite ? devices_.size() : 0, false);
    for (io::IoRequest& r : batch) {
      if (r.file >= devices_.size()) {
        r.result = -EINVAL;
        ++invalid;
        continue;
      }
      Item item{&r, b, now};
      if (cls == IoClass::kRead) {
        ++stats_.reads_posted;
        reads[r.file].push_back(std::move(item));
      } else {
        ++stats_.writes_posted;
        ++stats_.writes_queued;
        stats_.write_bytes_queued += r.len;
        devices_[r.file].writes.push_back(std::move(item));
        wrote[r.file] = true;
      }
    }
    for (uint32_t d = 0; d < devices_.size(); ++d) {
      if (cls == IoClass::kRead && !reads[d].empty()) {
        if (options_.max_read_bytes_in_flight == 0) {
          out.push_back(MakeReadsLocked(d, std::move(reads[d])));
          continue;
        }
        devices_[d].reads_queued += reads[d].size();
        uint64_t bytes = 0;
        for (const Item& item : reads[d]) bytes += item.req->len;
        devices_[d].reads.Push(stream, std::move(reads[d]), bytes);
        TakeReadsLocked(d, &out);
      } else if (cls == IoClass::kWrite && wrote[d]) {
        TakeWritesLocked(d, &out);
      }
    }
  }
  for (auto& em : out) Send(std::move(em));
  if (invalid > 0) Finish(b, invalid);
}

std::unique_ptr<IoScheduler::Emission> IoScheduler::MakeReadsLocked(uint32_t device,
                                                                    std::vector<Item> items) {
  auto em = std::make_unique<Emission>();
  em->device = device;
  em->cls = IoClass::kRead;
  for (Item& item : items) em->Add(std::move(item), io::Op::kRead);
  devices_[device].reads_in_flight += em->reqs.size();
  devices_[device].read_bytes_in_flight += em->bytes;
  devices_[device].last_read_us = clock_->NowUs();
  stats_.reads_emitted += em->reqs.size();
  stats_.read_bytes += em->bytes;
  devices_[device].read_bytes += em->bytes;
  return em;
}

void IoScheduler::TakeReadsLocked(uint32_t device, std::vector<std::unique_ptr<Emission>>* out) {
  Device& dev = devices_[device];
  while (!dev.reads.empty() && dev.read_bytes_in_flight < options_.max_read_bytes_in_flight) {
    std::vector<Item> part = dev.reads.Pop();
    dev.reads_queued -= part.size();
    out->push_back(MakeReadsLocked(device, std::move(part)));
  }
}

void IoScheduler::TakeWritesLocked(uint32_t device, std::vector<std::unique_ptr<Emission>>* out) {
  Device& dev = devices_[device];
  const uint64_t cap = dev.reads_in_flight > 0 ? options_.write_bytes_in_flight_while_reading
                                               : dev.write_window;
  const int64_t now = clock_->NowMs();
  std::unique_ptr<Emission> em;
  while (!dev.writes.empty()) {
    const uint32_t len = dev.writes.front().req->len;
    // Within the cap; or alone, so a write larger than the cap still goes.
    if (dev.write_bytes_in_flight > 0 && dev.write_bytes_in_flight + len > cap) break;
    if (em != nullptr && options_.write_emission_bytes != 0 &&
        em->bytes + len > options_.write_emission_bytes) {
      out->push_back(std::move(em));
    }
    if (em == nullptr) {
      em = std::make_unique<Emission>();
      em->device = device;
      em->cls = IoClass::kWrite;
    }
    const uint64_t waited =
        static_cast<uint64_t>(std::max<int64_t>(0, now - dev.writes.front().posted_ms));
    stats_.write_wait_ms += waited;
    stats_.write_wait_max_ms = std::max(stats_.write_wait_max_ms, waited);
    em->Add(std::move(dev.writes.front()), io::Op::kWrite);
    dev.writes.pop_front();
    dev.write_bytes_in_flight += len;
    --stats_.writes_queued;
    stats_.write_bytes_queued -= len;
    ++stats_.writes_emitted;
    stats_.write_bytes += len;
    dev.write_bytes += len;
  }
  if (em != nullptr) out->push_back(std::move(em));
}

void IoScheduler::Send(std::unique_ptr<Emission> em) {
  em->emitted_us = clock_->NowUs();
  Emission* raw = em.release();  // owned by the completion: OnDone deletes it
  sink_->Emit(absl::MakeSpan(raw->reqs), [this, raw] { OnDone(raw); });
}

void IoScheduler::OnDone(Emission* raw) {
  std::unique_ptr<Emission> em(raw);
  for (size_t i = 0; i < em->reqs.size(); ++i) em->items[i].req->result = em->reqs[i].result;
  std::vector<std::unique_ptr<Emission>> next;
  const int64_t latency_us = clock_->NowUs() - em->emitted_us;
  {
    absl::MutexLock lock(&mu_);
    Device& dev = devices_[em->device];
    if (em->cls == IoClass::kRead) {
      dev.reads_in_flight -= em->reqs.size();
      dev.read_bytes_in_flight -= em->bytes;
      dev.read_latency.Record(latency_us, em->reqs.size());
      dev.last_read_us = em->emitted_us + latency_us;
      TakeReadsLocked(em->device, &next);
    } else {
      dev.write_bytes_in_flight -= em->bytes;
      dev.write_latency.Record(latency_us, em->reqs.size());
      AdaptWindowLocked(dev, em->bytes, latency_us, em->emitted_us + latency_us);
    }
    TakeWritesLocked(em->device, &next);
  }
  for (auto& n : next) Send(std::move(n));
  // Let go of the emission before the callers' `done`: the last one may destroy the scheduler.
  std::vector<Item> items = std::move(em->items);
  em.reset();
  for (const Item& item : items) Finish(item.batch, 1);
}

void IoScheduler::AdaptWindowLocked(Device& dev, uint64_t bytes, int64_t latency_us,
                                    int64_t now_us) {
  const int64_t target = options_.write_latency_target_us;
  if (target == 0) return;
  const uint64_t floor = std::min(options_.write_bytes_in_flight_while_reading,
                                  options_.max_write_bytes_in_flight);
  // Late writes cost only reads: with none in flight or recent, the window grows (throughput).
  const bool reads_near =
      dev.reads_in_flight > 0 ||
      (dev.last_read_us != 0 && now_us - dev.last_read_us <= options_.read_memory_us);
  if (latency_us > target && reads_near) {
    // Emissions in flight together complete late together: one cut per target interval.
    if (dev.last_cut_us != 0 && now_us - dev.last_cut_us < target) return;
    dev.last_cut_us = now_us;
    const uint64_t halved = std::max(floor, dev.write_window / 2);
    dev.write_window_cuts += halved < dev.write_window;
    dev.write_window = halved;
  } else {
    dev.write_window = std::min(options_.max_write_bytes_in_flight, dev.write_window + bytes);
  }
}

IoSchedulerStats IoScheduler::stats() const {
  absl::MutexLock lock(&mu_);
  IoSchedulerStats s = stats_;
  s.devices.reserve(devices_.size());
  for (const Device& d : devices_) {
    s.devices.push_back(DeviceIoStats{d.read_latency, d.write_latency, d.reads_in_flight,
                                      d.write_bytes_in_flight, d.reads_queued, d.write_window,
                                      d.write_window_cuts, d.read_bytes, d.write_bytes});
  }
  return s;
}

}  // namespace tutti::datapath

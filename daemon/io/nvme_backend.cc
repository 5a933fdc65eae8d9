#include "daemon/io/nvme_backend.h"

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "daemon/io/nvme/queue_pair.h"
#include "daemon/io/request_check.h"

namespace tutti::io {
namespace {

// What one Submit shares across the files it touches: `done` runs when the last request is set.
struct BatchState {
  std::atomic<size_t> remaining{0};
  std::function<void()> done;
  void Finished(size_t n) {
    if (remaining.fetch_sub(n) == n) done();
  }
};

}  // namespace

class NvmeBackend::Worker {
 public:
  struct Job {
    std::vector<IoRequest*> requests;
    std::shared_ptr<BatchState> batch;
    std::promise<absl::Status>* sync = nullptr;  // a Sync instead of I/O
  };

  Worker(NvmeBackendDevice device, std::unique_ptr<nvme::DmaBuffer> bounce,
         std::unique_ptr<nvme::RegisteredRegion> bounce_region)
      : device_(device),
        bounce_(std::move(bounce)),
        bounce_region_(std::move(bounce_region)),
        thread_([this] { Run(); }) {}

  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  void Post(Job job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  // Called before the first Submit (IoBackend contract), so the worker sees it after Post's lock.
  void SetRegion(uint8_t* base, uint64_t size, std::unique_ptr<nvme::DmaBuffer> mapping,
                 std::unique_ptr<nvme::RegisteredRegion> region) {
    std::lock_guard<std::mutex> lock(mu_);
    region_base_ = base;
    region_size_ = size;
    mapping_ = std::move(mapping);
    region_ = std::move(region);
  }

 private:
  // One command's worth of a request.
  struct Piece {
    IoRequest* request;
    uint64_t request_offset;  // bytes into the request
    uint32_t len;
    uint64_t bounce_offset;  // where it sits in the bounce buffer, or ~0 when direct
  };

  void Run() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      nvme::QueuePair* qp = device_.controller->queue_pair(0);
      if (job.sync != nullptr) {
        job.sync->set_value(qp->Flush());
        continue;
      }
      for (IoRequest* r : job.requests) r->result = r->len;  // lowered to -errno by a failed piece
      Serve(job.requests);
      job.batch->Finished(job.requests.size());
    }
  }

  // Issues `requests` in order, in rounds of commands that fit the bounce buffer.
  void Serve(const std::vector<IoRequest*>& requests) {
    const uint32_t max = device_.controller->max_transfer();
    std::vector<Piece> round;
    uint64_t bounce_used = 0;
    for (IoRequest* r : requests) {
      for (uint64_t off = 0; off < r->len; off += max) {
        uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(max, r->len - off));
        bool direct = InRegion(static_cast<uint8_t*>(r->buf) + off, len);
        if (!direct && bounce_used + len > bounce_->size()) {
          Execute(&round);
          bounce_used = 0;
        }
        round.push_back(Piece{r, off, len, direct ? ~0ull : bounce_used});
        if (!direct) bounce_used += len;
      }
    }
    Execute(&round);
  }

  bool InRegion(const uint8_t* p, uint64_t len) const {
    return region_ != nullptr && p >= region_base_ && p + len <= region_base_ + region_size_;
  }

  void Execute(std::vector<Piece>* round) {
    if (round->empty()) return;
    const uint32_t shift = device_.controller->ns().lba_shift;
    std::vector<nvme::NvmeRequest> cmds(round->size());
    for (size_t i = 0; i < round->size(); ++i) {
      const Piece& p = (*round)[i];
      const Op op = p.request->op;
      uint8_t* data = static_cast<uint8_t*>(p.request->buf) + p.request_offset;
      nvme::NvmeRequest& c = cmds[i];
      c.op = op == Op::kRead ? nvme::NvmeOp::kRead : nvme::NvmeOp::kWrite;
      c.lba = (p.request->offset + p.request_offset) >> shift;
      c.blocks = p.len >> shift;
      if (p.bounce_offset == ~0ull) {
        c.region = region_.get();
        c.offset = data - region_base_;
      } else {
        c.region = bounce_region_.get();
        c.offset = p.bounce_offset;
        if (op == Op::kWrite) std::memcpy(bounce_->host() + p.bounce_offset, data, p.len);
      }
    }
    device_.controller->queue_pair(0)->Execute(absl::MakeSpan(cmds));
    for (size_t i = 0; i < round->size(); ++i) {
      const Piece& p = (*round)[i];
      if (cmds[i].result < 0) {
        if (p.request->result >= 0) p.request->result = cmds[i].result;
      } else if (p.request->op == Op::kRead && p.bounce_offset != ~0ull) {
        std::memcpy(static_cast<uint8_t*>(p.request->buf) + p.request_offset,
                    bounce_->host() + p.bounce_offset, p.len);
      }
    }
    round->clear();
  }

  const NvmeBackendDevice device_;
  const std::unique_ptr<nvme::DmaBuffer> bounce_;
  const std::unique_ptr<nvme::RegisteredRegion> bounce_region_;
  uint8_t* region_base_ = nullptr;
  uint64_t region_size_ = 0;
  std::unique_ptr<nvme::DmaBuffer> mapping_;
  std::unique_ptr<nvme::RegisteredRegion> region_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after everything above exists
};

absl::StatusOr<std::unique_ptr<NvmeBackend>> NvmeBackend::Create(
    const NvmeBackendOptions& options, const std::vector<NvmeBackendDevice>& devices) {
  if (devices.empty()) return absl::InvalidArgumentError("nvme backend: no devices");
  std::unique_ptr<NvmeBackend> b(new NvmeBackend());
  for (size_t i = 0; i < devices.size(); ++i) {
    const NvmeBackendDevice& d = devices[i];
    if (d.controller == nullptr || d.dma == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("nvme backend: device ", i, " is null"));
    }
    if (kAlignment % d.controller->ns().lba_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "nvme backend: ", d.controller->options().name, " LBA size ",
          d.controller->ns().lba_size(), " does not divide the I/O alignment ", kAlignment));
    }
    uint64_t bounce_bytes = std::max<uint64_t>(options.bounce_bytes, d.controller->max_transfer());
    ASSIGN_OR_RETURN(auto bounce, d.dma->Allocate(bounce_bytes));
    ASSIGN_OR_RETURN(auto bounce_region, d.controller->Register(*bounce));
    b->file_sizes_.push_back(d.controller->ns().blocks << d.controller->ns().lba_shift);
    b->workers_.push_back(std::make_unique<Worker>(d, std::move(bounce), std::move(bounce_region)));
  }
  b->devices_ = devices;
  return b;
}

NvmeBackend::~NvmeBackend() = default;

uint32_t NvmeBackend::num_files() const { return static_cast<uint32_t>(file_sizes_.size()); }
uint64_t NvmeBackend::file_size(uint32_t file) const { return file_sizes_[file]; }

absl::Status NvmeBackend::RegisterBuffer(absl::Span<uint8_t> region) {
  for (size_t i = 0; i < workers_.size(); ++i) {
    ASSIGN_OR_RETURN(auto mapping, devices_[i].dma->Map(region.data(), region.size()));
    ASSIGN_OR_RETURN(auto described, devices_[i].controller->Register(*mapping));
    workers_[i]->SetRegion(region.data(), region.size(), std::move(mapping), std::move(described));
  }
  return absl::OkStatus();
}

void NvmeBackend::Submit(absl::Span<IoRequest> batch, std::function<void()> done) {
  auto state = std::make_shared<BatchState>();
  state->done = std::move(done);
  state->remaining = batch.size() + 1;  // +1 held until every job is posted
  std::vector<Worker::Job> jobs(workers_.size());
  size_t invalid = 0;
  for (IoRequest& r : batch) {
    if (!internal::IsValidRequest(r, file_sizes_)) {
      r.result = -EINVAL;
      ++invalid;
      continue;
    }
    jobs[r.file].requests.push_back(&r);
  }
  for (size_t f = 0; f < jobs.size(); ++f) {
    if (jobs[f].requests.empty()) continue;
    jobs[f].batch = state;
    workers_[f]->Post(std::move(jobs[f]));
  }
  state->Finished(invalid + 1);
}

absl::Status NvmeBackend::Sync(uint32_t file) {
  if (file >= workers_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("nvme backend: no file ", file));
  }
  std::promise<absl::Status> result;
  auto future = result.get_future();
  Worker::Job job;
  job.sync = &result;
  workers_[file]->Post(std::move(job));
  return future.get();
}

}  // namespace tutti::io

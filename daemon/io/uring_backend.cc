#include "daemon/io/uring_backend.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/io/issue_queue.h"
#include "daemon/io/owner_mailbox.h"
#include "daemon/io/request_check.h"

namespace tutti::io {
namespace {

// io_uring accepts registered buffers of at most 1 GiB each.
constexpr uint64_t kFixedChunk = 1ull << 30;

std::string ErrnoText(int err) { return std::strerror(err); }

// One batch of Submit: done runs when the last of its parts (one per file touched) finishes.
struct Batch;
struct Part {
  Batch* batch;
  uint32_t left;  // requests of this part not yet completed; touched only by the owner thread
};
struct Batch {
  std::function<void()> done;
  std::atomic<uint32_t> parts_left{0};
  absl::InlinedVector<Part, 4> parts;
};

// A request queued on or in flight at one file. `req == nullptr` marks a part with no requests
// (a batch whose requests were all invalid), which completes as soon as the thread sees it.
struct Pending {
  IoRequest* req = nullptr;
  Part* part = nullptr;
  uint32_t done_bytes = 0;
  bool retried = false;
};

void FinishPart(Part* part) {
  Batch* b = part->batch;
  if (b->parts_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::function<void()> done = std::move(b->done);
  delete b;
  if (done) done();
}

absl::StatusOr<uint64_t> SizeOf(int fd, uint32_t index) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool file ", index, ": fstat(fd ", fd, "): ", ErrnoText(errno)));
  }
  if (S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  if (S_ISBLK(st.st_mode)) {
    uint64_t bytes = 0;
    if (ioctl(fd, BLKGETSIZE64, &bytes) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool file ", index, ": BLKGETSIZE64: ", ErrnoText(errno)));
    }
    return bytes;
  }
  return absl::InvalidArgumentError(absl::StrCat("pool file ", index, " (fd ", fd,
                                                 ") is neither a regular file nor a block device"));
}

// Whether `fd` lies on tmpfs, whose reads are memory copies that never block.
bool OnTmpfs(int fd) {
  struct statfs fs;
  return fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC;
}

}  // namespace

// Owns one pool file, its ring and the thread that drives the ring.
class UringBackend::FileQueue {
 public:
  static absl::StatusOr<std::unique_ptr<FileQueue>> Create(int fd, uint32_t index,
                                                           const UringOptions& options);
  ~FileQueue();

  int fd() const { return fd_; }
  // Queues `items` (all of one part). An empty `items` queues the empty part itself.
  void Post(Part* part, std::vector<Pending> items);
  absl::Status RegisterBuffer(absl::Span<uint8_t> region);
  void UnregisterBuffer();
  void AddCounters(UringCounters* c) const;

 private:
  FileQueue(int fd, uint32_t index, uint32_t depth) : fd_(fd), index_(index), depth_(depth) {}

  void Run();
  // Moves posted work and control messages to the owner thread; blocks for some when `block`.
  // Returns false when the queue is stopping and nothing is left to do.
  bool TakeIncoming(bool block);
  void PrepareSqes();
  void SubmitAndWait();
  void ReapCompletions();
  void Complete(uint64_t slot, int res);
  void FinishRequest(Part* part);
  int FixedIndex(const uint8_t* buf, uint32_t len) const;
  bool OnOwnerThread() const { return std::this_thread::get_id() == owner_; }
  // Runs `task` on the owner thread, between I/O rounds, and returns its status.
  absl::Status RunOnOwner(std::function<absl::Status()> task);

  const int fd_;
  const uint32_t index_;
  const uint32_t depth_;

  OwnerMailbox<Pending> mailbox_;

  // Owner-thread state.
  io_uring ring_{};
  bool fixed_file_ = false;
  // On tmpfs with workers allowed: reads go IOSQE_ASYNC, at most this many in flight (0: plain).
  // Set by Create before the thread starts, never changed.
  uint32_t async_reads_ = 0;
  uint32_t reads_in_flight_ = 0;
  const uint8_t* fixed_base_ = nullptr;
  uint64_t fixed_len_ = 0;
  IssueQueue<Pending> queued_;  // taken from the mailbox, not yet issued
  std::vector<Pending> slots_;  // in-flight requests, by user_data
  std::vector<uint32_t> free_slots_;
  uint32_t in_flight_ = 0;
  std::thread::id owner_;

  std::atomic<uint64_t> fixed_ops_{0}, plain_ops_{0}, short_retries_{0}, enter_calls_{0},
      in_flight_sum_{0}, max_reads_in_flight_{0};
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<UringBackend::FileQueue>> UringBackend::FileQueue::Create(
    int fd, uint32_t index, const UringOptions& options) {
  const uint32_t depth = options.queue_depth;
  std::unique_ptr<FileQueue> q(new FileQueue(fd, index, depth));
  int r = io_uring_queue_init(depth, &q->ring_, 0);
  if (r < 0) {
    close(fd);
    q->ring_.ring_fd = -1;
    return absl::UnavailableError(absl::StrCat(
        "io_uring_queue_init(", depth, ") for pool file ", index, ": ", ErrnoText(-r),
        " (kernel without io_uring, /proc/sys/kernel/io_uring_disabled set, or a seccomp filter)"));
  }
  r = io_uring_register_files(&q->ring_, &fd, 1);
  q->fixed_file_ = r == 0;
  if (r < 0) {
    log::Get("io")->warn("pool file {}: io_uring_register_files: {}; using plain fds", index,
                         ErrnoText(-r));
  }
  if (options.memory_read_workers > 1 && OnTmpfs(fd)) {
    q->async_reads_ = options.memory_read_workers;
    log::Get("io")->info("pool file {} is on tmpfs: up to {} reads at once, each on an io_uring "
                         "worker (io.memory_read_workers)",
                         index, options.memory_read_workers);
  }
  q->slots_.resize(depth);
  for (uint32_t i = depth; i > 0; --i) q->free_slots_.push_back(i - 1);
  q->thread_ = std::thread([p = q.get()] { p->Run(); });
  // Named for per-thread CPU figures (top -H, bench/ssd_array.py): "tutti-uring-<file>".
  pthread_setname_np(q->thread_.native_handle(), absl::StrCat("tutti-uring-", index).c_str());
  return q;
}

UringBackend::FileQueue::~FileQueue() {
  mailbox_.Stop();
  if (thread_.joinable()) thread_.join();
  if (ring_.ring_fd >= 0) {
    // The ring's teardown is asynchronous and keeps registered files open (and their flock held)
    // for some milliseconds after exit; unregistering first releases them now.
    if (fixed_file_) io_uring_unregister_files(&ring_);
    if (fixed_base_ != nullptr) io_uring_unregister_buffers(&ring_);
    io_uring_queue_exit(&ring_);
    close(fd_);
  }
}

void UringBackend::FileQueue::Post(Part* part, std::vector<Pending> items) {
  if (items.empty()) {
    mailbox_.PostOne(Pending{nullptr, part});
  } else {
    mailbox_.Post(std::move(items));
  }
}

absl::Status UringBackend::FileQueue::RunOnOwner(std::function<absl::Status()> task) {
  return mailbox_.RunOnOwner(std::move(task));
}

absl::Status UringBackend::FileQueue::RegisterBuffer(absl::Span<uint8_t> region) {
  return RunOnOwner([this, region]() -> absl::Status {
    std::vector<iovec> iovs;
    for (uint64_t off = 0; off < region.size(); off += kFixedChunk) {
      iovs.push_back({region.data() + off, std::min<uint64_t>(kFixedChunk, region.size() - off)});
    }
    const int r = io_uring_register_buffers(&ring_, iovs.data(), iovs.size());
    if (r == 0) {
      fixed_base_ = region.data();
      fixed_len_ = region.size();
      return absl::OkStatus();
    }
    std::string msg = absl::StrCat("pool file ", index_, ": io_uring_register_buffers(",
                                   region.size(), " bytes): ", ErrnoText(-r));
    if (r == -ENOMEM) {
      return absl::ResourceExhaustedError(absl::StrCat(
          msg,
          " (pinned memory is charged to RLIMIT_MEMLOCK once per pool file: raise it, e.g. "
          "LimitMEMLOCK=infinity, or grant CAP_IPC_LOCK)"));
    }
    return absl::InternalError(msg);
  });
}

void UringBackend::FileQueue::UnregisterBuffer() {
  RunOnOwner([this] {
    if (fixed_base_ != nullptr) io_uring_unregister_buffers(&ring_);
    fixed_base_ = nullptr;
    fixed_len_ = 0;
    return absl::OkStatus();
  }).IgnoreError();
}

void UringBackend::FileQueue::AddCounters(UringCounters* c) const {
  c->fixed_buffer_ops += fixed_ops_.load(std::memory_order_relaxed);
  c->plain_buffer_ops += plain_ops_.load(std::memory_order_relaxed);
  c->short_retries += short_retries_.load(std::memory_order_relaxed);
  c->enter_calls += enter_calls_.load(std::memory_order_relaxed);
  c->in_flight_sum += in_flight_sum_.load(std::memory_order_relaxed);
  c->memory_files += async_reads_ > 0 ? 1 : 0;
  c->max_memory_reads_in_flight = std::max<uint64_t>(
      c->max_memory_reads_in_flight, max_reads_in_flight_.load(std::memory_order_relaxed));
}

void UringBackend::FileQueue::Run() {
  owner_ = std::this_thread::get_id();
  for (;;) {
    const bool idle = in_flight_ == 0 && queued_.empty();
    if (!TakeIncoming(idle)) return;
    PrepareSqes();
    if (in_flight_ == 0) continue;
    SubmitAndWait();
    ReapCompletions();
  }
}

bool UringBackend::FileQueue::TakeIncoming(bool block) {
  OwnerMailbox<Pending>::Taken taken = mailbox_.Take(block);
  const std::vector<Pending>& items = taken.items;
  for (const Pending& p : items) {
    if (p.req == nullptr) {
      FinishPart(p.part);
    } else {
      queued_.Push(p, p.req->op);
    }
  }
  const bool idle = in_flight_ == 0 && queued_.empty();
  return !(taken.stopping && idle && items.empty() && !taken.ran_control);
}

int UringBackend::FileQueue::FixedIndex(const uint8_t* buf, uint32_t len) const {
  if (fixed_base_ == nullptr || buf < fixed_base_) return -1;
  const uint64_t off = static_cast<uint64_t>(buf - fixed_base_);
  if (off >= fixed_len_ || len > fixed_len_ - off) return -1;
  const uint64_t chunk = off / kFixedChunk;
  if ((off + len - 1) / kFixedChunk != chunk) return -1;  // straddles two registered pieces
  return static_cast<int>(chunk);
}

void UringBackend::FileQueue::PrepareSqes() {
  assert(OnOwnerThread());
  while (in_flight_ < depth_ && !queued_.empty()) {
    // Arrival order; reads held by the tmpfs cap let later writes pass.
    const bool reads_may_go = async_reads_ == 0 || reads_in_flight_ < async_reads_;
    if (!reads_may_go && !queued_.has_writes()) break;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) break;  // cannot happen with in_flight_ < depth_; stay safe
    const Pending p = *queued_.Pop(reads_may_go);
    const uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = p;
    ++in_flight_;

    uint8_t* buf = static_cast<uint8_t*>(p.req->buf) + p.done_bytes;
    const uint32_t len = p.req->len - p.done_bytes;
    const uint64_t off = p.req->offset + p.done_bytes;
    const int target = fixed_file_ ? 0 : fd_;
    const bool read = p.req->op == Op::kRead;
    const int fixed = FixedIndex(buf, len);
    if (fixed >= 0) {
      read ? io_uring_prep_read_fixed(sqe, target, buf, len, off, fixed)
           : io_uring_prep_write_fixed(sqe, target, buf, len, off, fixed);
      fixed_ops_.fetch_add(1, std::memory_order_relaxed);
    } else {
      read ? io_uring_prep_read(sqe, target, buf, len, off)
           : io_uring_prep_write(sqe, target, buf, len, off);
      plain_ops_.fetch_add(1, std::memory_order_relaxed);
    }
    if (fixed_file_) sqe->flags |= IOSQE_FIXED_FILE;
    if (read && async_reads_ > 0) {
      sqe->flags |= IOSQE_ASYNC;
      max_reads_in_flight_.store(std::max<uint64_t>(
                                     max_reads_in_flight_.load(std::memory_order_relaxed),
                                     ++reads_in_flight_),
                                 std::memory_order_relaxed);
    }
    io_uring_sqe_set_data64(sqe, slot);
  }
}

void UringBackend::FileQueue::SubmitAndWait() {
  enter_calls_.fetch_add(1, std::memory_order_relaxed);
  in_flight_sum_.fetch_add(in_flight_, std::memory_order_relaxed);
  const int r = io_uring_submit_and_wait(&ring_, 1);
  if (r >= 0 || r == -EINTR || r == -EAGAIN || r == -EBUSY) return;  // unsent SQEs go next round
  TUTTI_LOG_EVERY_N_SEC(log::Get("io"), spdlog::level::err, 5,
                        "pool file {}: io_uring_submit_and_wait: {}", index_, ErrnoText(-r));
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void UringBackend::FileQueue::ReapCompletions() {
  assert(OnOwnerThread());
  unsigned head;
  unsigned seen = 0;
  io_uring_cqe* cqe;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    Complete(cqe->user_data, cqe->res);
    ++seen;
  }
  io_uring_cq_advance(&ring_, seen);
}

void UringBackend::FileQueue::Complete(uint64_t slot, int res) {
  Pending p = slots_[slot];
  free_slots_.push_back(static_cast<uint32_t>(slot));
  --in_flight_;
  if (async_reads_ > 0 && p.req->op == Op::kRead) --reads_in_flight_;
  if (res < 0) {
    p.req->result = res;
    FinishRequest(p.part);
    return;
  }
  const uint32_t wanted = p.req->len - p.done_bytes;
  p.done_bytes += static_cast<uint32_t>(res);
  const bool short_transfer = static_cast<uint32_t>(res) < wanted;
  if (short_transfer && res > 0 && !p.retried && res % kAlignment == 0) {
    p.retried = true;
    short_retries_.fetch_add(1, std::memory_order_relaxed);
    queued_.PushFront(p, p.req->op);
    return;
  }
  p.req->result = p.done_bytes;
  FinishRequest(p.part);
}

void UringBackend::FileQueue::FinishRequest(Part* part) {
  if (--part->left == 0) FinishPart(part);
}

UringBackend::UringBackend(std::vector<uint64_t> sizes) : sizes_(std::move(sizes)) {}

UringBackend::~UringBackend() { queues_.clear(); }

absl::StatusOr<std::unique_ptr<UringBackend>> UringBackend::Create(std::vector<int> fds,
                                                                   const UringOptions& options) {
  size_t handed_over = 0;  // fds_[0 .. handed_over) belong to a FileQueue already
  absl::Cleanup close_rest = [&] {
    for (size_t i = handed_over; i < fds.size(); ++i) close(fds[i]);
  };
  if (fds.empty()) return absl::InvalidArgumentError("uring backend: no pool files");
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("io.queue_depth must be in [1, 4096], got ", options.queue_depth));
  }
  if (options.memory_read_workers < 1 || options.memory_read_workers > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "io.memory_read_workers must be in [1, 64], got ", options.memory_read_workers));
  }
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < fds.size(); ++i) {
    auto size = SizeOf(fds[i], static_cast<uint32_t>(i));
    if (!size.ok()) return size.status();
    sizes.push_back(*size);
  }
  std::unique_ptr<UringBackend> backend(new UringBackend(std::move(sizes)));
  for (size_t i = 0; i < fds.size(); ++i) {
    auto q = FileQueue::Create(fds[i], static_cast<uint32_t>(i), options);
    handed_over = i + 1;  // FileQueue::Create closes the fd itself on failure
    if (!q.ok()) return q.status();
    backend->queues_.push_back(*std::move(q));
  }
  return backend;
}

absl::Status UringBackend::RegisterBuffer(absl::Span<uint8_t> region) {
  if (region.empty()) return absl::InvalidArgumentError("RegisterBuffer: empty region");
  if (buffer_registered_.exchange(true)) {
    return absl::FailedPreconditionError("RegisterBuffer: a buffer is already registered");
  }
  for (size_t i = 0; i < queues_.size(); ++i) {
    absl::Status s = queues_[i]->RegisterBuffer(region);
    if (s.ok()) continue;
    for (size_t j = 0; j < i; ++j) queues_[j]->UnregisterBuffer();  // all or nothing
    buffer_registered_.store(false);
    return s;
  }
  return absl::OkStatus();
}

void UringBackend::Submit(absl::Span<IoRequest> batch, std::function<void()> done) {
  auto* b = new Batch;
  b->done = std::move(done);
  absl::InlinedVector<std::vector<Pending>, 4> per_file(queues_.size());
  for (IoRequest& r : batch) {
    if (!internal::IsValidRequest(r, sizes_)) {
      r.result = -EINVAL;
      continue;
    }
    per_file[r.file].push_back(Pending{&r});
  }
  // Build every part before posting any: a posted part may finish (and free `b`) at once.
  absl::InlinedVector<std::pair<uint32_t, Part*>, 4> posts;
  for (uint32_t f = 0; f < per_file.size(); ++f) {
    if (!per_file[f].empty()) {
      b->parts.push_back(Part{b, static_cast<uint32_t>(per_file[f].size())});
    }
  }
  if (b->parts.empty()) b->parts.push_back(Part{b, 0});  // completes on file 0's thread
  b->parts_left.store(static_cast<uint32_t>(b->parts.size()), std::memory_order_relaxed);
  size_t next = 0;
  for (uint32_t f = 0; f < per_file.size(); ++f) {
    if (per_file[f].empty()) continue;
    Part* part = &b->parts[next++];
    for (Pending& p : per_file[f]) p.part = part;
    posts.emplace_back(f, part);
  }
  if (posts.empty()) posts.emplace_back(0, &b->parts[0]);
  for (auto& [f, part] : posts) queues_[f]->Post(part, std::move(per_file[f]));
}

absl::Status UringBackend::Sync(uint32_t file) {
  if (file >= queues_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Sync: no pool file ", file));
  }
  int r;
  do {
    r = fdatasync(queues_[file]->fd());
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    return absl::InternalError(absl::StrCat("fdatasync(pool file ", file, "): ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

UringCounters UringBackend::counters() const {
  UringCounters c;
  for (const auto& q : queues_) q->AddCounters(&c);
  return c;
}

absl::StatusOr<std::unique_ptr<IoBackend>> CreateUringBackend(std::vector<int> fds,
                                                              const UringOptions& options) {
  auto b = UringBackend::Create(std::move(fds), options);
  if (!b.ok()) return b.status();
  return std::unique_ptr<IoBackend>(*std::move(b));
}

}  // namespace tutti::io

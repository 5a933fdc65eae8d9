#include "daemon/io/uring_backend.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/stats.h"
#include "daemon/io/request_check.h"
#include "daemon/io/uring_owner.h"

namespace tutti::io {
namespace {

using internal::FinishRequest;
using internal::UringBatch;
using internal::UringPart;

// io_uring accepts registered buffers of at most 1 GiB each.
constexpr uint64_t kFixedChunk = 1ull << 30;

std::string ErrnoText(int err) { return std::strerror(err); }

// A request queued on or in flight at one file. A default one (`req == nullptr`) marks a part with
// no requests (a batch whose requests were all invalid), which completes as soon as the thread
// sees it.
struct Pending {
  IoRequest* req = nullptr;
  UringPart* part = nullptr;
  uint32_t done_bytes = 0;
  bool retried = false;

  bool empty() const { return req == nullptr; }
  Op op() const { return req->op; }
};

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

// One pool file: how its requests become SQEs and what their completions mean, and the owner of
// its ring (internal::UringOwner), whose thread alone calls the UringItemOps methods.
class UringBackend::FileQueue final : public internal::UringItemOps<Pending> {
 public:
  // Ring `ring` of pool file `index`; `async_reads` as the member below.
  static absl::StatusOr<std::unique_ptr<FileQueue>> Create(int fd, uint32_t index, uint32_t ring,
                                                           uint32_t async_reads,
                                                           const UringOptions& options);

  internal::UringOwner<Pending>& owner() { return *owner_; }
  void AddCounters(UringCounters* c) const;

  bool ReadsMayGo() const override { return async_reads_ == 0 || reads_in_flight_ < async_reads_; }
  void Prepare(io_uring_sqe* sqe, Pending& p, int target) override;
  bool Complete(Pending& p, int res) override;

 private:
  FileQueue(uint32_t ring, uint32_t async_reads) : ring_(ring), async_reads_(async_reads) {}

  const uint32_t ring_;  // of its file; 0 takes the writes
  // On tmpfs with workers allowed: reads go IOSQE_ASYNC, at most this many in flight (0: plain).
  const uint32_t async_reads_;
  uint32_t reads_in_flight_ = 0;  // owner thread only

  std::atomic<uint64_t> fixed_ops_{0}, plain_ops_{0}, short_retries_{0}, max_reads_in_flight_{0};
  // Last: destroyed first, so its thread is gone before the state above.
  std::unique_ptr<internal::UringOwner<Pending>> owner_;
};

absl::StatusOr<std::unique_ptr<UringBackend::FileQueue>> UringBackend::FileQueue::Create(
    int fd, uint32_t index, uint32_t ring, uint32_t async_reads, const UringOptions& options) {
  std::unique_ptr<FileQueue> q(new FileQueue(ring, async_reads));
  internal::UringOwnerOptions o;
  o.name = ring == 0 ? absl::StrCat("pool file ", index)
                     : absl::StrCat("pool file ", index, " (read ring ", ring, ")");
  // Named for per-thread CPU figures (top -H, bench/ssd_array.py): "tutti-uring-<file>", and
  // "tutti-urd-<file>.<ring>" for a tmpfs file's further read rings.
  o.thread_name = ring == 0 ? absl::StrCat("tutti-uring-", index)
                            : absl::StrCat("tutti-urd-", index, ".", ring);
  o.depth = options.queue_depth;
  o.setup_hint =
      "kernel without io_uring, /proc/sys/kernel/io_uring_disabled set, or a seccomp "
      "filter";
  o.memlock_per = "ring (one per pool file, io.memory_read_rings on tmpfs)";
  auto owner = internal::UringOwner<Pending>::Create(fd, o, q.get());  // closes fd on failure
  if (!owner.ok()) return owner.status();
  q->owner_ = *std::move(owner);
  return q;
}

void UringBackend::FileQueue::AddCounters(UringCounters* c) const {
  c->fixed_buffer_ops += fixed_ops_.load(std::memory_order_relaxed);
  c->plain_buffer_ops += plain_ops_.load(std::memory_order_relaxed);
  c->short_retries += short_retries_.load(std::memory_order_relaxed);
  c->enter_calls += owner_->enter_calls();
  c->in_flight_sum += owner_->in_flight_sum();
  c->memory_files += async_reads_ > 0 && ring_ == 0 ? 1 : 0;
  // A ring that has issued a read has had one in flight.
  c->memory_read_rings +=
      async_reads_ > 0 && max_reads_in_flight_.load(std::memory_order_relaxed) > 0 ? 1 : 0;
  c->max_memory_reads_in_flight = std::max<uint64_t>(
      c->max_memory_reads_in_flight, max_reads_in_flight_.load(std::memory_order_relaxed));
}

void UringBackend::FileQueue::Prepare(io_uring_sqe* sqe, Pending& p, int target) {
  uint8_t* buf = static_cast<uint8_t*>(p.req->buf) + p.done_bytes;
  const uint32_t len = p.req->len - p.done_bytes;
  const uint64_t off = p.req->offset + p.done_bytes;
  const bool read = p.req->op == Op::kRead;
  const int fixed = owner_->FixedIndex(buf, len);
  if (fixed >= 0) {
    read ? io_uring_prep_read_fixed(sqe, target, buf, len, off, fixed)
         : io_uring_prep_write_fixed(sqe, target, buf, len, off, fixed);
    fixed_ops_.fetch_add(1, std::memory_order_relaxed);
  } else {
    read ? io_uring_prep_read(sqe, target, buf, len, off)
         : io_uring_prep_write(sqe, target, buf, len, off);
    plain_ops_.fetch_add(1, std::memory_order_relaxed);
  }
  if (read && async_reads_ > 0) {
    sqe->flags |= IOSQE_ASYNC;
    max_reads_in_flight_.store(
        std::max<uint64_t>(max_reads_in_flight_.load(std::memory_order_relaxed),
                           ++reads_in_flight_),
        std::memory_order_relaxed);
  }
}

bool UringBackend::FileQueue::Complete(Pending& p, int res) {
  if (async_reads_ > 0 && p.req->op == Op::kRead) --reads_in_flight_;
  if (res < 0) {
    p.req->result = res;
    FinishRequest(p.part);
    return false;
  }
  const uint32_t wanted = p.req->len - p.done_bytes;
  p.done_bytes += static_cast<uint32_t>(res);
  const bool short_transfer = static_cast<uint32_t>(res) < wanted;
  if (short_transfer && res > 0 && !p.retried && res % kAlignment == 0) {
    p.retried = true;
    short_retries_.fetch_add(1, std::memory_order_relaxed);
    return true;  // the remainder, before everything queued
  }
  p.req->result = p.done_bytes;
  FinishRequest(p.part);
  return false;
}

UringBackend::UringBackend(std::vector<uint64_t> sizes)
    : sizes_(std::move(sizes)), files_(new File[sizes_.size()]) {}

UringBackend::~UringBackend() { rings_.clear(); }

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
  if (options.memory_read_rings < 1 || options.memory_read_rings > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("io.memory_read_rings must be in [1, 16], got ", options.memory_read_rings));
  }
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < fds.size(); ++i) {
    auto size = SizeOf(fds[i], static_cast<uint32_t>(i));
    if (!size.ok()) return size.status();
    sizes.push_back(*size);
  }
  std::unique_ptr<UringBackend> backend(new UringBackend(std::move(sizes)));
  for (size_t i = 0; i < fds.size(); ++i) {
    const uint32_t index = static_cast<uint32_t>(i);
    const bool memory = options.memory_read_workers > 1 && OnTmpfs(fds[i]);
    const uint32_t rings = memory ? options.memory_read_rings : 1;
    // Each further ring reads through a descriptor of its own, taken before the first ring owns
    // (and on failure closes) fds[i].
    std::vector<int> dups;
    absl::Cleanup close_dups = [&] {
      for (int d : dups) close(d);
    };
    for (uint32_t r = 1; r < rings; ++r) {
      const int d = fcntl(fds[i], F_DUPFD_CLOEXEC, 0);
      if (d < 0) {
        return absl::InternalError(
            absl::StrCat("pool file ", index, ": dup for read ring ", r, ": ", ErrnoText(errno)));
      }
      dups.push_back(d);
    }
    // The file's reads in flight at most, shared out between its rings.
    const uint32_t per_ring = memory ? (options.memory_read_workers + rings - 1) / rings : 0;
    File& file = backend->files_[i];
    file.first = static_cast<uint32_t>(backend->rings_.size());
    file.count = rings;
    for (uint32_t r = 0; r < rings; ++r) {
      int fd = fds[i];
      if (r > 0) {
        fd = dups.front();
        dups.erase(dups.begin());  // Create owns it from here, on failure too
      }
      auto q = FileQueue::Create(fd, index, r, per_ring, options);
      if (r == 0) handed_over = i + 1;  // FileQueue::Create closes the fd itself on failure
      if (!q.ok()) return q.status();
      backend->rings_.push_back(*std::move(q));
    }
    if (memory) {
      log::Get("io")->info(
          "pool file {} is on tmpfs: up to {} reads at once, each on an io_uring worker "
          "(io.memory_read_workers), over {} ring(s) (io.memory_read_rings)",
          index, per_ring * rings, rings);
    }
  }
  return backend;
}

absl::Status UringBackend::RegisterBuffer(absl::Span<uint8_t> region) {
  if (region.empty()) return absl::InvalidArgumentError("RegisterBuffer: empty region");
  if (buffer_registered_.exchange(true)) {
    return absl::FailedPreconditionError("RegisterBuffer: a buffer is already registered");
  }
  for (size_t i = 0; i < rings_.size(); ++i) {
    absl::Status s = rings_[i]->owner().RegisterBuffer(region, kFixedChunk);
    if (s.ok()) continue;
    for (size_t j = 0; j < i; ++j) rings_[j]->owner().UnregisterBuffer();  // all or nothing
    buffer_registered_.store(false);
    return s;
  }
  return absl::OkStatus();
}

void UringBackend::Submit(absl::Span<IoRequest> batch, std::function<void()> done) {
  auto* b = new UringBatch;
  b->done = std::move(done);
  // Per ring: a file's writes go to its first ring, its reads round-robin over its rings.
  absl::InlinedVector<std::vector<Pending>, 4> per_ring(rings_.size());
  for (IoRequest& r : batch) {
    if (!internal::IsValidRequest(r, sizes_)) {
      r.result = -EINVAL;
      continue;
    }
    File& f = files_[r.file];
    uint32_t ring = f.first;
    if (r.op == Op::kRead && f.count > 1) {
      ring += f.next_read.fetch_add(1, std::memory_order_relaxed) % f.count;
    }
    per_ring[ring].push_back(Pending{&r, nullptr});
  }
  // Build every part before posting any: a posted part may finish (and free `b`) at once.
  // parts[k] goes to ring posts[k].
  absl::InlinedVector<uint32_t, 4> posts;
  for (uint32_t q = 0; q < per_ring.size(); ++q) {
    if (per_ring[q].empty()) continue;
    b->parts.push_back(UringPart{b, static_cast<uint32_t>(per_ring[q].size())});
    posts.push_back(q);
  }
  if (posts.empty()) {  // completes on file 0's thread
    b->parts.push_back(UringPart{b, 0});
    posts.push_back(0);
  }
  b->parts_left.store(static_cast<uint32_t>(b->parts.size()), std::memory_order_relaxed);
  for (size_t k = 0; k < posts.size(); ++k) {
    for (Pending& p : per_ring[posts[k]]) p.part = &b->parts[k];
  }
  for (size_t k = 0; k < posts.size(); ++k) {
    rings_[posts[k]]->owner().Post(&b->parts[k], std::move(per_ring[posts[k]]));
  }
}

absl::Status UringBackend::Sync(uint32_t file) {
  if (file >= sizes_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Sync: no pool file ", file));
  }
  int r;
  do {
    r = fdatasync(rings_[files_[file].first]->owner().fd());
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    return absl::InternalError(absl::StrCat("fdatasync(pool file ", file, "): ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

UringCounters UringBackend::counters() const {
  UringCounters c;
  for (const auto& q : rings_) q->AddCounters(&c);
  return c;
}

void UringBackend::RegisterStats(stats::Registry* registry) const {
  registry->AddGroup<UringCounters>([this] { return counters(); })
      .Add({"tutti_io_uring_ops_total",
            "Requests the uring backend issued, by buffer: fixed "
            "(READ_FIXED / WRITE_FIXED over the registered staging) or plain.",
            stats::Type::kCounter,
            {"buffer"}},
           [](const UringCounters& c, stats::Samples* out) {
             out->Add({"fixed"}, c.fixed_buffer_ops);
             out->Add({"plain"}, c.plain_buffer_ops);
           })
      .Counter("tutti_io_uring_short_retries_total", "Remainders re-issued after a short transfer.",
               [](const UringCounters& c) { return c.short_retries; })
      .Counter("tutti_io_uring_enter_calls_total", "io_uring_enter system calls (submit or wait).",
               [](const UringCounters& c) { return c.enter_calls; })
      .Counter("tutti_io_uring_in_flight_at_enter_total",
               "Requests in flight at each io_uring_enter call, summed: over "
               "tutti_io_uring_enter_calls_total, the mean queue depth kept.",
               [](const UringCounters& c) { return c.in_flight_sum; })
      .Gauge("tutti_io_uring_memory_reads_in_flight_max",
             "The most reads in flight at once on one ring of a pool file on tmpfs "
             "(io.memory_read_workers over io.memory_read_rings caps it); 0 with none on tmpfs.",
             [](const UringCounters& c) { return c.max_memory_reads_in_flight; })
      .Gauge("tutti_io_uring_memory_read_rings",
             "Rings over pool files on tmpfs that have issued a read (io.memory_read_rings per "
             "file); 0 with none on tmpfs.",
             [](const UringCounters& c) { return c.memory_read_rings; });
}

absl::StatusOr<std::unique_ptr<IoBackend>> CreateUringBackend(std::vector<int> fds,
                                                              const UringOptions& options) {
  auto b = UringBackend::Create(std::move(fds), options);
  if (!b.ok()) return b.status();
  return std::unique_ptr<IoBackend>(*std::move(b));
}

}  // namespace tutti::io

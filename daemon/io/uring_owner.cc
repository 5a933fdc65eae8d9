#include "daemon/io/uring_owner.h"

#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace tutti::io::internal {
namespace {

// The user_data of the wake eventfd's read; items use their slot index (< depth <= 4096).
constexpr uint64_t kWakeTag = ~uint64_t{0};

}  // namespace

void FinishPart(UringPart* part) {
  UringBatch* b = part->batch;
  if (b->parts_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::function<void()> done = std::move(b->done);
  delete b;
  if (done) done();
}

void FinishRequest(UringPart* part) {
  if (--part->left == 0) FinishPart(part);
}

absl::StatusOr<std::unique_ptr<UringRing>> UringRing::Create(int fd,
                                                             const UringOwnerOptions& options) {
  std::unique_ptr<UringRing> r(new UringRing(fd, options.name, options.memlock_per));
  r->wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (r->wake_fd_ < 0) {
    r->ring_.ring_fd = -1;
    return absl::UnavailableError(
        absl::StrCat(options.name, ": eventfd (the ring's wake-up): ", std::strerror(errno)));
  }
  io_uring_params params;
  std::memset(&params, 0, sizeof(params));
  params.flags = options.setup_flags;
  // One entry more than items in flight: the wake eventfd's read always finds one.
  int rc = io_uring_queue_init_params(options.depth + 1, &r->ring_, &params);
  if (rc < 0) {
    r->ring_.ring_fd = -1;  // the destructor closes only the fd
    const std::string flags =
        options.setup_flags_text.empty() ? "" : absl::StrCat(", ", options.setup_flags_text);
    return absl::UnavailableError(absl::StrCat(options.name, ": io_uring_queue_init(",
                                               options.depth, flags, "): ", std::strerror(-rc),
                                               " (", options.setup_hint, ")"));
  }
  if (options.check_ring) {
    absl::Status s = options.check_ring(&r->ring_);
    if (!s.ok()) return s;
  }
  rc = io_uring_register_files(&r->ring_, &fd, 1);
  r->fixed_file_ = rc == 0;
  if (rc < 0) {
    log::Get("io")->warn("{}: io_uring_register_files: {}; using the plain fd", options.name,
                         std::strerror(-rc));
  }
  return r;
}

UringRing::~UringRing() {
  if (ring_.ring_fd >= 0) {
    // The ring's teardown is asynchronous and keeps registered files open (and their flock held)
    // for some milliseconds after exit; unregistering first releases them now.
    if (fixed_file_) io_uring_unregister_files(&ring_);
    if (fixed_base_ != nullptr) io_uring_unregister_buffers(&ring_);
    io_uring_queue_exit(&ring_);  // cancels the armed read before its eventfd is closed
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  close(fd_);
}

absl::Status UringRing::RegisterBuffer(absl::Span<uint8_t> region, uint64_t piece) {
  std::vector<iovec> iovs;
  for (uint64_t off = 0; off < region.size(); off += piece) {
    iovs.push_back({region.data() + off, std::min<uint64_t>(piece, region.size() - off)});
  }
  const int r = io_uring_register_buffers(&ring_, iovs.data(), iovs.size());
  if (r == 0) {
    fixed_base_ = region.data();
    fixed_len_ = region.size();
    piece_ = piece;
    return absl::OkStatus();
  }
  const std::string msg = absl::StrCat(name_, ": io_uring_register_buffers(", region.size(),
                                       " bytes): ", std::strerror(-r));
  if (r == -ENOMEM) {
    return absl::ResourceExhaustedError(
        absl::StrCat(msg, " (pinned memory is charged to RLIMIT_MEMLOCK once per ", memlock_per_,
                     ": raise it, e.g. LimitMEMLOCK=infinity, or grant CAP_IPC_LOCK)"));
  }
  return absl::InternalError(msg);
}

void UringRing::UnregisterBuffer() {
  if (fixed_base_ != nullptr) io_uring_unregister_buffers(&ring_);
  fixed_base_ = nullptr;
  fixed_len_ = 0;
}

int UringRing::FixedIndex(const uint8_t* buf, uint32_t len) const {
  if (fixed_base_ == nullptr || buf < fixed_base_) return -1;
  const uint64_t off = static_cast<uint64_t>(buf - fixed_base_);
  if (off >= fixed_len_ || len > fixed_len_ - off) return -1;
  const uint64_t piece = off / piece_;
  if ((off + len - 1) / piece_ != piece) return -1;  // straddles two pieces
  return static_cast<int>(piece);
}

void UringRing::ArmWake() {
  if (wake_armed_ || wake_broken_) return;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return;  // cannot happen with depth + 1 entries; this wait is plain
  io_uring_prep_read(sqe, wake_fd_, &wake_buf_, sizeof(wake_buf_), 0);
  io_uring_sqe_set_data64(sqe, kWakeTag);
  wake_armed_ = true;
}

void UringRing::Wake() {
  // Paired with SubmitAndWait: the poster's work is in the mailbox before this exchange, and the
  // owner looks at the mailbox after marking itself waiting, so one of the two sees the other.
  if (!waiting_.exchange(false)) return;
  const uint64_t one = 1;
  // Fails only if the count would overflow (it cannot: every read resets it).
  (void)!write(wake_fd_, &one, sizeof(one));
}

void UringRing::SubmitAndWait(uint32_t in_flight, bool wakeable, absl::FunctionRef<bool()> posted) {
  enter_calls_.fetch_add(1, std::memory_order_relaxed);
  in_flight_sum_.fetch_add(in_flight, std::memory_order_relaxed);
  bool wait = true;
  if (wakeable) {
    ArmWake();
    waiting_.store(wake_armed_);
    wait = !posted();
  }
  const int r = wait ? io_uring_submit_and_wait(&ring_, 1) : io_uring_submit(&ring_);
  waiting_.store(false);
  if (r >= 0 || r == -EINTR || r == -EAGAIN || r == -EBUSY) return;  // unsent SQEs go next round
  TUTTI_LOG_EVERY_N_SEC(log::Get("io"), spdlog::level::err, 5, "{}: io_uring_submit_and_wait: {}",
                        name_, std::strerror(-r));
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void UringRing::Reap(absl::FunctionRef<void(uint64_t, int)> complete) {
  unsigned head;
  unsigned seen = 0;
  io_uring_cqe* cqe;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    ++seen;
    if (cqe->user_data != kWakeTag) {
      complete(cqe->user_data, cqe->res);
      continue;
    }
    wake_armed_ = false;  // armed again before the next wait
    if (cqe->res >= 0) {
      wakes_.fetch_add(1, std::memory_order_relaxed);
    } else if (cqe->res != -EINTR && cqe->res != -EAGAIN) {
      wake_broken_ = true;
      log::Get("io")->warn(
          "{}: reading the wake eventfd: {}; work posted while requests are in flight now waits "
          "for their next completion",
          name_, std::strerror(-cqe->res));
    }
  }
  io_uring_cq_advance(&ring_, seen);
}

}  // namespace tutti::io::internal

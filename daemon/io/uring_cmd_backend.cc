#include "daemon/io/uring_cmd_backend.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/nvme_ioctl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/align.h"
#include "common/log.h"
#include "common/stats.h"
#include "daemon/io/aligned_buffer.h"
#include "daemon/io/nvme_command.h"
#include "daemon/io/request_check.h"
#include "daemon/io/uring_owner.h"

namespace tutti::io {
namespace {

// A registered region is registered as pieces of kPieceBytes (fewer pages than any NVMe queue's
// segment limit: Linux 6.1 counts a fixed buffer's pages from the command's start to the piece's
// end against it), or larger where the region would need more than io_uring's 16384 buffers.
// Submit cuts commands at piece boundaries, so every command in the region is a fixed one.
constexpr uint64_t kPieceBytes = 256 << 10;
constexpr uint64_t kMaxPieces = 1 << 14;

uint64_t PieceBytes(uint64_t region) {
  const uint64_t min = (region + kMaxPieces - 1) / kMaxPieces;
  return std::max(kPieceBytes, RoundUp4K(min));
}

std::string ErrnoText(int err) { return std::strerror(err); }

using internal::UringBatch;
using internal::UringPart;

// One request, split into `chunks_left` commands; owner thread only.
struct ReqState {
  IoRequest* req = nullptr;
  UringPart* part = nullptr;
  uint32_t chunks_left = 0;
  int error = 0;  // the first chunk's error, or 0
};
struct Batch : UringBatch {
  std::vector<ReqState> reqs;  // sized once in Submit; never reallocated afterwards
};

// One command: bytes [at, at + len) of a request. A default one (`rs == nullptr`) marks an empty
// part.
struct Chunk {
  ReqState* rs = nullptr;
  UringPart* part = nullptr;
  uint32_t at = 0;
  uint32_t len = 0;
  bool fixed = false;  // issued with IORING_URING_CMD_FIXED

  bool empty() const { return rs == nullptr; }
  Op op() const { return rs->req->op; }
};

std::string DevicePath(int fd) {
  char buf[256];
  const std::string link = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = readlink(link.c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : absl::StrCat("fd ", fd);
}

absl::Status AdminError(const std::string& device, const char* what, int r, int err) {
  if (r > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(device, ": ", what, " failed: ", nvme_cmd::StatusText(r)));
  }
  if (err == EACCES || err == EPERM) {
    return absl::PermissionDeniedError(absl::StrCat(
        device, ": ", what, ": ", ErrnoText(err),
        " (NVMe passthrough needs CAP_SYS_ADMIN; run tuttid as root or grant it the capability)"));
  }
  if (err == ENOTTY || err == EINVAL) {
    return absl::FailedPreconditionError(
        absl::StrCat(device, ": ", what, ": ", ErrnoText(err),
                     ": not an NVMe namespace; io.passthrough_devices "
                     "lists NVMe generic char devices such as /dev/ng0n1"));
  }
  return absl::InternalError(absl::StrCat(device, ": ", what, ": ", ErrnoText(err)));
}

absl::StatusOr<nvme_cmd::Geometry> Identify(int fd, const std::string& device, uint32_t cap) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return absl::InternalError(absl::StrCat(device, ": fstat: ", ErrnoText(errno)));
  if (!S_ISCHR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        device,
        " is not a char device: io.passthrough_devices lists NVMe generic char devices "
        "(/dev/ngXnY, not the block device /dev/nvmeXnY)"));
  }
  const int nsid = ioctl(fd, NVME_IOCTL_ID);
  if (nsid <= 0) return AdminError(device, "NVME_IOCTL_ID", 0, nsid == 0 ? EINVAL : errno);
  AlignedBuffer ns(nvme_cmd::kIdentifyBytes), ctrl(nvme_cmd::kIdentifyBytes);
  nvme_passthru_cmd c = nvme_cmd::MakeIdentify(nvme_cmd::kCnsNamespace, nsid, ns.data());
  int r = ioctl(fd, NVME_IOCTL_ADMIN_CMD, &c);
  if (r != 0) return AdminError(device, "Identify Namespace", r, errno);
  c = nvme_cmd::MakeIdentify(nvme_cmd::kCnsController, 0, ctrl.data());
  r = ioctl(fd, NVME_IOCTL_ADMIN_CMD, &c);
  if (r != 0) return AdminError(device, "Identify Controller", r, errno);
  return nvme_cmd::ParseIdentify(ns.data(), ctrl.data(), static_cast<uint32_t>(nsid), cap, device);
}

// Whether the ring can run IORING_OP_URING_CMD (Linux 5.19 and later).
absl::Status CheckUringCmd(io_uring* ring, const std::string& device) {
  io_uring_probe* probe = io_uring_get_probe_ring(ring);
  const bool has_cmd = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_URING_CMD);
  if (probe != nullptr) io_uring_free_probe(probe);
  if (has_cmd) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      device, ": this kernel's io_uring lacks IORING_OP_URING_CMD (Linux 5.19 or later)"));
}

}  // namespace

absl::StatusOr<std::vector<int>> OpenPassthroughDevices(const std::vector<std::string>& paths) {
  std::vector<int> fds;
  absl::Cleanup close_all = [&] {
    for (int fd : fds) close(fd);
  };
  for (const std::string& p : paths) {
    const int fd = open(p.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      const std::string msg =
          absl::StrCat("io.passthrough_devices: open ", p, ": ", ErrnoText(err));
      if (err == ENOENT || err == ENXIO || err == ENODEV) return absl::NotFoundError(msg);
      if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
      return absl::InternalError(msg);
    }
    fds.push_back(fd);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "io.passthrough_devices: ", p, " is not a char device",
          S_ISBLK(st.st_mode) ? " (a block device: use its generic char device /dev/ngXnY)" : ""));
    }
  }
  std::move(close_all).Cancel();
  return fds;
}

// One namespace: how its requests' chunks become NVMe commands and what their completions mean,
// and the owner of its ring (internal::UringOwner), whose thread alone calls the UringItemOps
// methods.
class UringCmdBackend::NamespaceQueue final : public internal::UringItemOps<Chunk> {
 public:
  static absl::StatusOr<std::unique_ptr<NamespaceQueue>> Create(int fd, const NamespaceInfo& info,
                                                                uint64_t limit_bytes,
                                                                uint32_t depth);

  internal::UringOwner<Chunk>& owner() { return *owner_; }
  void AddCounters(UringCmdCounters* c) const;

  void Prepare(io_uring_sqe* sqe, Chunk& c, int target) override;
  bool Complete(Chunk& c, int res) override;

 private:
  NamespaceQueue(const NamespaceInfo& info, uint64_t limit)
      : info_(info),
        limit_(limit),
        geometry_{info.nsid, info.lba_bytes, info.bytes / info.lba_bytes, info.volatile_write_cache,
                  info.max_transfer_bytes} {}

  bool RetryPlain(const Chunk& c, int res);
  void LogControllerError(const Chunk& c, int status);

  const NamespaceInfo info_;
  const uint64_t limit_;  // bytes served: the capacity (+ test_extra_bytes)
  const nvme_cmd::Geometry geometry_;
  bool fixed_refused_ = false;  // the kernel refused a fixed-buffer command: plain ones only

  std::atomic<uint64_t> commands_{0}, fixed_ops_{0}, controller_errors_{0}, fixed_refusals_{0};
  // Last: destroyed first, so its thread is gone before the state above.
  std::unique_ptr<internal::UringOwner<Chunk>> owner_;
};

absl::StatusOr<std::unique_ptr<UringCmdBackend::NamespaceQueue>>
UringCmdBackend::NamespaceQueue::Create(int fd, const NamespaceInfo& info, uint64_t limit_bytes,
                                        uint32_t depth) {
  std::unique_ptr<NamespaceQueue> q(new NamespaceQueue(info, limit_bytes));
  internal::UringOwnerOptions o;
  o.name = info.device;
  o.depth = depth;
  o.setup_flags = IORING_SETUP_SQE128 | IORING_SETUP_CQE32;  // an NVMe command needs 128 bytes
  o.setup_flags_text = "SQE128 | CQE32";
  o.setup_hint = "NVMe passthrough needs Linux 5.19 or later with io_uring enabled";
  o.memlock_per = "namespace";
  o.check_ring = [device = info.device](io_uring* ring) { return CheckUringCmd(ring, device); };
  auto owner = internal::UringOwner<Chunk>::Create(fd, o, q.get());  // closes fd on failure
  if (!owner.ok()) return owner.status();
  q->owner_ = *std::move(owner);
  return q;
}

void UringCmdBackend::NamespaceQueue::AddCounters(UringCmdCounters* c) const {
  c->commands += commands_.load(std::memory_order_relaxed);
  c->fixed_buffer_ops += fixed_ops_.load(std::memory_order_relaxed);
  c->controller_errors += controller_errors_.load(std::memory_order_relaxed);
  c->fixed_buffer_refusals += fixed_refusals_.load(std::memory_order_relaxed);
}

void UringCmdBackend::NamespaceQueue::Prepare(io_uring_sqe* sqe, Chunk& c, int target) {
  const IoRequest& r = *c.rs->req;
  uint8_t* buf = static_cast<uint8_t*>(r.buf) + c.at;
  nvme_cmd::LbaRange range;
  // Submit checked the whole request against limit_; a chunk of it maps too.
  nvme_cmd::ToLbaRange(geometry_, r.offset + c.at, c.len, limit_, &range);
  const nvme_uring_cmd cmd = nvme_cmd::MakeIoCommand(
      r.op == Op::kRead ? nvme_cmd::kOpRead : nvme_cmd::kOpWrite, info_.nsid, range, buf, c.len);
  io_uring_prep_rw(IORING_OP_URING_CMD, sqe, target, nullptr, 0, 0);
  sqe->cmd_op = NVME_URING_CMD_IO;
  std::memset(sqe->cmd, 0, 80);  // the SQE128's command area
  std::memcpy(sqe->cmd, &cmd, sizeof(cmd));
  const int fixed = fixed_refused_ ? -1 : owner_->FixedIndex(buf, c.len);
  c.fixed = fixed >= 0;
  if (fixed >= 0) {
    sqe->uring_cmd_flags = IORING_URING_CMD_FIXED;
    sqe->buf_index = static_cast<uint16_t>(fixed);
    fixed_ops_.fetch_add(1, std::memory_order_relaxed);
  }
  commands_.fetch_add(1, std::memory_order_relaxed);
}

void UringCmdBackend::NamespaceQueue::LogControllerError(const Chunk& c, int status) {
  controller_errors_.fetch_add(1, std::memory_order_relaxed);
  const IoRequest& r = *c.rs->req;
  TUTTI_LOG_EVERY_N_SEC(
      log::Get("io"), spdlog::level::err, 5, "{} nsid {}: {} of {} LBAs at LBA {} failed: {}",
      info_.device, info_.nsid, r.op == Op::kRead ? "read" : "write", c.len / info_.lba_bytes,
      (r.offset + c.at) / info_.lba_bytes, nvme_cmd::StatusText(static_cast<uint16_t>(status)));
}

// Linux 6.1 refuses (EINVAL) a fixed-buffer passthrough command whose registered buffer has more
// pages from the command's start to the buffer's end than the queue has segments (its
// blk_rq_map_user_bvec counts the whole rest of the buffer), which a large staging buffer of small
// pages always does. The command is re-issued with a plain buffer, as is every later one.
bool UringCmdBackend::NamespaceQueue::RetryPlain(const Chunk& c, int res) {
  if (!c.fixed || res != -EINVAL) return false;
  if (!fixed_refused_) {
    log::Get("io")->warn(
        "{}: the kernel refused a fixed-buffer NVMe passthrough command (EINVAL; Linux 6.1 does "
        "so for registered buffers of more pages than the queue's segments); using plain "
        "buffers on this namespace from now on",
        info_.device);
  }
  fixed_refused_ = true;
  fixed_refusals_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool UringCmdBackend::NamespaceQueue::Complete(Chunk& c, int res) {
  if (RetryPlain(c, res)) return true;  // before everything queued
  ReqState* rs = c.rs;
  int err = 0;
  if (res < 0) {
    err = res;  // the kernel refused or cancelled the command
    TUTTI_LOG_EVERY_N_SEC(log::Get("io"), spdlog::level::err, 5, "{}: NVMe passthrough: {}",
                          info_.device, ErrnoText(-res));
  } else if (res > 0) {
    LogControllerError(c, res);
    err = nvme_cmd::StatusToErrno(static_cast<uint16_t>(res));
  }
  if (err != 0 && rs->error == 0) rs->error = err;
  if (--rs->chunks_left > 0) return false;
  rs->req->result = rs->error != 0 ? rs->error : static_cast<int64_t>(rs->req->len);
  internal::FinishRequest(rs->part);
  return false;
}

UringCmdBackend::~UringCmdBackend() { queues_.clear(); }

absl::StatusOr<std::unique_ptr<UringCmdBackend>> UringCmdBackend::Create(
    std::vector<int> fds, const UringCmdOptions& options) {
  size_t handed_over = 0;
  absl::Cleanup close_rest = [&] {
    for (size_t i = handed_over; i < fds.size(); ++i) close(fds[i]);
  };
  if (fds.empty()) return absl::InvalidArgumentError("uring_cmd backend: no passthrough devices");
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("io.queue_depth must be in [1, 4096], got ", options.queue_depth));
  }
  if (options.max_transfer_bytes < kAlignment || options.max_transfer_bytes % kAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("uring_cmd: max_transfer_bytes must be a positive multiple of 4096, got ",
                     options.max_transfer_bytes));
  }
  std::unique_ptr<UringCmdBackend> b(new UringCmdBackend());
  for (int fd : fds) {
    NamespaceInfo info;
    info.device = DevicePath(fd);
    auto g = Identify(fd, info.device, options.max_transfer_bytes);
    if (!g.ok()) return g.status();
    info.nsid = g->nsid;
    info.lba_bytes = g->lba_bytes;
    info.bytes = g->bytes();
    info.volatile_write_cache = g->volatile_write_cache;
    info.max_transfer_bytes = g->max_transfer_bytes;
    b->infos_.push_back(info);
    b->sizes_.push_back(info.bytes + options.test_extra_bytes);
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    auto q = NamespaceQueue::Create(fds[i], b->infos_[i], b->sizes_[i], options.queue_depth);
    handed_over = i + 1;  // NamespaceQueue::Create closes the fd itself on failure
    if (!q.ok()) return q.status();
    const NamespaceInfo& n = b->infos_[i];
    log::Get("io")->info(
        "{}: NVMe namespace {}, {} LBAs of {} bytes ({} bytes), volatile write cache {}, {} bytes "
        "per command at most",
        n.device, n.nsid, n.bytes / n.lba_bytes, n.lba_bytes, n.bytes,
        n.volatile_write_cache ? "yes (Sync sends Flush)" : "no", n.max_transfer_bytes);
    b->queues_.push_back(*std::move(q));
  }
  return b;
}

absl::Status UringCmdBackend::RegisterBuffer(absl::Span<uint8_t> region) {
  if (region.empty()) return absl::InvalidArgumentError("RegisterBuffer: empty region");
  if (buffer_registered_.exchange(true)) {
    return absl::FailedPreconditionError("RegisterBuffer: a buffer is already registered");
  }
  const uint64_t piece = PieceBytes(region.size());
  for (size_t i = 0; i < queues_.size(); ++i) {
    absl::Status s = queues_[i]->owner().RegisterBuffer(region, piece);
    if (s.ok()) continue;
    for (size_t j = 0; j < i; ++j) queues_[j]->owner().UnregisterBuffer();
    buffer_registered_.store(false);
    return s;
  }
  region_len_.store(region.size(), std::memory_order_relaxed);
  piece_bytes_.store(piece, std::memory_order_relaxed);
  region_base_.store(region.data(), std::memory_order_release);
  return absl::OkStatus();
}

void UringCmdBackend::Submit(absl::Span<IoRequest> batch, std::function<void()> done) {
  auto* b = new Batch;
  b->done = std::move(done);
  b->reqs.resize(batch.size());
  absl::InlinedVector<std::vector<Chunk>, 4> per_ns(queues_.size());
  absl::InlinedVector<uint32_t, 4> reqs_per_ns(queues_.size(), 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    IoRequest& r = batch[i];
    if (!internal::IsValidRequest(r, sizes_) || r.offset % infos_[r.file].lba_bytes != 0 ||
        r.len % infos_[r.file].lba_bytes != 0) {
      r.result = -EINVAL;
      continue;
    }
    ReqState& rs = b->reqs[i];
    rs.req = &r;
    const uint32_t max = infos_[r.file].max_transfer_bytes;
    for (uint32_t at = 0; at < r.len;) {
      const uint32_t len = ChunkBytes(static_cast<const uint8_t*>(r.buf) + at, r.len - at, max);
      per_ns[r.file].push_back(Chunk{&rs, nullptr, at, len});
      ++rs.chunks_left;
      at += len;
    }
    ++reqs_per_ns[r.file];
  }
  // Build every part before posting any: a posted part may finish (and free `b`) at once.
  absl::InlinedVector<uint32_t, 4> part_of(queues_.size(), 0);
  for (uint32_t f = 0; f < per_ns.size(); ++f) {
    if (per_ns[f].empty()) continue;
    part_of[f] = static_cast<uint32_t>(b->parts.size());
    b->parts.push_back(UringPart{b, reqs_per_ns[f]});
  }
  const bool empty = b->parts.empty();
  if (empty) b->parts.push_back(UringPart{b, 0});  // completes on namespace 0's thread
  b->parts_left.store(static_cast<uint32_t>(b->parts.size()), std::memory_order_relaxed);
  for (ReqState& rs : b->reqs) {
    if (rs.req != nullptr) rs.part = &b->parts[part_of[rs.req->file]];
  }
  if (empty) {
    queues_[0]->owner().Post(&b->parts[0], {});
    return;
  }
  for (uint32_t f = 0; f < per_ns.size(); ++f) {
    if (!per_ns[f].empty()) queues_[f]->owner().Post(&b->parts[part_of[f]], std::move(per_ns[f]));
  }
}

uint32_t UringCmdBackend::ChunkBytes(const uint8_t* buf, uint32_t left, uint32_t max) const {
  const uint32_t len = std::min(max, left);
  const uint8_t* base = region_base_.load(std::memory_order_acquire);
  if (base == nullptr || buf < base) return len;
  const uint64_t off = static_cast<uint64_t>(buf - base);
  if (off >= region_len_.load(std::memory_order_relaxed)) return len;
  const uint64_t piece = piece_bytes_.load(std::memory_order_relaxed);
  return static_cast<uint32_t>(std::min<uint64_t>(len, piece - off % piece));
}

absl::Status UringCmdBackend::Sync(uint32_t file) {
  if (file >= queues_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Sync: no namespace ", file));
  }
  const NamespaceInfo& n = infos_[file];
  if (!n.volatile_write_cache) return absl::OkStatus();
  nvme_passthru_cmd c = nvme_cmd::MakeFlush(n.nsid);
  int r;
  do {
    r = ioctl(queues_[file]->owner().fd(), NVME_IOCTL_IO_CMD, &c);
  } while (r < 0 && errno == EINTR);
  flushes_.fetch_add(1, std::memory_order_relaxed);
  if (r < 0) return absl::InternalError(absl::StrCat(n.device, ": NVMe Flush: ", ErrnoText(errno)));
  if (r > 0) {
    return absl::InternalError(
        absl::StrCat(n.device, ": NVMe Flush failed: ", nvme_cmd::StatusText(r)));
  }
  return absl::OkStatus();
}

UringCmdCounters UringCmdBackend::counters() const {
  UringCmdCounters c;
  for (const auto& q : queues_) q->AddCounters(&c);
  c.flushes = flushes_.load(std::memory_order_relaxed);
  return c;
}

void UringCmdBackend::RegisterStats(stats::Registry* registry) const {
  registry->AddGroup<UringCmdCounters>([this] { return counters(); })
      .Add({"tutti_io_uring_cmd_commands_total", "NVMe I/O commands the uring_cmd backend "
            "issued, by buffer: fixed (IORING_URING_CMD_FIXED) or plain.",
            stats::Type::kCounter, {"buffer"}},
           [](const UringCmdCounters& c, stats::Samples* out) {
             out->Add({"fixed"}, c.fixed_buffer_ops);
             out->Add({"plain"}, c.commands - std::min(c.fixed_buffer_ops, c.commands));
           })
      .Counter("tutti_io_uring_cmd_controller_errors_total",
               "Completions with a non-zero NVMe status.",
               [](const UringCmdCounters& c) { return c.controller_errors; })
      .Counter("tutti_io_uring_cmd_fixed_buffer_refusals_total",
               "Fixed-buffer commands the kernel refused, re-issued plain.",
               [](const UringCmdCounters& c) { return c.fixed_buffer_refusals; })
      .Counter("tutti_io_uring_cmd_flushes_total", "NVMe Flush commands sent by Sync.",
               [](const UringCmdCounters& c) { return c.flushes; });
}

}  // namespace tutti::io

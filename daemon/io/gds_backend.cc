#include "daemon/io/gds_backend.h"

#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/stats.h"
#include "daemon/io/cufile_api.h"
#include "daemon/io/request_check.h"

namespace tutti::io {
namespace {

// One Submit: `done` runs when the last of its requests completes, on the thread completing it.
struct Batch {
  std::function<void()> done;
  std::atomic<size_t> left{0};
};

void FinishOne(Batch* b) {
  if (b->left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::function<void()> done = std::move(b->done);
  delete b;
  if (done) done();
}

// A request queued on one file; `req == nullptr` is a batch with no valid request.
struct Pending {
  IoRequest* req = nullptr;
  Batch* batch = nullptr;
};

absl::StatusOr<uint64_t> SizeOf(int fd, uint32_t index) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gds: pool file ", index, ": fstat(fd ", fd, "): ", std::strerror(errno)));
  }
  if (S_ISREG(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  uint64_t bytes = 0;
  if (S_ISBLK(st.st_mode) && ioctl(fd, BLKGETSIZE64, &bytes) == 0) return bytes;
  return absl::InvalidArgumentError(absl::StrCat(
      "gds: pool file ", index, " (fd ", fd, ") is neither a regular file nor a block device"));
}

bool Failed(const cufile::Error& e) { return e.err != cufile::kSuccess; }

}  // namespace

// One pool file's cuFile handle and the thread that owns it.
class GdsBackend::FileQueue {
 public:
  FileQueue(const cufile::Api& api, cufile::Handle handle, uint32_t index,
            const Registered* registered)
      : api_(api), handle_(handle), index_(index), registered_(registered) {
    thread_ = std::thread([this] { Run(); });
  }
  // Finishes everything queued, stops the thread, deregisters the handle.
  ~FileQueue() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
    api_.handle_deregister(handle_);
  }

  void Post(std::vector<Pending> items) {
    absl::MutexLock lock(&mu_);
    incoming_.insert(incoming_.end(), items.begin(), items.end());
  }
  void AddCounters(GdsCounters* c) const {
    c->registered_buffer_ops += registered_ops_.load(std::memory_order_relaxed);
    c->plain_buffer_ops += plain_ops_.load(std::memory_order_relaxed);
    c->cufile_errors += errors_.load(std::memory_order_relaxed);
  }

 private:
  void Run();
  // Moves posted work to the owner's queues, first waiting for some when `block`. False once
  // stopping with nothing left to do.
  bool TakeIncoming(bool block);
  // Completes `req`: result = bytes moved, or -errno when nothing was.
  void Execute(IoRequest* req);
  // One cuFile call; bytes moved or -errno.
  int64_t Call(const IoRequest& req, uint32_t done_bytes);

  const cufile::Api& api_;
  const cufile::Handle handle_;
  const uint32_t index_;
  const Registered* const registered_;

  absl::Mutex mu_;
  std::vector<Pending> incoming_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::deque<Pending> queued_;  // owner thread only; arrival order
  std::atomic<uint64_t> registered_ops_{0}, plain_ops_{0}, errors_{0};
  std::thread thread_;
};

void GdsBackend::FileQueue::Run() {
  for (;;) {
    if (!TakeIncoming(queued_.empty())) return;
    if (queued_.empty()) continue;
    const Pending p = queued_.front();
    queued_.pop_front();
    if (p.req != nullptr) Execute(p.req);
    FinishOne(p.batch);
  }
}

bool GdsBackend::FileQueue::TakeIncoming(bool block) {
  std::vector<Pending> items;
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    if (block) {
      mu_.Await(absl::Condition(
          +[](FileQueue* q) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return !q->incoming_.empty() || q->stopping_;
          },
          this));
    }
    items.swap(incoming_);
    stopping = stopping_;
  }
  queued_.insert(queued_.end(), items.begin(), items.end());
  return !(stopping && queued_.empty());
}

void GdsBackend::FileQueue::Execute(IoRequest* req) {
  uint32_t moved = 0;
  while (moved < req->len) {
    const int64_t n = Call(*req, moved);
    if (n < 0) {
      req->result = moved > 0 ? moved : n;
      return;
    }
    if (n == 0) break;  // end of file: a short transfer
    moved += static_cast<uint32_t>(n);
  }
  req->result = moved;
}

int64_t GdsBackend::FileQueue::Call(const IoRequest& req, uint32_t done_bytes) {
  uint8_t* buf = static_cast<uint8_t*>(req.buf);
  uint8_t* base = registered_->base.load(std::memory_order_acquire);
  const uint64_t reg_len = registered_->len.load(std::memory_order_relaxed);
  off_t buf_offset = done_bytes;
  if (base != nullptr && buf >= base && static_cast<uint64_t>(buf - base) <= reg_len &&
      req.len <= reg_len - static_cast<uint64_t>(buf - base)) {
    buf_offset += buf - base;
    registered_ops_.fetch_add(1, std::memory_order_relaxed);
  } else {
    base = buf;
    plain_ops_.fetch_add(1, std::memory_order_relaxed);
  }
  const size_t size = req.len - done_bytes;
  const off_t file_offset = static_cast<off_t>(req.offset + done_bytes);
  errno = 0;
  const ssize_t n = req.op == Op::kRead
                        ? api_.read(handle_, base, size, file_offset, buf_offset)
                        : api_.write(handle_, base, size, file_offset, buf_offset);
  if (n >= 0) return n;
  errors_.fetch_add(1, std::memory_order_relaxed);
  const char* op = req.op == Op::kRead ? "cuFileRead" : "cuFileWrite";
  if (n == -1) {
    const int err = errno != 0 ? errno : EIO;
    TUTTI_LOG_EVERY_N_SEC(log::Get("io"), spdlog::level::err, 5,
                          "gds pool file {}: {}(offset {}, {} bytes): {}", index_, op, file_offset,
                          size, std::strerror(err));
    return -err;
  }
  // -CUfileOpError; some versions answer a plain -errno.
  const int code = static_cast<int>(-n);
  TUTTI_LOG_EVERY_N_SEC(log::Get("io"), spdlog::level::err, 5,
                        "gds pool file {}: {}(offset {}, {} bytes): {}", index_, op, file_offset,
                        size,
                        code > cufile::kBaseErr ? cufile::CodeName(code) : std::strerror(code));
  return code > cufile::kBaseErr ? -EIO : -code;
}

GdsBackend::GdsBackend(std::unique_ptr<cufile::CuFileLibrary> lib, bool close_driver)
    : lib_(std::move(lib)), close_driver_(close_driver) {}

GdsBackend::~GdsBackend() {
  queues_.clear();  // every batch completes; the handles are deregistered
  const cufile::Api& api = lib_->api();
  if (uint8_t* base = registered_.base.load()) api.buf_deregister(base);
  if (close_driver_) api.driver_close();
  for (int fd : fds_) close(fd);
}

const std::string& GdsBackend::library() const { return lib_->path(); }

absl::StatusOr<std::unique_ptr<GdsBackend>> GdsBackend::Create(std::vector<int>* fds,
                                                               const GdsOptions& options) {
  if (fds->empty()) return absl::InvalidArgumentError("gds backend: no pool files");
  if (!options.gpu_staging) {
    return absl::UnavailableError(
        "gds: host mode (gpu.mode chose no GPU), so there is no GPU staging for cuFile to move "
        "data to");
  }
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < fds->size(); ++i) {
    absl::StatusOr<uint64_t> size = SizeOf((*fds)[i], static_cast<uint32_t>(i));
    if (!size.ok()) return size.status();
    sizes.push_back(*size);
  }
  auto lib = cufile::CuFileLibrary::Load(options.library);
  if (!lib.ok()) return absl::UnavailableError(absl::StrCat("gds: ", lib.status().message()));
  const cufile::Api& api = (*lib)->api();
  const cufile::Error opened = api.driver_open();
  if (Failed(opened) && opened.err != cufile::kDriverAlreadyOpen) {
    return absl::UnavailableError(
        absl::StrCat("gds: cuFileDriverOpen: ", cufile::ErrorText(opened)));
  }
  std::unique_ptr<GdsBackend> backend(new GdsBackend(*std::move(lib), !Failed(opened)));
  backend->sizes_ = std::move(sizes);
  for (size_t i = 0; i < fds->size(); ++i) {
    cufile::Descr descr{};
    descr.type = cufile::kHandleTypeOpaqueFd;
    descr.handle.fd = (*fds)[i];
    cufile::Handle handle = nullptr;
    const cufile::Error reg = api.handle_register(&handle, &descr);
    if (Failed(reg)) {
      // The fds stay the caller's: the queues made so far deregister their handles only.
      return absl::UnavailableError(absl::StrCat("gds: cuFileHandleRegister(pool file ", i,
                                                 "): ", cufile::ErrorText(reg)));
    }
    backend->queues_.push_back(std::make_unique<FileQueue>(api, handle, static_cast<uint32_t>(i),
                                                           &backend->registered_));
  }
  backend->fds_ = std::move(*fds);
  fds->clear();
  return backend;
}

absl::Status GdsBackend::RegisterBuffer(absl::Span<uint8_t> region) {
  if (region.empty()) return absl::InvalidArgumentError("RegisterBuffer: empty region");
  if (buffer_taken_.exchange(true)) {
    return absl::FailedPreconditionError("RegisterBuffer: a buffer is already registered");
  }
  const cufile::Error e = lib_->api().buf_register(region.data(), region.size(), 0);
  if (Failed(e)) {
    buffer_taken_.store(false);
    return absl::UnavailableError(absl::StrCat("gds: cuFileBufRegister(", region.size(),
                                               " bytes): ", cufile::ErrorText(e)));
  }
  registered_.len.store(region.size(), std::memory_order_relaxed);
  registered_.base.store(region.data(), std::memory_order_release);
  return absl::OkStatus();
}

void GdsBackend::Submit(absl::Span<IoRequest> batch, std::function<void()> done) {
  auto* b = new Batch;
  b->done = std::move(done);
  std::vector<std::vector<Pending>> per_file(queues_.size());
  size_t valid = 0;
  for (IoRequest& r : batch) {
    if (!internal::IsValidRequest(r, sizes_)) {
      r.result = -EINVAL;
      continue;
    }
    per_file[r.file].push_back(Pending{&r, b});
    ++valid;
  }
  if (valid == 0) {
    b->left.store(1, std::memory_order_relaxed);
    queues_[0]->Post({Pending{nullptr, b}});  // `done` still runs on a backend thread
    return;
  }
  b->left.store(valid, std::memory_order_relaxed);  // before any post: one may finish at once
  for (size_t f = 0; f < per_file.size(); ++f) {
    if (!per_file[f].empty()) queues_[f]->Post(std::move(per_file[f]));
  }
}

absl::Status GdsBackend::Sync(uint32_t file) {
  if (file >= fds_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("Sync: no pool file ", file));
  }
  int r;
  do {
    r = fdatasync(fds_[file]);
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    return absl::InternalError(
        absl::StrCat("fdatasync(pool file ", file, "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

GdsCounters GdsBackend::counters() const {
  GdsCounters c;
  for (const auto& q : queues_) q->AddCounters(&c);
  return c;
}

void GdsBackend::RegisterStats(stats::Registry* registry) const {
  registry->AddGroup<GdsCounters>([this] { return counters(); })
      .Add({"tutti_io_gds_ops_total", "cuFile calls of the gds backend, by buffer: registered "
            "(the registered staging) or plain.", stats::Type::kCounter, {"buffer"}},
           [](const GdsCounters& c, stats::Samples* out) {
             out->Add({"registered"}, c.registered_buffer_ops);
             out->Add({"plain"}, c.plain_buffer_ops);
           })
      .Counter("tutti_io_gds_errors_total",
               "cuFile calls that returned a cuFile error or -1 with errno.",
               [](const GdsCounters& c) { return c.cufile_errors; });
}

}  // namespace tutti::io

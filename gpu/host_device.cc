#include "gpu/host_device.h"

#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gpu/copy_runs.h"

namespace tutti::gpu {
namespace {

constexpr uint64_t kAlign = 4096;

// Opaque handle values: never dereferenced, only compared.
template <typename Handle>
Handle MakeHandle(uint64_t n) {
  return reinterpret_cast<Handle>(static_cast<uintptr_t>(n * 64));
}

absl::Status Misuse(const char* what, absl::string_view detail) {
  return absl::InternalError(absl::StrCat("host device: ", what, ": ", detail));
}

}  // namespace

class HostPinnedBuffer final : public Device::PinnedBuffer {
 public:
  HostPinnedBuffer(HostDevice* device, uint8_t* host) : device_(device), host_(host) {}
  ~HostPinnedBuffer() override { device_->FreeBlock(host_); }
  uint8_t* host() const override { return host_; }

 private:
  HostDevice* const device_;
  uint8_t* const host_;
};

HostDevice::HostDevice(uint64_t max_pitch)
    : max_pitch_(max_pitch), io_stream_(MakeHandle<Stream>(1)) {
  absl::MutexLock lock(&mu_);
  streams_.insert(io_stream_);
  next_handle_ = 2;
}

HostDevice::~HostDevice() {
  absl::MutexLock lock(&mu_);
  for (const auto& [addr, block] : blocks_) std::free(reinterpret_cast<void*>(addr));
}

void HostDevice::FailOp(Op op, uint64_t after, absl::Status status) {
  absl::MutexLock lock(&mu_);
  failures_.push_back({op, counts_[static_cast<size_t>(op)] + after, std::move(status)});
}

uint64_t HostDevice::count(Op op) const {
  absl::MutexLock lock(&mu_);
  return counts_[static_cast<size_t>(op)];
}

uint64_t HostDevice::kernel_objects() const {
  absl::MutexLock lock(&mu_);
  return kernel_objects_;
}

uint64_t HostDevice::copy_engine_objects() const {
  absl::MutexLock lock(&mu_);
  return copy_engine_objects_;
}

uint64_t HostDevice::copy_engine_runs() const {
  absl::MutexLock lock(&mu_);
  return copy_engine_runs_;
}

size_t HostDevice::live_allocations() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [at, b] : blocks_) n += !b.registered;
  return n;
}

void HostDevice::RegisterHost(void* p, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  blocks_[reinterpret_cast<uintptr_t>(p)] = Block{bytes, true, true};
}

void HostDevice::UnregisterHost(void* p) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
  if (it != blocks_.end() && it->second.registered) blocks_.erase(it);
}

absl::Status HostDevice::Begin(Op op, Stream stream, const char* what) {
  absl::MutexLock lock(&mu_);
  if (stream != nullptr && streams_.count(stream) == 0) return Misuse(what, "unknown stream");
  if (stream != nullptr && stuck_.count(stream) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "host device: ", what, ": the stream is stuck behind a word wait that never ends"));
  }
  uint64_t& n = counts_[static_cast<size_t>(op)];
  for (auto it = failures_.begin(); it != failures_.end(); ++it) {
    if (it->op == op && it->after == n) {
      absl::Status s = std::move(it->status);
      failures_.erase(it);
      return s;
    }
  }
  ++n;
  return absl::OkStatus();
}

absl::Status HostDevice::CheckRange(const void* p, uint64_t len, bool pinned_ok,
                                    const char* what) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = blocks_.upper_bound(a);
  if (it != blocks_.begin()) {
    --it;
    const bool kind_ok = !it->second.pinned || pinned_ok;
    if (kind_ok && a >= it->first && a - it->first <= it->second.size &&
        len <= it->second.size - (a - it->first)) {
      return absl::OkStatus();
    }
  }
  return Misuse(what,
                absl::StrFormat("[%p, +%u) is not inside one %s", p, len,
                                pinned_ok ? "device or pinned allocation" : "device allocation"));
}

absl::Status HostDevice::CheckDescs(const CopyDesc* descs, size_t count, uint32_t object_len,
                                    const char* what) const {
  absl::ReaderMutexLock lock(&mu_);
  for (size_t i = 0; i < count; ++i) {
    if (reinterpret_cast<uintptr_t>(descs[i].src) % kCopyAlign != 0 ||
        reinterpret_cast<uintptr_t>(descs[i].dst) % kCopyAlign != 0 || object_len % kCopyAlign) {
      return Misuse(what, absl::StrCat("descriptor ", i, " unaligned"));
    }
    if (absl::Status s = CheckRange(descs[i].src, object_len, true, what); !s.ok()) return s;
    if (absl::Status s = CheckRange(descs[i].dst, object_len, true, what); !s.ok()) return s;
  }
  return absl::OkStatus();
}

uint8_t* HostDevice::AllocateBlock(uint64_t bytes, bool pinned) {
  const uint64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kAlign, size == 0 ? kAlign : size));
  if (p == nullptr) return nullptr;
  absl::MutexLock lock(&mu_);
  blocks_[reinterpret_cast<uintptr_t>(p)] = Block{bytes, pinned};
  return p;
}

void HostDevice::FreeBlock(void* p) {
  if (p == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    auto it = blocks_.find(reinterpret_cast<uintptr_t>(p));
    if (it == blocks_.end() || it->second.registered) return;  // not ours: leave it
    blocks_.erase(it);
  }
  std::free(p);
}

absl::StatusOr<uint8_t*> HostDevice::Allocate(uint64_t bytes, const char* what) {
  if (absl::Status s = Begin(Op::kAllocate, nullptr, what); !s.ok()) return s;
  uint8_t* p = AllocateBlock(bytes, /*pinned=*/false);
  if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  return p;
}

void HostDevice::Free(void* p) { FreeBlock(p); }

absl::Status HostDevice::Memset(void* p, int value, uint64_t bytes, const char* what) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (absl::Status s = CheckRange(p, bytes, false, what); !s.ok()) return s;
  }
  std::memset(p, value, bytes);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Device::PinnedBuffer>> HostDevice::AllocatePinned(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("host device: empty pinned buffer");
  uint8_t* p = AllocateBlock(bytes, /*pinned=*/true);
  if (p == nullptr) return absl::ResourceExhaustedError("host device: pinned: out of memory");
  return std::unique_ptr<PinnedBuffer>(new HostPinnedBuffer(this, p));
}

absl::StatusOr<Device::Stream> HostDevice::CreateStream(const char*) {
  absl::MutexLock lock(&mu_);
  Stream s = MakeHandle<Stream>(next_handle_++);
  streams_.insert(s);
  return s;
}

void HostDevice::DestroyStream(Stream stream) {
  absl::MutexLock lock(&mu_);
  if (stream == io_stream_) return;
  streams_.erase(stream);
  stuck_.erase(stream);
}

absl::Status HostDevice::SyncStream(Stream stream, const char* what) {
  return Begin(Op::kSyncStream, stream, what);
}

absl::StatusOr<Device::Event> HostDevice::CreateEvent(EventKind kind, const char*) {
  absl::MutexLock lock(&mu_);
  Event e = MakeHandle<Event>(next_handle_++);
  events_[e] = EventState{kind};
  return e;
}

void HostDevice::DestroyEvent(Event event) {
  absl::MutexLock lock(&mu_);
  events_.erase(event);
}

absl::Status HostDevice::RecordEvent(Event event, Stream stream, const char* what) {
  if (absl::Status s = Begin(Op::kRecordEvent, stream, what); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = events_.find(event);
  if (it == events_.end()) return Misuse(what, "unknown event");
  it->second.recorded = true;
  it->second.at = std::chrono::steady_clock::now();
  return absl::OkStatus();
}

void HostDevice::SetSyncEventHook(std::function<void()> hook) {
  absl::MutexLock lock(&mu_);
  sync_event_hook_ = std::move(hook);
}

absl::Status HostDevice::SyncEvent(Event event, const char* what) {
  std::function<void()> hook;
  {
    absl::MutexLock lock(&mu_);
    hook = sync_event_hook_;
  }
  if (hook) hook();
  if (absl::Status s = Begin(Op::kSyncEvent, nullptr, what); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (events_.count(event) == 0) return Misuse(what, "unknown event");
  return absl::OkStatus();  // a recorded event is complete; one never recorded is too (CUDA)
}

bool HostDevice::EventDone(Event event) {
  absl::MutexLock lock(&mu_);
  return events_.count(event) != 0;
}

absl::StatusOr<float> HostDevice::ElapsedMs(Event start, Event end) {
  absl::MutexLock lock(&mu_);
  auto a = events_.find(start), b = events_.find(end);
  if (a == events_.end() || b == events_.end() || a->second.kind != EventKind::kTiming ||
      b->second.kind != EventKind::kTiming || !a->second.recorded || !b->second.recorded) {
    return Misuse("elapsed", "events unknown, not timing events, or not recorded");
  }
  return std::chrono::duration<float, std::milli>(b->second.at - a->second.at).count();
}

absl::Status HostDevice::CopyToDevice(void* dst, const void* src, uint64_t len, Stream stream,
                                      const char* what) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (absl::Status s = CheckRange(dst, len, false, what); !s.ok()) return s;
  }
  if (absl::Status s = Begin(Op::kCopyToDevice, stream, what); !s.ok()) return s;
  std::memcpy(dst, src, len);
  return absl::OkStatus();
}

absl::Status HostDevice::CopyToDevice2D(void* dst, uint64_t dpitch, const void* src,
                                        uint64_t spitch, uint64_t width, uint64_t rows,
                                        Stream stream, const char* what) {
  if (width > dpitch || width > spitch || dpitch > max_pitch_ || spitch > max_pitch_) {
    return Misuse(what, absl::StrCat("pitches ", dpitch, " / ", spitch, " for rows of ", width,
                                     " bytes (max pitch ", max_pitch_, ")"));
  }
  if (rows > 0) {
    absl::ReaderMutexLock lock(&mu_);
    absl::Status s = CheckRange(dst, (rows - 1) * dpitch + width, false, what);
    if (!s.ok()) return s;
  }
  if (absl::Status s = Begin(Op::kCopyToDevice2D, stream, what); !s.ok()) return s;
  for (uint64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<uint8_t*>(dst) + r * dpitch,
                static_cast<const uint8_t*>(src) + r * spitch, width);
  }
  return absl::OkStatus();
}

absl::Status HostDevice::WriteValue32(Stream stream, uint32_t* word, uint32_t value,
                                      const char* what) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (absl::Status s = CheckRange(word, sizeof(*word), false, what); !s.ok()) return s;
  }
  if (absl::Status s = Begin(Op::kWriteValue32, stream, what); !s.ok()) return s;
  *word = value;
  return absl::OkStatus();
}

absl::Status HostDevice::WaitValue32(Stream stream, const uint32_t* word, uint32_t value,
                                     const char* what) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (absl::Status s = CheckRange(word, sizeof(*word), false, what); !s.ok()) return s;
  }
  if (absl::Status s = Begin(Op::kWaitValue32, stream, what); !s.ok()) return s;
  if (*word != value) {
    absl::MutexLock lock(&mu_);
    stuck_.insert(stream);
    return absl::FailedPreconditionError(absl::StrCat(
        "host device: ", what, ": would wait forever (word ", *word, ", waiting for ", value, ")"));
  }
  return absl::OkStatus();
}

absl::Status HostDevice::LaunchCopy(const CopyDesc* descs, size_t count, uint32_t object_len,
                                    Stream stream, const char* what) {
  if (absl::Status s = CheckDescs(descs, count, object_len, what); !s.ok()) return s;
  if (absl::Status s = Begin(Op::kLaunchCopy, stream, what); !s.ok()) return s;
  for (size_t i = 0; i < count; ++i) std::memcpy(descs[i].dst, descs[i].src, object_len);
  absl::MutexLock lock(&mu_);
  kernel_objects_ += count;
  return absl::OkStatus();
}

absl::Status HostDevice::CopyByCopyEngine(const CopyDesc* descs, const uint32_t* groups,
                                          size_t count, uint32_t object_len, Stream stream,
                                          const char* what) {
  if (absl::Status s = CheckDescs(descs, count, object_len, what); !s.ok()) return s;
  // As CudaDevice does: the copy engines are given runs, not objects; a run across two
  // allocations (groups that do not keep to one) is misuse, as a GPU copy over it would be.
  thread_local std::vector<CopyRun> runs;
  MergeCopyRuns(descs, groups, count, object_len, &runs);
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const CopyRun& r : runs) {
      if (absl::Status s = CheckRange(r.src, r.bytes, true, what); !s.ok()) return s;
      if (absl::Status s = CheckRange(r.dst, r.bytes, true, what); !s.ok()) return s;
    }
  }
  if (absl::Status s = Begin(Op::kCopyByCopyEngine, stream, what); !s.ok()) return s;
  for (const CopyRun& r : runs) std::memcpy(r.dst, r.src, r.bytes);
  absl::MutexLock lock(&mu_);
  copy_engine_objects_ += count;
  copy_engine_runs_ += runs.size();
  return absl::OkStatus();
}

absl::Status HostDevice::LaunchHash(const HashDesc* descs, size_t count, uint64_t* hashes,
                                    Stream stream, const char* what) {
  {
    absl::ReaderMutexLock lock(&mu_);
    if (absl::Status s = CheckRange(descs, count * sizeof(HashDesc), true, what); !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckRange(hashes, count * sizeof(uint64_t), true, what); !s.ok()) {
      return s;
    }
    for (size_t i = 0; i < count; ++i) {
      if (!GpuHashSupports(descs[i].len) ||
          reinterpret_cast<uintptr_t>(descs[i].data) % kCopyAlign != 0) {
        return Misuse(what, absl::StrCat("descriptor ", i, ": unaligned or unsupported length ",
                                         descs[i].len));
      }
      if (absl::Status s = CheckRange(descs[i].data, descs[i].len, false, what); !s.ok()) {
        return s;
      }
    }
  }
  if (absl::Status s = Begin(Op::kLaunchHash, stream, what); !s.ok()) return s;
  for (size_t i = 0; i < count; ++i) {
    hashes[i] = XXH3_64bits_withSeed(descs[i].data, descs[i].len, descs[i].seed);
  }
  return absl::OkStatus();
}

}  // namespace tutti::gpu

#include "daemon/gpu/layer_copier.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu/cuda_device.h"

namespace tutti::gpu {
namespace {

constexpr uint64_t kGranularity = 2ull << 20;
// Runs start at this alignment in a slot (the copy kernel needs 16).
constexpr uint64_t kRunAlign = 256;
// Objects at most this far apart in host memory share a run (the gap is copied too): staging
// frames are 4 KiB-rounded, so an object shorter than its frame leaves a gap below 4 KiB.
constexpr uint64_t kMaxGap = 4096;
// The bounce threads copy pieces of at most this size.
constexpr uint64_t kBouncePiece = 1ull << 20;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

// Copies jobs with `threads` threads (the caller's and threads - 1 of its own). Run calls must
// not overlap (the copier's lock serializes them).
class CopyPool {
 public:
  using Job = LayerCopier::CopyJob;
  explicit CopyPool(uint32_t threads) {
    for (uint32_t i = 1; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~CopyPool() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }
  void Run(absl::Span<const Job> jobs) {
    {
      absl::MutexLock lock(&mu_);
      jobs_ = jobs;
      next_.store(0);
      busy_ = static_cast<uint32_t>(threads_.size());
      ++generation_;
    }
    Drain(jobs);
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return busy_ == 0; };
    mu_.Await(absl::Condition(&done));
  }

 private:
  void Drain(absl::Span<const Job> jobs) {
    for (size_t i; (i = next_.fetch_add(1)) < jobs.size();) {
      std::memcpy(jobs[i].dst, jobs[i].src, jobs[i].len);
    }
  }
  void Work() {
    uint64_t seen = 0;
    for (;;) {
      absl::Span<const Job> jobs;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || generation_ != seen;
        };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        seen = generation_;
        jobs = jobs_;
      }
      Drain(jobs);
      absl::MutexLock lock(&mu_);
      --busy_;
    }
  }

  absl::Mutex mu_;
  absl::Span<const Job> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t busy_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<size_t> next_{0};
  std::vector<std::thread> threads_;
};

LayerCopier::LayerCopier(const Options& options, Device* device,
                         std::unique_ptr<Device> owned_device)
    : options_(options), owned_device_(std::move(owned_device)), device_(device) {}

absl::StatusOr<std::unique_ptr<LayerCopier>> LayerCopier::Create(
    const Options& options, IoStream* stream, absl::Span<const StagingRegion> registered) {
  auto device = std::make_unique<CudaDevice>(stream);
  Device* d = device.get();
  return CreateOn(options, d, std::move(device), registered);
}

absl::StatusOr<std::unique_ptr<LayerCopier>> LayerCopier::Create(
    const Options& options, Device* device, absl::Span<const StagingRegion> registered) {
  return CreateOn(options, device, nullptr, registered);
}

absl::StatusOr<std::unique_ptr<LayerCopier>> LayerCopier::CreateOn(
    const Options& options, Device* device, std::unique_ptr<Device> owned_device,
    absl::Span<const StagingRegion> registered) {
  if (options.gpu_staging_bytes == 0) {
    return absl::InvalidArgumentError("LayerCopier: gpu_staging_bytes must be > 0");
  }
  ASSIGN_OR_RETURN(StagingMap map, StagingMap::Create(registered));
  RETURN_IF_ERROR(device->Activate());  // UNAVAILABLE without a GPU
  std::unique_ptr<LayerCopier> copier(new LayerCopier(options, device, std::move(owned_device)));
  copier->registered_ = std::move(map);
  copier->registered_list_.assign(registered.begin(), registered.end());
  RETURN_IF_ERROR(copier->Init(registered));
  log::Get("gpu")->info("gpu{}: retrieve copies {}; GPU staging {} x {} MiB, rounds of {}; {}",
                        device->ordinal(),
                        options.mode == Mode::kStaged
                            ? "staged (copy engine, then a device-to-device scatter)"
                        : options.mode == Mode::kMapped
                            ? "mapped (scatter kernel over mapped pinned staging)"
                        : options.mode == Mode::kCopyEngine
                            ? "by the copy engines alone (one batched copy per layer, no SMs)"
                            : absl::StrCat("auto (staged; by the copy engines alone while the "
                                           "scatter kernel runs over ",
                                           options.auto_slow_factor, " x its idle time, ",
                                           absl::StrFormat("%.1f us + %.2f us/MiB",
                                                           copier->idle_.fixed_us,
                                                           copier->idle_.us_per_mib),
                                           ")"),
                        kSlots, copier->slot_bytes_ >> 20,
                        options.round_bytes == 0 || options.round_bytes >= copier->slot_bytes_
                            ? std::string("a slot")
                            : absl::StrCat(options.round_bytes >> 10, " KiB"),
                        options.bounce_threads > 0
                            ? absl::StrCat("unregistered memory through a pinned bounce buffer, ",
                                           options.bounce_threads, " threads")
                            : std::string("unregistered memory copied pageable"));
  return copier;
}

absl::Status LayerCopier::Init(absl::Span<const StagingRegion>) {
  slot_bytes_ = AlignUp((options_.gpu_staging_bytes + kSlots - 1) / kSlots, kGranularity);
  ASSIGN_OR_RETURN(max_pitch_, device_->MaxPitch());
  ASSIGN_OR_RETURN(gpu_base_, device_->Allocate(kSlots * slot_bytes_,
                                                "cudaMalloc(GPU staging for retrieves)"));
  ASSIGN_OR_RETURN(uint8_t* const words,
                   device_->Allocate(2 * kSlots * sizeof(uint32_t), "cudaMalloc(words)"));
  words_ = reinterpret_cast<uint32_t*>(words);
  RETURN_IF_ERROR(device_->Memset(words_, 0, 2 * kSlots * sizeof(uint32_t), "memset"));
  ASSIGN_OR_RETURN(copy_stream_, device_->CreateStream("cudaStreamCreate(copy)"));
  ASSIGN_OR_RETURN(gather_stream_, device_->CreateStream("cudaStreamCreate(gather)"));
  ASSIGN_OR_RETURN(gathered_,
                   device_->CreateEvent(Device::EventKind::kBlocking, "cudaEventCreate(gather)"));
  // Blocking sync: a Retrieve's thread waits for each layer; spinning would take a core from the
  // reads it overlaps.
  ASSIGN_OR_RETURN(waited_, device_->CreateEvent(Device::EventKind::kBlocking, "cudaEventCreate"));
  {
    ASSIGN_OR_RETURN(std::unique_ptr<Lane> own, NewLane());
    absl::MutexLock lock(&own_mu_);
    own_lane_ = std::move(own);
  }
  if (options_.bounce_threads > 0) {
    ASSIGN_OR_RETURN(bounce_, device_->AllocatePinned(kSlots * slot_bytes_));
    for (Device::Event& ev : bounce_free_) {
      ASSIGN_OR_RETURN(ev, device_->CreateEvent(Device::EventKind::kOrder, "cudaEventCreate"));
    }
    pool_ = std::make_unique<CopyPool>(options_.bounce_threads);
  }
  if (options_.mode == Mode::kAuto) {
    for (Device::Event& ev : timed_) {
      ASSIGN_OR_RETURN(ev,
                       device_->CreateEvent(Device::EventKind::kTiming, "cudaEventCreate(timing)"));
    }
    RETURN_IF_ERROR(MeasureIdleKernel());
  }
  return device_->Synchronize();
}

LayerCopier::~LayerCopier() {
  auto logger = log::Get("gpu");
  if (options_.mode == Mode::kAuto) {
    absl::MutexLock lock(&mu_);
    logger->info(
        "gpu{}: auto scatter: {} of {} layers by the copy engines; {} rounds timed, {} slow ({} "
        "slow with the enqueueing time left in)",
        device_->ordinal(), counters_.copy_engine_layers, counters_.layers,
        counters_.timed_rounds, counters_.slow_rounds, counters_.slow_rounds_uncorrected);
  }
  absl::Status s = device_->SyncStream(device_->io_stream(), "I/O stream synchronize");
  if (!s.ok()) logger->error("gpu{}: closing copier: {}", device_->ordinal(), s.ToString());
  device_->DestroyStream(copy_stream_);  // waits for it first; nothing for a null stream
  device_->DestroyStream(gather_stream_);
  device_->DestroyEvent(gathered_);
  pool_.reset();
  // Null handles (never created) are skipped by DestroyEvent and Free.
  for (Device::Event ev : bounce_free_) device_->DestroyEvent(ev);
  {
    absl::MutexLock lock(&own_mu_);
    own_lane_.reset();
  }
  device_->DestroyEvent(waited_);
  for (Device::Event ev : timed_) device_->DestroyEvent(ev);
  bounce_.reset();
  device_->Free(words_);
  device_->Free(gpu_base_);
}

std::string_view LayerCopier::ModeName(Mode mode) {
  switch (mode) {
    case Mode::kStaged:
      return "staged";
    case Mode::kMapped:
      return "mapped";
    case Mode::kCopyEngine:
      return "copy_engine";
    case Mode::kAuto:
      return "auto";
  }
  return "?";
}

std::optional<LayerCopier::Mode> LayerCopier::ModeFromName(std::string_view name) {
  for (Mode m : {Mode::kStaged, Mode::kMapped, Mode::kCopyEngine, Mode::kAuto}) {
    if (ModeName(m) == name) return m;
  }
  return std::nullopt;
}

std::vector<StagingRegion> LayerCopier::staging_regions() const {
  std::vector<StagingRegion> out = registered_list_;
  out.push_back(StagingRegion{gpu_base_, kSlots * slot_bytes_, gpu_base_});
  return out;
}

bool LayerCopier::IsRegistered(const uint8_t* host, uint64_t len) const {
  return registered_.ToDevice(host, len) != nullptr;
}

LayerCopier::Lane::~Lane() {
  for (Device::Event ev : landed_) device_->DestroyEvent(ev);  // null ones skipped
}

absl::StatusOr<std::unique_ptr<LayerCopier::Lane>> LayerCopier::NewLane() {
  std::unique_ptr<Lane> lane(new Lane(device_));
  for (Device::Event& ev : lane->landed_) {
    ASSIGN_OR_RETURN(ev,
                     device_->CreateEvent(Device::EventKind::kBlocking, "cudaEventCreate(lane)"));
  }
  return lane;
}

absl::Status LayerCopier::ScatterLayer(CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops,
                                       ReadyWords* words, uint32_t word, uint32_t ticket, Wait wait,
                                       Lane* lane) {
  if (lane != nullptr) return ScatterOnLane(memory, ops, words, word, ticket, wait, lane);
  absl::MutexLock own(&own_mu_);
  return ScatterOnLane(memory, ops, words, word, ticket, wait, own_lane_.get());
}

absl::Status LayerCopier::ScatterOnLane(CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops,
                                        ReadyWords* words, uint32_t word, uint32_t ticket,
                                        Wait wait, Lane* lane) {
  const Device::Event mine = lane->landed_[lane->next_];
  {
    absl::MutexLock lock(&mu_);
    const absl::Status s = EnqueueLayerLocked(memory, ops, words, word, ticket, mine);
    if (!s.ok()) {
      lane->pending_ = false;
      RecoverLocked();
      return s;
    }
  }
  lane->next_ ^= 1;
  // The I/O stream waited for every slot's copy, so once it is past a layer, that layer's host
  // staging is free too. The stream runs in order: once this lane's layer has landed, so has
  // everything enqueued before it.
  absl::Status s;
  if (wait == Wait::kLanded) {
    lane->pending_ = false;
    s = device_->SyncEvent(mine, "cudaEventSynchronize(layer)");
  } else if (std::exchange(lane->pending_, true)) {
    s = device_->SyncEvent(lane->landed_[lane->next_], "cudaEventSynchronize(layer)");
  }
  if (!s.ok()) {
    lane->pending_ = false;
    absl::MutexLock lock(&mu_);
    RecoverLocked();
  }
  return s;
}

void LayerCopier::RecoverLocked() {
  // Copies of this layer (and of earlier kPrevious ones) may be queued on either stream, reading
  // host staging that the caller gives back as soon as this returns.
  WaitStreamsAfterError();
  ResetSlotWords();
}

void LayerCopier::ResetSlotWords() {
  const absl::Status s =
      device_->Memset(words_, 0, 2 * kSlots * sizeof(uint32_t), "memset(slot words)");
  if (!s.ok()) {
    log::Get("gpu")->error("gpu{}: resetting the staging slots' words after a failed layer: {}",
                           device_->ordinal(), s.ToString());
    return;
  }
  uses_.fill(0);
}

void LayerCopier::WaitStreamsAfterError() {
  // Each stream's waits on the other's words end: FlushRound enqueues both words even after an
  // error.
  const absl::Status copy = device_->SyncStream(copy_stream_, "copy stream synchronize");
  const absl::Status gather = device_->SyncStream(gather_stream_, "gather stream synchronize");
  const absl::Status io = device_->SyncStream(device_->io_stream(), "I/O stream synchronize");
  if (!copy.ok() || !gather.ok() || !io.ok()) {
    log::Get("gpu")->error(
        "gpu{}: waiting for the streams after a failed copy: copy stream {}, "
        "gather stream {}, I/O stream {}",
        device_->ordinal(), copy.ToString(), gather.ToString(), io.ToString());
  }
}

absl::Status LayerCopier::EnqueueLayerLocked(CudaIpcMemory* memory,
                                             absl::Span<const engine::CopyOp> ops,
                                             ReadyWords* words, uint32_t word, uint32_t ticket,
                                             Device::Event landed) {
  const uint64_t len = memory->object_len();
  if (len > slot_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "objects of ", len, " bytes exceed a GPU staging slot (", slot_bytes_, " bytes)"));
  }
  for (size_t i = 0; i < ops.size(); ++i) {  // before anything is enqueued
    if (ops[i].block >= memory->num_blocks() || ops[i].object >= memory->num_objects()) {
      return absl::InvalidArgumentError(absl::StrCat("op ", i, ": block ", ops[i].block, " object ",
                                                     ops[i].object, " out of range"));
    }
  }
  Mode mode = options_.mode;
  if (mode == Mode::kAuto) {
    CheckTimedRound();
    if (copy_engine_left_ > 0) {
      mode = Mode::kCopyEngine;
      --copy_engine_left_;
    } else {
      mode = Mode::kStaged;
      if (timed_bytes_ == 0) time_next_round_ = true;  // the layer's first round
    }
  }
  ++counters_.layers;
  if (mode == Mode::kCopyEngine) ++counters_.copy_engine_layers;
  staged_.clear();
  direct_.clear();
  for (uint32_t i = 0; i < ops.size(); ++i) {
    // Objects a GPU verifier left checked in device memory are copied from there, in any mode.
    if (ops[i].device_copy != nullptr ||
        (mode != Mode::kStaged && IsRegistered(ops[i].staging, len))) {
      direct_.push_back(ops[i]);
    } else {
      staged_.push_back(i);
    }
  }
  if (!direct_.empty()) {
    RETURN_IF_ERROR(mode == Mode::kCopyEngine ? memory->EnqueueScatterByCopyEngine(direct_)
                                              : memory->EnqueueScatter(direct_));
  }
  if (!staged_.empty()) RETURN_IF_ERROR(EnqueueStaged(memory, ops, &staged_));
  time_next_round_ = false;
  if (words != nullptr) RETURN_IF_ERROR(words->Signal(word, ticket));
  return device_->RecordEvent(landed, device_->io_stream(), "cudaEventRecord(layer)");
}

void LayerCopier::CheckTimedRound() {
  if (timed_bytes_ == 0 || !device_->EventDone(timed_[1])) return;
  const absl::StatusOr<float> ms = device_->ElapsedMs(timed_[0], timed_[1]);
  const uint64_t bytes = timed_bytes_;
  timed_bytes_ = 0;
  if (!ms.ok() || bytes < kMinTimedBytes) return;  // tiny rounds: launch latency rules
  // When the I/O stream has nothing queued (the GPU is ahead of this thread: the usual case on
  // an idle GPU), the first event fires as soon as it is recorded and the kernel starts only once
  // the host has enqueued it, so the interval holds the host's enqueueing time too. That time is
  // taken off: under load the stream is behind the host and the interval is the kernel's alone,
  // so this only makes a slow kernel look a little faster.
  const double gpu_us = 1000.0 * *ms;
  const double us = std::max(0.0, gpu_us - timed_host_us_);
  const double idle_us = idle_.Us(bytes);
  const bool slow = us >= options_.auto_slow_factor * idle_us;  // factor 0: always
  ++counters_.timed_rounds;
  counters_.slow_rounds += slow;
  counters_.slow_rounds_uncorrected += gpu_us >= options_.auto_slow_factor * idle_us;
  TUTTI_LOG_EVERY_N_SEC(log::Get("gpu"), spdlog::level::debug, 1,
                        "gpu{}: timed round of {} KiB: {:.0f} us between its events, {:.0f} us "
                        "of them enqueueing; idle GPU {:.0f} us",
                        device_->ordinal(), bytes >> 10, gpu_us, timed_host_us_, idle_us);
  if (slow != slow_) {
    // Logged when it changes only: under a steadily busy engine the retry every
    // auto_copy_engine_layers layers finds it slow again.
    if (slow) {
      log::Get("gpu")->info(
          "gpu{}: a scatter kernel of {} KiB took {:.0f} us (idle GPU {:.0f} us): other kernels "
          "hold the SMs; retrieved layers go through the copy engines alone, {} at a time",
          device_->ordinal(), bytes >> 10, us, idle_us, options_.auto_copy_engine_layers);
    } else {
      log::Get("gpu")->info(
          "gpu{}: scatter kernels at speed again ({} KiB in {:.0f} us, idle GPU {:.0f} us); "
          "retrieved layers staged ({} went through the copy engines)",
          device_->ordinal(), bytes >> 10, us, idle_us, counters_.copy_engine_layers);
    }
    slow_ = slow;
  }
  if (slow) copy_engine_left_ = options_.auto_copy_engine_layers;
}

absl::Status LayerCopier::Gather(CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops) {
  absl::Status s;
  std::unique_ptr<SumBuffer> sums;
  const bool by_copy_engine = options_.mode == Mode::kCopyEngine || options_.mode == Mode::kAuto;
  {
    absl::MutexLock lock(&mu_);
    ++counters_.gathers;
    if (by_copy_engine) {
      ++counters_.copy_engine_gathers;
      s = memory->EnqueueGatherByCopyEngine(ops, gather_stream_);
    } else {
      s = memory->EnqueueGather(ops);
    }
    // Once the copies' enqueue has checked every op against the layout: on the I/O stream, after
    // the gather kernel or beside the copy engines.
    if (s.ok()) sums = EnqueueSums(memory, ops);
  }
  if (s.ok()) {
    if (by_copy_engine) {
      s = device_->RecordEvent(gathered_, gather_stream_, "cudaEventRecord(gather)");
      if (s.ok()) s = device_->SyncEvent(gathered_, "cudaEventSynchronize(gather)");
      if (!s.ok()) WaitStreamsAfterError();  // no copy may still write the staging
    }
    // The hash kernel (and the gather kernel): waited for even when the copies failed, as the
    // sums' buffer is reused once it is back.
    const absl::Status io = WaitIoStream();
    if (s.ok()) s = io;
    if (sums == nullptr) return s;
    if (s.ok()) {
      const uint64_t* hashes = sums->hashes();
      for (size_t k = 0; k < sums->ops.size(); ++k) {
        engine::ObjectSum* sum = ops[sums->ops[k]].sum;
        sum->value = hashes[k];
        sum->done = true;
      }
    }
    absl::MutexLock lock(&mu_);
    (s.ok() ? sum_buffers_ : retired_sums_).push_back(std::move(sums));
    return s;
  }
  // A failed enqueue may have queued part of the copies into the store's staging, which the
  // caller gives back once this returns.
  WaitStreamsAfterError();
  return s;
}

std::unique_ptr<LayerCopier::SumBuffer> LayerCopier::EnqueueSums(
    CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops) {
  const uint32_t len = memory->object_len();
  size_t n = 0;
  for (const engine::CopyOp& op : ops) n += op.sum != nullptr;
  if (n == 0 || !GpuHashSupports(len)) return nullptr;
  auto failed = [&](const absl::Status& why) -> std::unique_ptr<SumBuffer> {
    ++counters_.sum_failures;
    TUTTI_LOG_EVERY_N_SEC(log::Get("gpu"), spdlog::level::err, 5,
                          "gpu{}: store checksums of {} objects left to the CPU: {}",
                          device_->ordinal(), n, why.ToString());
    return nullptr;
  };
  std::unique_ptr<SumBuffer> b;
  for (auto it = sum_buffers_.begin(); it != sum_buffers_.end(); ++it) {
    if ((*it)->capacity >= n) {
      b = std::move(*it);
      sum_buffers_.erase(it);
      break;
    }
  }
  if (b == nullptr) {
    b = std::make_unique<SumBuffer>();
    b->capacity = 1024;
    while (b->capacity < n) b->capacity *= 2;
    absl::StatusOr<std::unique_ptr<Device::PinnedBuffer>> pinned =
        device_->AllocatePinned(b->capacity * (sizeof(HashDesc) + sizeof(uint64_t)));
    if (!pinned.ok()) return failed(pinned.status());
    b->memory = std::move(pinned).value();
  }
  b->ops.clear();
  HashDesc* descs = b->descs();
  for (uint32_t i = 0; i < ops.size(); ++i) {
    if (ops[i].sum == nullptr) continue;
    const uint8_t* object = memory->EngineObject(ops[i].block, ops[i].object);
    if (object == nullptr) {  // the copies checked the ops: not expected
      sum_buffers_.push_back(std::move(b));
      return failed(absl::InvalidArgumentError(absl::StrCat("op ", i, " out of range")));
    }
    descs[b->ops.size()] = HashDesc{object, ops[i].sum->seed, len};
    b->ops.push_back(i);
  }
  absl::Status launched;
  {
    absl::MutexLock io_lock(&device_->io_mutex());
    launched = device_->LaunchHash(descs, n, b->hashes(), device_->io_stream(),
                                   "hash kernel (store checksums)");
  }
  if (!launched.ok()) {
    sum_buffers_.push_back(std::move(b));  // nothing was enqueued
    return failed(launched);
  }
  counters_.summed_objects += n;
  return b;
}

double LayerCopier::IdleKernel::Us(uint64_t bytes) const {
  return fixed_us + us_per_mib * static_cast<double>(bytes) / (1 << 20);
}

double LayerCopier::idle_kernel_us(uint64_t bytes) const { return idle_.Us(bytes); }

LayerCopier::Counters LayerCopier::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

absl::StatusOr<double> LayerCopier::TimeIdleKernel(uint64_t bytes) {
  constexpr uint32_t kObject = 32 << 10;
  std::vector<CopyDesc> descs;
  for (uint64_t off = 0; off + kObject <= bytes; off += kObject) {
    descs.push_back({gpu_base_ + off, gpu_base_ + slot_bytes_ + off});
  }
  const Device::Stream io = device_->io_stream();
  double best = 0;
  for (int i = 0; i < 4; ++i) {  // the first is a warm-up
    RETURN_IF_ERROR(device_->RecordEvent(timed_[0], io, "event"));
    RETURN_IF_ERROR(device_->LaunchCopy(descs.data(), descs.size(), kObject, io,
                                        "scatter kernel (idle timing)"));
    RETURN_IF_ERROR(device_->RecordEvent(timed_[1], io, "event"));
    RETURN_IF_ERROR(device_->SyncEvent(timed_[1], "event"));
    ASSIGN_OR_RETURN(const float ms, device_->ElapsedMs(timed_[0], timed_[1]));
    if (i > 0 && (best == 0 || 1000.0 * ms < best)) best = 1000.0 * ms;
  }
  return best;
}

absl::Status LayerCopier::MeasureIdleKernel() {
  // Two sizes, so that short rounds are not judged by a long kernel's rate: a launch costs
  // microseconds whatever it moves.
  const uint64_t large = std::min<uint64_t>(slot_bytes_, 8ull << 20);
  const uint64_t small = std::min<uint64_t>(large, kMinTimedBytes);
  ASSIGN_OR_RETURN(const double t_large, TimeIdleKernel(large));
  ASSIGN_OR_RETURN(const double t_small, TimeIdleKernel(small));
  const double mib_large = static_cast<double>(large) / (1 << 20);
  const double mib_small = static_cast<double>(small) / (1 << 20);
  idle_.us_per_mib =
      large > small ? std::max(0.0, (t_large - t_small) / (mib_large - mib_small)) : 0.0;
  // No round is larger than a slot, so a single size (small slots) bounds every round.
  idle_.fixed_us = large > small ? std::max(0.0, t_small - idle_.us_per_mib * mib_small) : t_large;
  return absl::OkStatus();
}

absl::Status LayerCopier::Drain(Lane* lane) {
  if (lane == nullptr) {
    absl::MutexLock own(&own_mu_);
    own_lane_->pending_ = false;
    return WaitIoStream();
  }
  if (!std::exchange(lane->pending_, false)) return absl::OkStatus();
  return device_->SyncEvent(lane->landed_[lane->next_ ^ 1], "cudaEventSynchronize(layer)");
}

absl::Status LayerCopier::WaitIoStream() {
  RETURN_IF_ERROR(device_->RecordEvent(waited_, device_->io_stream(), "cudaEventRecord(wait)"));
  return device_->SyncEvent(waited_, "cudaEventSynchronize(I/O stream)");
}

absl::Status LayerCopier::EnqueueStaged(CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops,
                                        std::vector<uint32_t>* indices) {
  const uint64_t len = memory->object_len();
  const uint64_t round_limit = options_.round_bytes == 0
                                   ? slot_bytes_
                                   : std::clamp<uint64_t>(options_.round_bytes, len, slot_bytes_);
  std::sort(indices->begin(), indices->end(),
            [&](uint32_t a, uint32_t b) { return ops[a].staging < ops[b].staging; });
  runs_.clear();
  round_ops_.clear();
  uint64_t used = 0;  // bytes of this round's slot taken by its runs
  for (uint32_t i : *indices) {
    const engine::CopyOp& op = ops[i];
    const bool reg = IsRegistered(op.staging, len);
    Run* run = runs_.empty() ? nullptr : &runs_.back();
    if (run != nullptr && run->registered == reg && op.staging >= run->host &&
        op.staging <= run->host + run->len + kMaxGap) {
      const uint64_t new_len = std::max<uint64_t>(run->len, op.staging + len - run->host);
      if (run->offset + new_len <= round_limit) {
        run->len = new_len;
        used = std::max(used, run->offset + new_len);
        uint8_t* slot = gpu_base_ + next_slot_ * slot_bytes_;
        round_ops_.push_back({op.block, op.object, slot + run->offset + (op.staging - run->host)});
        continue;
      }
    }
    uint64_t offset = AlignUp(used, kRunAlign);
    if (offset + len > round_limit) {
      RETURN_IF_ERROR(FlushRound(memory));  // moves to the next slot
      offset = 0;
    }
    runs_.push_back(Run{op.staging, len, offset, reg});
    used = offset + len;
    round_ops_.push_back({op.block, op.object, gpu_base_ + next_slot_ * slot_bytes_ + offset});
  }
  return FlushRound(memory);
}

absl::Status LayerCopier::CopyIn(uint32_t s) {
  uint8_t* slot = gpu_base_ + s * slot_bytes_;
  uint64_t lo = UINT64_MAX, hi = 0;
  jobs_.clear();
  for (const Run& r : runs_) {
    if (r.registered) continue;
    if (bounce_ == nullptr) {  // pageable: the driver bounces each run itself
      RETURN_IF_ERROR(device_->CopyToDevice(slot + r.offset, r.host, r.len, copy_stream_,
                                            "cudaMemcpyAsync(pageable -> GPU staging)"));
      continue;
    }
    // Pieces of at most kBouncePiece, so large runs spread over the threads too.
    for (uint64_t off = 0; off < r.len; off += kBouncePiece) {
      jobs_.push_back({bounce_->host() + s * slot_bytes_ + r.offset + off, r.host + off,
                       std::min(kBouncePiece, r.len - off)});
    }
    lo = std::min(lo, r.offset);
    hi = std::max(hi, r.offset + r.len);
  }
  if (!jobs_.empty()) {
    if (bounce_pending_[s]) {  // the slot's previous copy out of the bounce buffer
      RETURN_IF_ERROR(device_->SyncEvent(bounce_free_[s], "bounce wait"));
    }
    pool_->Run(jobs_);
    RETURN_IF_ERROR(device_->CopyToDevice(slot + lo, bounce_->host() + s * slot_bytes_ + lo,
                                          hi - lo, copy_stream_,
                                          "cudaMemcpyAsync(bounce -> GPU staging)"));
    RETURN_IF_ERROR(device_->RecordEvent(bounce_free_[s], copy_stream_, "event"));
    bounce_pending_[s] = true;
  }
  // Registered runs last: their copies overwrite the gaps the bounce span may have covered.
  for (size_t i = 0; i < runs_.size();) {
    const Run& r = runs_[i];
    if (!r.registered) {
      ++i;
      continue;
    }
    const size_t n = StridedGroup(i);
    if (n == 1) {
      RETURN_IF_ERROR(device_->CopyToDevice(slot + r.offset, r.host, r.len, copy_stream_,
                                            "cudaMemcpyAsync(staging -> GPU staging)"));
    } else {
      const Run& next = runs_[i + 1];
      RETURN_IF_ERROR(device_->CopyToDevice2D(slot + r.offset, next.offset - r.offset, r.host,
                                              next.host - r.host, r.len, n, copy_stream_,
                                              "cudaMemcpy2DAsync(staging -> GPU staging)"));
    }
    i += n;
  }
  return absl::OkStatus();
}

size_t LayerCopier::StridedGroup(size_t first) const {
  const Run& r = runs_[first];
  if (!options_.strided_copies || first + 1 >= runs_.size()) return 1;
  const Run& second = runs_[first + 1];
  // Runs are sorted by host address and placed at rising slot offsets.
  const uint64_t spitch = static_cast<uint64_t>(second.host - r.host);
  const uint64_t dpitch = second.offset - r.offset;
  if (!second.registered || second.len != r.len || spitch < r.len || dpitch < r.len ||
      spitch > max_pitch_ || dpitch > max_pitch_) {
    return 1;
  }
  size_t n = 2;
  while (first + n < runs_.size()) {
    const Run& prev = runs_[first + n - 1];
    const Run& cur = runs_[first + n];
    if (!cur.registered || cur.len != r.len ||
        static_cast<uint64_t>(cur.host - prev.host) != spitch || cur.offset - prev.offset != dpitch) {
      break;
    }
    ++n;
  }
  return n;
}

absl::Status LayerCopier::FlushRound(CudaIpcMemory* memory) {
  if (runs_.empty()) return absl::OkStatus();
  const uint32_t s = next_slot_;
  next_slot_ = (s + 1) % kSlots;
  const uint32_t seq = ++uses_[s];
  uint32_t* copied = words_ + s;
  uint32_t* consumed = words_ + kSlots + s;
  // Copy side: wait until the slot's previous kernel has read it, copy in, hand it over.
  absl::Status status =
      device_->WaitValue32(copy_stream_, consumed, seq - 1, "cuStreamWaitValue32(slot consumed)");
  if (status.ok()) status = CopyIn(s);
  absl::Status w =
      device_->WriteValue32(copy_stream_, copied, seq, "cuStreamWriteValue32(slot copied)");
  if (status.ok()) status = w;
  // Kernel side: wait for the copy, scatter, hand the slot back. A copied word that could not be
  // enqueued never comes: the I/O stream must not wait for it (ResetSlotWords then starts the
  // slots afresh).
  const Device::Stream io = device_->io_stream();
  if (w.ok()) {
    w = device_->WaitValue32(io, copied, seq, "cuStreamWaitValue32(slot copied)");
    if (status.ok()) status = w;
  }
  const bool timed = status.ok() && time_next_round_;
  const auto host_start = std::chrono::steady_clock::now();
  if (timed) status = device_->RecordEvent(timed_[0], io, "cudaEventRecord(timing)");
  if (status.ok()) status = memory->EnqueueScatter(round_ops_);
  if (timed && status.ok()) {
    status = device_->RecordEvent(timed_[1], io, "cudaEventRecord(timing)");
    if (status.ok()) {
      timed_bytes_ = round_ops_.size() * memory->object_len();
      timed_host_us_ = std::chrono::duration<double, std::micro>(
                           std::chrono::steady_clock::now() - host_start)
                           .count();
      time_next_round_ = false;
    }
  }
  w = device_->WriteValue32(io, consumed, seq, "cuStreamWriteValue32(slot consumed)");
  if (status.ok()) status = w;
  runs_.clear();
  round_ops_.clear();
  return status;
}

}  // namespace tutti::gpu

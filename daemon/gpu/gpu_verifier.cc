#include "daemon/gpu/gpu_verifier.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "daemon/datapath/fair_queue.h"
#include "daemon/gpu/check_take.h"
#include "daemon/pool/slot_header.h"
#include "gpu/cuda_status.h"
#include "gpu/hash_desc.h"
#include "gpu/hash_kernel.h"
#include "gpu/io_stream.h"

namespace tutti::gpu {
namespace {

using datapath::ObjectCheck;

// The `released` callbacks of one use of a slot, or of one batch copied on arrival. They run once:
// on CUDA's callback thread right after the copies, or, where that did not happen first (a CUDA
// error), from Finish.
struct Releases {
  std::atomic<bool> claimed{false};
  std::vector<std::function<void()>> fns;
  // True for the one caller that may run them.
  bool Claim() { return !claimed.exchange(true, std::memory_order_acq_rel); }
  // Runs them unless another caller claimed them first.
  void RunOnce() {
    if (!Claim()) return;
    for (std::function<void()>& f : fns) f();
  }
};

// A batch whose objects are all placed, copied to their places as it arrives
// (GpuVerifierOptions::copy_on_arrival) instead of when a slot takes it.
struct Arrival {
  absl::Span<const ObjectCheck> checks;
  Releases releases;    // the batch's `released`
  bool copied = false;  // the verifier thread's: its copies and their release are enqueued
  std::chrono::steady_clock::time_point arrived;  // at VerifyReleasing
};

// Nanoseconds from `since` until now.
uint64_t NanosSince(std::chrono::steady_clock::time_point since) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since)
          .count());
}

// One group of batches copied on arrival: released together once its copies landed.
struct ArrivalGroup {
  std::vector<std::shared_ptr<Arrival>> arrivals;
  std::chrono::steady_clock::time_point enqueued;  // its copies enqueued
  ArrivalCounters* counters = nullptr;  // or null
};

struct Job {
  uint64_t stream = 0;
  absl::Span<const ObjectCheck> checks;
  absl::Span<uint8_t> matches;
  std::function<void()> done;
  std::function<void()> released;  // VerifyReleasing's, or empty
  // What it takes of a slot (set by Submit): scratch bytes and objects to hash.
  uint64_t scratch_bytes = 0;
  uint32_t objects = 0;
  std::shared_ptr<Arrival> arrival;  // set where it is copied on arrival
  // Copied on arrival: its bytes went back (or go back) without the slot.
  bool CopiedEarly() const { return arrival != nullptr && arrival->copied; }
};

// cudaLaunchHostFunc's callback: runs a slot's `released` callbacks unless Finish claimed them.
void CUDART_CB RunReleases(void* arg) {
  std::unique_ptr<std::shared_ptr<Releases>> r(static_cast<std::shared_ptr<Releases>*>(arg));
  (*r)->RunOnce();
}

// cudaLaunchHostFunc's callback for batches copied on arrival: runs each one's `released` unless
// Finish claimed it, and counts the group's time from its copies enqueued.
void CUDART_CB RunArrivalReleases(void* arg) {
  std::unique_ptr<ArrivalGroup> group(static_cast<ArrivalGroup*>(arg));
  if (group->counters != nullptr) {
    const uint64_t n = group->arrivals.size();
    group->counters->groups.fetch_add(1, std::memory_order_relaxed);
    group->counters->copy_release_ns.fetch_add(n * NanosSince(group->enqueued),
                                               std::memory_order_relaxed);
  }
  for (const std::shared_ptr<Arrival>& a : group->arrivals) a->releases.RunOnce();
}

uint64_t RoundUp16(uint64_t n) { return (n + 15) / 16 * 16; }

// A job the kernel can check: every object it is to hash has a supported length.
bool GpuCanCheck(const Job& job) {
  for (const ObjectCheck& c : job.checks) {
    if (c.len != 0 && !GpuHashSupports(c.len)) return false;
  }
  return true;
}

class GpuVerifier final : public datapath::Verifier {
 public:
  GpuVerifier(const GpuVerifierOptions& options, const IoStream& stream,
              datapath::Verifier* fallback)
      : options_(options),
        caps_{options.slot_bytes, options.max_objects_per_slot,
              options.max_objects_per_shared_slot},
        stream_(stream.stream()),
        device_(stream.device()),
        fallback_(fallback),
        slots_(options.slots) {
    for (Slot& slot : slots_) slot.owner = this;
  }

  ~GpuVerifier() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (cudaStream_t st : {copy_stream_, notify_stream_, release_stream_}) {
      if (st == nullptr) continue;
      cudaStreamSynchronize(st);
      cudaStreamDestroy(st);
    }
    for (Slot& s : slots_) {
      if (s.event != nullptr) cudaEventDestroy(s.event);
      if (s.copied != nullptr) cudaEventDestroy(s.copied);
      if (s.arrivals_released != nullptr) cudaEventDestroy(s.arrivals_released);
      cudaFree(s.scratch);
      cudaFree(s.descs_dev);
      cudaFree(s.hashes_dev);
      cudaFreeHost(s.descs_host);
      cudaFreeHost(s.hashes_host);
    }
    if (arrived_ != nullptr) cudaEventDestroy(arrived_);
    cudaFree(mirror_dev_);
  }

  absl::Status Init() {
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    if (!options_.mirror.empty()) {
      RETURN_IF_ERROR(CudaStatus(
          cudaMalloc(reinterpret_cast<void**>(&mirror_dev_), options_.mirror.size()),
          absl::StrCat("cudaMalloc(", options_.mirror.size(), ") for the staging mirror")));
    }
    const uint32_t n = options_.max_objects_per_slot;
    for (Slot& s : slots_) {
      RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&s.scratch), options_.slot_bytes),
                                 absl::StrCat("cudaMalloc(", options_.slot_bytes, ") for checks")));
      RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&s.descs_dev), n * sizeof(HashDesc)), "cudaMalloc"));
      RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&s.hashes_dev), n * sizeof(uint64_t)), "cudaMalloc"));
      RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(reinterpret_cast<void**>(&s.descs_host),
                                               n * sizeof(HashDesc), cudaHostAllocDefault),
                                 "cudaHostAlloc"));
      RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(reinterpret_cast<void**>(&s.hashes_host),
                                               n * sizeof(uint64_t), cudaHostAllocDefault),
                                 "cudaHostAlloc"));
      RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&s.event, cudaEventDisableTiming | cudaEventBlockingSync),
                                 "cudaEventCreateWithFlags"));
      RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming),
                                 "cudaEventCreateWithFlags"));
      if (options_.copy_on_arrival) {
        RETURN_IF_ERROR(
            CudaStatus(cudaEventCreateWithFlags(&s.arrivals_released, cudaEventDisableTiming),
                       "cudaEventCreateWithFlags"));
      }
    }
    // The copies need no SMs: an ordinary stream of their own, so that one slot's copies run
    // while the kernel checks the slot before it (the kernel stays in the stream's SMs).
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags (check copies)"));
    // Tells the thread a slot is answered, off the kernel's stream (which it would hold up).
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&notify_stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags (check answers)"));
    if (options_.copy_on_arrival) {
      // Gives batches copied on arrival back, off the copy stream (a host function holds up the
      // work queued behind it).
      RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&release_stream_, cudaStreamNonBlocking),
                                 "cudaStreamCreateWithFlags (releases on arrival)"));
      RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&arrived_, cudaEventDisableTiming),
                                 "cudaEventCreateWithFlags"));
    }
    thread_ = std::thread([this] { Run(); });
    pthread_setname_np(thread_.native_handle(), "tutti-gpucheck");
    return absl::OkStatus();
  }

  std::string_view name() const override { return "gpu"; }

  void Verify(uint64_t stream, absl::Span<const ObjectCheck> checks, absl::Span<uint8_t> matches,
              std::function<void()> done) override {
    Submit(Job{stream, checks, matches, std::move(done), nullptr});
  }
  void VerifyReleasing(uint64_t stream, absl::Span<const ObjectCheck> checks,
                       absl::Span<uint8_t> matches, std::function<void()> released,
                       std::function<void()> done) override {
    Submit(Job{stream, checks, matches, std::move(done), std::move(released)});
  }

 private:
  // Runs `job` on the CPU verifier, which releases its bytes once it has checked them.
  void Fallback(Job job) {
    if (!job.released) {
      fallback_->Verify(job.stream, job.checks, job.matches, std::move(job.done));
      return;
    }
    fallback_->VerifyReleasing(job.stream, job.checks, job.matches, std::move(job.released),
                               std::move(job.done));
  }

  void Submit(Job job) {
    if (job.checks.empty()) {
      if (job.released) job.released();
      job.done();
      return;
    }
    Needs(&job);
    if (!GpuCanCheck(job) || job.scratch_bytes > options_.slot_bytes ||
        job.objects > options_.max_objects_per_slot) {  // larger than an empty slot
      Fallback(std::move(job));
      return;
    }
    if (options_.copy_on_arrival && job.released && job.scratch_bytes == 0) {
      job.arrival = std::make_shared<Arrival>();
      job.arrival->checks = job.checks;
      job.arrival->arrived = std::chrono::steady_clock::now();
      job.arrival->releases.fns.push_back(job.released);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (job.arrival != nullptr) arrivals_.push_back(job.arrival);
      const uint64_t stream = job.stream;
      queue_.Push(stream, std::move(job));
    }
    cv_.notify_one();
  }

  // Copies the objects of `arrivals` to their places on copy_stream_ and gives their bytes back
  // once those copies have landed (a host function on release_stream_, which waits for them), all
  // in one go. Marks them copied only where all of it was enqueued; the others are copied and
  // released with their slot, as without copy_on_arrival.
  void CopyOnArrival(std::vector<std::shared_ptr<Arrival>> arrivals) {
    std::vector<CopyRun> runs;
    for (const std::shared_ptr<Arrival>& a : arrivals) {
      for (const ObjectCheck& c : a->checks) {
        if (c.len == 0) continue;
        AppendRun(&runs, c.bytes, MirrorOf(c), c.len);
      }
    }
    absl::Status s;
    for (const CopyRun& r : runs) {
      s = CudaStatus(cudaMemcpyAsync(r.dst, r.src, r.len, cudaMemcpyHostToDevice, copy_stream_),
                     "cudaMemcpyAsync(staging -> its place, on arrival)");
      if (!s.ok()) break;
    }
    if (s.ok()) s = CudaStatus(cudaEventRecord(arrived_, copy_stream_), "cudaEventRecord");
    if (s.ok()) {
      s = CudaStatus(cudaStreamWaitEvent(release_stream_, arrived_, 0),
                     "cudaStreamWaitEvent(copies on arrival)");
    }
    if (s.ok()) {
      auto* arg = new ArrivalGroup{arrivals, std::chrono::steady_clock::now(), options_.counters};
      s = CudaStatus(cudaLaunchHostFunc(release_stream_, RunArrivalReleases, arg),
                     "cudaLaunchHostFunc(release the bytes copied on arrival)");
      if (!s.ok()) delete arg;
    }
    if (!s.ok()) {
      TUTTI_LOG_EVERY_N_SEC(log::Get("gpu"), spdlog::level::err, 5,
                            "GPU checks: copying {} batches on arrival failed ({}); their slots "
                            "copy them",
                            arrivals.size(), s.ToString());
      return;
    }
    for (const std::shared_ptr<Arrival>& a : arrivals) a->copied = true;
    if (options_.counters != nullptr) {
      uint64_t waited = 0;  // until now, the copies enqueued
      for (const std::shared_ptr<Arrival>& a : arrivals) waited += NanosSince(a->arrived);
      options_.counters->arrivals.fetch_add(arrivals.size(), std::memory_order_relaxed);
      options_.counters->pickup_ns.fetch_add(waited, std::memory_order_relaxed);
    }
  }

  struct CopyRun {  // `len` bytes from host `src` to `dst` in the slot's scratch
    const uint8_t* src;
    uint8_t* dst;
    uint64_t len;
  };
  struct Slot {
    GpuVerifier* owner = nullptr;
    uint8_t* scratch = nullptr;
    HashDesc* descs_dev = nullptr;
    HashDesc* descs_host = nullptr;
    uint64_t* hashes_dev = nullptr;
    uint64_t* hashes_host = nullptr;
    cudaEvent_t event = nullptr;   // the slot's work done (blocking sync)
    cudaEvent_t copied = nullptr;  // its copies landed and its `released` callbacks ran
    // copy_on_arrival: the releases of batches copied on arrival enqueued before its kernel ran.
    cudaEvent_t arrivals_released = nullptr;
    // Filled per use.
    std::vector<Job> jobs;
    std::shared_ptr<Releases> releases = std::make_shared<Releases>();
    std::vector<CopyRun> runs;
    uint32_t count = 0;  // descs
    uint64_t used = 0;   // scratch bytes
    bool has_early = false;  // holds batches copied on arrival
    absl::Status status;
    bool done = false;  // guarded by owner->mu_: its work has run (or failed to be enqueued)
    void Reset() {
      jobs.clear();
      runs.clear();
      count = 0;
      used = 0;
      has_early = false;
      status = absl::OkStatus();
      releases = std::make_shared<Releases>();
    }
  };

  // Where object `c` is copied for its check: the place the reader gave it, else its offset in
  // the mirror, or nullptr when it lies outside (it then takes slot scratch).
  uint8_t* MirrorOf(const ObjectCheck& c) const {
    if (c.place != nullptr) return c.place;  // staged on the GPU by the reader
    const uint8_t* base = options_.mirror.data();
    if (mirror_dev_ == nullptr || c.bytes < base) return nullptr;
    const uint64_t off = static_cast<uint64_t>(c.bytes - base);
    if (off > options_.mirror.size() || c.len > options_.mirror.size() - off) return nullptr;
    return mirror_dev_ + off;
  }
  // Sets what `job` takes of a slot.
  void Needs(Job* job) const {
    for (const ObjectCheck& c : job->checks) {
      if (c.len == 0) continue;
      if (MirrorOf(c) == nullptr) job->scratch_bytes += RoundUp16(c.len);
      ++job->objects;
    }
  }

  // Adjacent objects (in the host and at their destinations) in one copy.
  static void AppendRun(std::vector<CopyRun>* runs, const uint8_t* src, uint8_t* dst,
                        uint64_t len) {
    if (!runs->empty() && runs->back().src + runs->back().len == src &&
        runs->back().dst + runs->back().len == dst) {
      runs->back().len += len;
    } else {
      runs->push_back(CopyRun{src, dst, len});
    }
  }

  void Add(Slot* s, Job job) {
    // Copied on arrival: only hashed here; its bytes go back without the slot.
    const bool early = job.CopiedEarly();
    s->has_early |= early;
    for (const ObjectCheck& c : job.checks) {
      if (c.len == 0) continue;  // a failed read: answered 0, not hashed
      uint8_t* mirrored = MirrorOf(c);
      uint8_t* dst = mirrored != nullptr ? mirrored : s->scratch + s->used;
      if (!early) AppendRun(&s->runs, c.bytes, dst, c.len);
      s->descs_host[s->count++] =
          HashDesc{dst, pool::ObjectChecksumSeed(c.ns, *c.key, c.epoch, c.object), c.len};
      if (mirrored == nullptr) s->used += RoundUp16(c.len);
    }
    // Kept in the job too: Finish runs it after a CPU check if CUDA never ran the slot's.
    if (job.released && !early) s->releases->fns.push_back(job.released);
    s->jobs.push_back(std::move(job));
  }

  // The copies (and the descriptors) on copy_stream_, then the jobs' `released` callbacks as a
  // host function there, then `copied`; the kernel and the hashes' copy back on stream_ after
  // `copied`, then `event`.
  absl::Status Enqueue(Slot* s) {
    for (const CopyRun& r : s->runs) {
      RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(r.dst, r.src, r.len, cudaMemcpyHostToDevice, copy_stream_),
                     "cudaMemcpyAsync(staging -> check scratch)"));
    }
    if (s->count > 0) {
      RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(s->descs_dev, s->descs_host, s->count * sizeof(HashDesc),
                                     cudaMemcpyHostToDevice, copy_stream_),
                     "cudaMemcpyAsync(check descriptors)"));
    }
    if (!s->releases->fns.empty()) {
      auto* arg = new std::shared_ptr<Releases>(s->releases);
      const cudaError_t e = cudaLaunchHostFunc(copy_stream_, RunReleases, arg);
      if (e != cudaSuccess) delete arg;
      RETURN_IF_ERROR(CudaStatus(e, "cudaLaunchHostFunc(release the checked bytes)"));
    }
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(s->copied, copy_stream_), "cudaEventRecord"));
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamWaitEvent(stream_, s->copied, 0), "cudaStreamWaitEvent(copies)"));
    if (s->has_early) {
      // Their copies went before `copied` on copy_stream_; their `released` runs on
      // release_stream_: the answer (and each `done`) comes after it, as for the slot's own.
      RETURN_IF_ERROR(
          CudaStatus(cudaEventRecord(s->arrivals_released, release_stream_), "cudaEventRecord"));
      RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(stream_, s->arrivals_released, 0),
                                 "cudaStreamWaitEvent(releases on arrival)"));
    }
    if (s->count > 0) {
      RETURN_IF_ERROR(CudaStatus(
          LaunchHashObjects(s->descs_dev, s->count, DefaultXxh3Secret(), s->hashes_dev, stream_),
          "hash kernel launch"));
      RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(s->hashes_host, s->hashes_dev,
                                                 s->count * sizeof(uint64_t),
                                                 cudaMemcpyDeviceToHost, stream_),
                                 "cudaMemcpyAsync(hashes)"));
    }
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(s->event, stream_), "cudaEventRecord"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(notify_stream_, s->event, 0),
                               "cudaStreamWaitEvent(check answers)"));
    return CudaStatus(cudaLaunchHostFunc(notify_stream_, MarkDone, s),
                      "cudaLaunchHostFunc(check answered)");
  }

  // notify_stream_'s host function once a slot's work has run. Notifies under the lock: once it
  // lets go, the verifier may be gone.
  static void CUDART_CB MarkDone(void* arg) {
    Slot* s = static_cast<Slot*>(arg);
    std::lock_guard<std::mutex> lock(s->owner->mu_);
    s->done = true;
    s->owner->cv_.notify_one();
  }

  // Answers the slot's jobs and runs their `done`. On a CUDA error the fallback checks them,
  // unless their bytes went back already: those are answered kNotChecked.
  void Finish(Slot* s) {
    if (s->status.ok()) {
      s->status = CudaStatus(cudaEventSynchronize(s->event), "cudaEventSynchronize");
    }
    if (!s->status.ok()) {
      // No copy of this slot may still be reading the bytes once they go back, nor its kernel
      // its descriptors once the slot is filled again.
      const cudaError_t drained = cudaStreamSynchronize(copy_stream_);
      cudaStreamSynchronize(stream_);
      const bool slot_bytes_here = s->releases->Claim();
      TUTTI_LOG_EVERY_N_SEC(
          log::Get("gpu"), spdlog::level::err, 5,
          "GPU checks of {} objects failed ({}; check copies drained: {}); the CPU checks those "
          "whose bytes are still here, the others are not served",
          s->count, s->status.ToString(), cudaGetErrorName(drained));
      for (Job& job : s->jobs) {
        const bool bytes_here = job.CopiedEarly() ? job.arrival->releases.Claim() : slot_bytes_here;
        if (!job.released || bytes_here) {
          Fallback(std::move(job));
          continue;
        }
        for (size_t i = 0; i < job.checks.size(); ++i) {
          job.matches[i] = job.checks[i].len == 0 ? datapath::kMismatch : datapath::kNotChecked;
        }
        job.done();
      }
      s->Reset();
      return;
    }
    // After `event`, CUDA has run the `released` callbacks: `copied`, which the kernel waits
    // for, follows their host function on copy_stream_.
    uint32_t k = 0;
    for (Job& job : s->jobs) {
      for (size_t i = 0; i < job.checks.size(); ++i) {
        const ObjectCheck& c = job.checks[i];
        if (c.len == 0) {
          job.matches[i] = datapath::kMismatch;
          continue;
        }
        const HashDesc& d = s->descs_host[k];
        job.matches[i] = s->hashes_host[k++] == c.expected ? datapath::kMatch : datapath::kMismatch;
        // The checked bytes stay in their place or the mirror for the engine copy (scratch is
        // reused).
        if (job.matches[i] && c.device_copy != nullptr && MirrorOf(c) != nullptr) {
          *c.device_copy = static_cast<const uint8_t*>(d.data);
        }
      }
    }
    std::vector<Job> jobs = std::move(s->jobs);
    s->Reset();
    for (Job& job : jobs) job.done();
  }

  void Run() {
    if (!CudaStatus(cudaSetDevice(device_), "cudaSetDevice").ok()) {
      log::Get("gpu")->error("GPU verifier: cudaSetDevice({}) failed; the CPU checks", device_);
      broken_ = true;
    }
    std::deque<Slot*> in_flight;  // oldest first
    std::vector<Slot*> free;
    for (Slot& s : slots_) free.push_back(&s);
    for (;;) {
      // A free slot takes as many queued jobs as it holds, streams in turn (the rest waits for a
      // later slot); else the oldest slot in flight is answered once its work has run.
      std::vector<Job> taken;
      Slot* s = nullptr;  // to fill with `taken`
      Slot* answer = nullptr;
      std::vector<std::shared_ptr<Arrival>> arrivals;  // to copy now
      {
        std::unique_lock<std::mutex> lock(mu_);
        const auto ready = [&] {
          return (!free.empty() && !queue_.empty()) || !arrivals_.empty() ||
                 (!in_flight.empty() && in_flight.front()->done) ||
                 (stopping_ && in_flight.empty());
        };
        while (!ready()) {
          if (in_flight.empty()) {
            cv_.wait(lock, ready);
            break;
          }
          if (cv_.wait_for(lock, std::chrono::milliseconds(100), ready)) break;
          // No word from MarkDone for a while: the oldest slot's event decides. A CUDA error may
          // keep MarkDone from ever running (Finish then answers the jobs: the CPU checks them).
          // A late MarkDone of this use, run once the slot is filled again, only has Finish wait
          // for that use's event.
          Slot* oldest = in_flight.front();
          lock.unlock();
          const cudaError_t e = cudaEventQuery(oldest->event);
          lock.lock();
          if (e != cudaErrorNotReady) oldest->done = true;
        }
        arrivals.swap(arrivals_);
        if (!free.empty() && !queue_.empty()) {
          s = free.back();
          free.pop_back();
          s->done = false;
          taken = TakeForCheck(queue_, caps_);
        } else if (!in_flight.empty() && in_flight.front()->done) {
          answer = in_flight.front();
          in_flight.pop_front();
        } else if (arrivals.empty()) {
          return;  // stopping, and nothing queued or in flight
        }
      }
      // Before any slot takes them (they are queued too): a slot copies only what has not been.
      if (!arrivals.empty() && !broken_) CopyOnArrival(std::move(arrivals));
      if (answer != nullptr) {
        Finish(answer);
        free.push_back(answer);
        continue;
      }
      if (s == nullptr) continue;  // only copies on arrival this time
      for (Job& job : taken) Add(s, std::move(job));
      s->status = broken_ ? absl::InternalError("no CUDA device") : Enqueue(s);
      if (!s->status.ok()) {  // no MarkDone is coming: Finish answers it (the CPU checks)
        std::lock_guard<std::mutex> lock(mu_);
        s->done = true;
      }
      in_flight.push_back(s);
    }
  }

  const GpuVerifierOptions options_;
  const CheckCaps caps_;       // of each check's take, from options_
  const cudaStream_t stream_;  // the kernel's (in the I/O domain's SMs)
  cudaStream_t copy_stream_ = nullptr;
  cudaStream_t notify_stream_ = nullptr;
  cudaStream_t release_stream_ = nullptr;  // copy_on_arrival's
  cudaEvent_t arrived_ = nullptr;          // copy_on_arrival: the latest copies on arrival landed
  const int device_;
  datapath::Verifier* const fallback_;
  uint8_t* mirror_dev_ = nullptr;  // options_.mirror.size() bytes, or null
  std::vector<Slot> slots_;        // options_.slots, sized once
  bool broken_ = false;  // the thread's own state

  std::mutex mu_;
  std::condition_variable cv_;
  datapath::FairQueue<Job> queue_;  // by stream (datapath/verifier.h)
  std::vector<std::shared_ptr<Arrival>> arrivals_;  // queued, not yet copied on arrival
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<datapath::Verifier>> MakeGpuVerifier(
    const GpuVerifierOptions& options, const IoStream& stream, datapath::Verifier* fallback) {
  if (fallback == nullptr || options.slot_bytes == 0 || options.max_objects_per_slot == 0 ||
      options.slots < 2) {
    return absl::InvalidArgumentError(
        "MakeGpuVerifier: a fallback verifier and two slots or more are needed");
  }
  if (reinterpret_cast<uintptr_t>(options.mirror.data()) % 16 != 0) {
    return absl::InvalidArgumentError("MakeGpuVerifier: the mirrored staging is not 16-byte aligned");
  }
  auto v = std::make_unique<GpuVerifier>(options, stream, fallback);
  RETURN_IF_ERROR(v->Init());
  return std::unique_ptr<datapath::Verifier>(std::move(v));
}

}  // namespace tutti::gpu

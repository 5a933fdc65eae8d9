// Moves one layer of a Retrieve from host staging into an engine's blocks, marks the layer ready,
// and returns once the layer is in the engine's memory (so the host staging may be reused).
//
// Two ways, chosen at creation (config gpu.scatter):
//   kStaged: the layer's objects, sorted by staging address and merged into contiguous runs, are
//     copied by the copy engine (cudaMemcpyAsync host -> device, on a copy stream of their own)
//     into slots of a GPU staging buffer allocated at creation; the copy kernel then places each
//     slot's objects into the engine's blocks, device to device, on the I/O stream. The kernel runs
//     at HBM speed (the I/O SMs work for a few percent of the transfer time) and overlaps the next
//     slot's copy: the two streams hand slots to each other through device words
//     (cuStreamWriteValue32 / cuStreamWaitValue32), so only the last slot's kernel adds to a
//     layer's time.
//   kMapped: the copy kernel reads the mapped pinned staging over PCIe (the SMs are busy for the
//     whole transfer).
//   kCopyEngine: the copy engines move every object straight from the registered staging into
//     its block (one cudaMemcpyBatchAsync per layer, objects adjacent on both sides merged into
//     one copy since stop 41): no SM works, at about half the bandwidth alone (measured before
//     the merging); for engines that keep every SM busy.
//   kAuto: kStaged while its scatter kernels run at speed. The first round (of 1 MiB or more) of
//     each staged layer is timed on the GPU (events around its kernel); one that takes over
//     `auto_slow_factor` times as long as the same kernel of that size on the idle GPU (fitted at
//     creation from two sizes; the host's time to enqueue the kernel between the events is taken
//     off, since on an idle stream the first event fires before the kernel is even queued: left
//     in, it made auto switch with no engine beside it) means other kernels hold the SMs: the
//     scatter kernel waits for SM
//     slots and takes them from the engine. The next `auto_copy_engine_layers` layers then go as
//     kCopyEngine, then staged is tried again. On the H200 under MPS, with an engine filling every
//     SM: auto 0.2% of the engine's throughput and 21.5 GB/s, staged 6.5% and 17.8 GB/s (same run);
//     alone, auto stays staged. Without MPS the GPU time-slices between processes: the kernel runs
//     at speed in its slice, so auto stays staged there (docs/gpu.md).
// Ops with a device copy (engine::CopyOp::device_copy: a GPU verifier's checked copy) are copied
// device to device from there in every mode (by the kernel, or by the copy engines where the mode
// says so): their bytes cross PCIe only once, for the check.
// Objects whose staging is not in the registered regions given at creation (the store's DRAM tier
// is ordinary heap memory) take the kStaged way in both modes: `bounce_threads` threads copy them
// into a pinned bounce buffer (the same geometry as the GPU slots), from which the copy engine
// takes them. Without bounce threads they are copied from pageable memory by the driver (much
// slower: it bounces each run through buffers of its own).
//
// Nothing is allocated per call once the internal vectors have grown to a layer's size.
//
// The GPU is reached through a gpu::Device (gpu/device.h): CUDA on the I/O stream's device in
// production, host memory in tests (layer_copier_host_test.cc), which run this logic without a GPU.
//
// Lanes: each caller that overlaps its layers (a session's Retrieves: CudaEngineIo) has a Lane of
// its own. A Lane's Wait::kPrevious layer waits for that lane's previous layer only, and every
// wait (kPrevious, kLanded, Drain) happens outside the copier's lock, which covers only the
// enqueueing: so a session that waits for its layer holds up no other session's enqueue (before
// stop 43 one lock was held through the wait, and each session waited for the layer any other
// had enqueued last). Every lane's work goes on the one I/O stream, in the order enqueued.
//
// Thread-safety: every method may be called from any thread. Enqueueing is serialized; calls
// without a lane are serialized whole (waits included), as before lanes; a Lane is used by one
// thread at a time.
// Lifetimes: the IoStream (or Device) and the registered regions must outlive the copier; the
// copier must outlive every CudaIpcMemory opened with its staging_regions().
#ifndef TUTTI_DAEMON_GPU_LAYER_COPIER_H_
#define TUTTI_DAEMON_GPU_LAYER_COPIER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "daemon/engine/engine_memory.h"
#include "daemon/gpu/cuda_ipc_memory.h"
#include "daemon/gpu/placement.h"
#include "gpu/device.h"
#include "gpu/hash_desc.h"
#include "gpu/io_stream.h"
#include "gpu/ready_words.h"

namespace tutti::gpu {

class CopyPool;

class LayerCopier {
 public:
  enum class Mode { kStaged, kMapped, kCopyEngine, kAuto };
  struct Options {
    Mode mode = Mode::kStaged;
    // Size of the GPU staging buffer (rounded up to 4 x 2 MiB), cut into kSlots slots: a slot
    // must hold the largest object. One layer of a maximal Retrieve (max_blocks_per_call x 2 x
    // object_bytes) keeps every slot's kernel short next to the copies.
    uint64_t gpu_staging_bytes = 128ull << 20;
    // Threads that copy unregistered objects into the pinned bounce buffer; 0: no bounce buffer
    // (pageable copies by the driver).
    uint32_t bounce_threads = 4;
    // Most bytes one round (one copy into a slot, then one scatter kernel) carries; 0: a whole
    // slot. Shorter rounds mean shorter kernels, which hold an engine's SM slots for less time
    // when both share the GPU (docs/gpu.md, "Interference"); at least one object per round.
    uint64_t round_bytes = 0;
    // Registered runs of equal length at a constant distance from each other (one layer of many
    // blocks in the DRAM tier, whose chunks hold a block each) go as one pitched 2D copy instead
    // of one copy per run: the copy engine walks the pitch itself, where per-run copies cost
    // microseconds of driver work each (a 64 KiB run per block and layer: about 14 GB/s).
    bool strided_copies = true;
    // kAuto (see above). 0: every timed round is slow (tests).
    double auto_slow_factor = 4;
    uint32_t auto_copy_engine_layers = 64;
  };
  static constexpr uint32_t kSlots = 4;

  // The names config's gpu.scatter uses: "staged", "mapped", "copy_engine", "auto"; nullopt for
  // any other name.
  static std::string_view ModeName(Mode mode);
  static std::optional<Mode> ModeFromName(std::string_view name);

  // Allocates the GPU staging buffer, the slot words, the copy stream and (with bounce threads)
  // the pinned bounce buffer and its threads. INVALID_ARGUMENT for an empty buffer or a bad
  // registered region; RESOURCE_EXHAUSTED when memory is short; UNAVAILABLE without a GPU.
  static absl::StatusOr<std::unique_ptr<LayerCopier>> Create(
      const Options& options, IoStream* stream, absl::Span<const StagingRegion> registered);
  // The same on `device` (its io_stream() is the I/O stream): what Create above does on a
  // CudaDevice over `stream`. Every CudaIpcMemory and ReadyWords given to the copier must be on
  // the same device.
  static absl::StatusOr<std::unique_ptr<LayerCopier>> Create(
      const Options& options, Device* device, absl::Span<const StagingRegion> registered);
  LayerCopier(const LayerCopier&) = delete;
  LayerCopier& operator=(const LayerCopier&) = delete;
  // Waits for both streams, then frees what Create made.
  ~LayerCopier();

  // One caller's layers (see Lanes above). Must be destroyed before the copier, once its last
  // layer has landed or been drained.
  class Lane {
   public:
    Lane(const Lane&) = delete;
    Lane& operator=(const Lane&) = delete;
    ~Lane();

   private:
    friend class LayerCopier;
    explicit Lane(Device* device) : device_(device) {}
    Device* const device_;
    // Blocking-sync events recorded on the I/O stream after this lane's layers, alternately:
    // landed_[next_] is recorded next; with `pending`, landed_[next_ ^ 1] marks a kPrevious layer
    // not yet waited for.
    std::array<Device::Event, 2> landed_{};
    uint32_t next_ = 0;
    bool pending_ = false;
  };
  // INTERNAL when its events cannot be made (the CUDA error named).
  absl::StatusOr<std::unique_ptr<Lane>> NewLane();

  Mode mode() const { return options_.mode; }
  // Store: copies `ops` out of the engine's blocks into registered staging and waits for them.
  // kStaged and kMapped: the gather kernel (about 51 GB/s alone on the H200, but its SMs work for
  // the whole PCIe transfer: 14% of a busy engine's throughput under MPS, 44% without);
  // kCopyEngine and kAuto: the copy engines (about 31 GB/s, no SMs, 0% of the engine's), on a
  // stream of their own (not ordered with the I/O stream: the engine's blocks are its own until
  // the call returns, and the staging is this call's), so the hash kernel below runs beside them
  // rather than after them. kAuto
  // does not switch here as it does for retrieves: under load the gather kernel is only about
  // twice as slow (it waits on PCIe either way), too close to tell, and a store is background
  // work the engine does not wait on per layer. Errors as CudaIpcMemory::Gather. Returns, also on
  // error, only once no copy it enqueued can still write the staging.
  // Checksums: for the ops with a `sum` (engine::ObjectSum), when the kernel supports the object
  // length (GpuHashSupports), the hash kernel runs on the I/O stream (after the copies in kStaged
  // and kMapped, beside them in kCopyEngine and kAuto), over each op's object in the engine's
  // memory (the bytes the copy read; the engine keeps them unchanged until the Store call has
  // captured them, and if it did not, the checksum fails every read of the block: a miss, never a
  // wrong block), and each sum is set (`done`) once the stream has passed both and the gather
  // succeeded. When the hash cannot run (no pinned memory for its descriptors, a launch error:
  // logged with the CUDA error's name, counted in sum_failures) the sums stay not done and the
  // caller computes them on the CPU; the gather itself goes on.
  absl::Status Gather(CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops);

  // Layers placed so far (ScatterLayer calls), and how many of them the copy engines moved alone
  // (every one in kCopyEngine; in kAuto those after a slow kernel); the same for Gather calls.
  struct Counters {
    uint64_t layers = 0;
    uint64_t copy_engine_layers = 0;
    uint64_t gathers = 0;  // Gather calls
    uint64_t copy_engine_gathers = 0;
    // kAuto: rounds timed and judged, and those judged slow. `slow_rounds_uncorrected`: those
    // that would have been slow had the time the host took to enqueue the kernel not been taken
    // off (see CheckTimedRound).
    uint64_t timed_rounds = 0;
    uint64_t slow_rounds = 0;
    uint64_t slow_rounds_uncorrected = 0;
    // Gather checksums: objects hashed by the kernel, and Gather calls whose hash could not run.
    uint64_t summed_objects = 0;
    uint64_t sum_failures = 0;
  };
  Counters counters() const;
  // kAuto: the time a scatter kernel of `bytes` takes on the idle GPU (microseconds; measured at
  // creation), which timed rounds are held to.
  double idle_kernel_us(uint64_t bytes) const;
  // The staging regions an engine memory must know (CudaIpcMemory::Open / WrapLocal): the
  // registered host regions and the GPU staging buffer.
  std::vector<StagingRegion> staging_regions() const;

  // When ScatterLayer returns.
  enum class Wait {
    // Once this layer is in the engine's memory: its sources may be reused at once.
    kLanded,
    // Once this layer is enqueued and the lane's layer before it has landed (so has everything
    // enqueued before that one), so the next layer's copies overlap this one's last kernel. This
    // layer's sources must stay unchanged until a later ScatterLayer or Drain on the lane returns.
    kPrevious,
  };

  // Copies each op's object from host staging (op.staging, a host address) into `memory`, then,
  // if `words` is not null, enqueues words->Signal(word, ticket), then waits as `wait` says.
  // INVALID_ARGUMENT for an op outside `memory`'s layout (nothing is enqueued) or an object
  // larger than a slot; INTERNAL for CUDA errors. On error the word is not written: the caller
  // decides (the server still writes it, see daemon/engine/engine_io.h). An error returns only
  // once both streams are past every copy enqueued so far, so the sources of this layer and of
  // any earlier kPrevious layer may be reused at once (whatever `wait` says).
  // `lane`: the caller's (NewLane), or null for the copier's own, shared by every call without
  // one.
  [[nodiscard]] absl::Status ScatterLayer(CudaIpcMemory* memory,
                                          absl::Span<const engine::CopyOp> ops, ReadyWords* words,
                                          uint32_t word, uint32_t ticket, Wait wait = Wait::kLanded,
                                          Lane* lane = nullptr);
  // With a lane: returns once the lane's layers have landed. Without: once every layer enqueued
  // so far (by any caller) has.
  [[nodiscard]] absl::Status Drain(Lane* lane = nullptr);

 private:
  struct CopyJob {  // for the bounce threads
    uint8_t* dst;
    const uint8_t* src;
    uint64_t len;
  };
  friend class CopyPool;
  // Pinned memory for one Gather's hash descriptors and hashes (device-addressable), with the op
  // index of each; reused across calls.
  struct SumBuffer {
    std::unique_ptr<Device::PinnedBuffer> memory;
    size_t capacity = 0;  // objects
    std::vector<uint32_t> ops;
    HashDesc* descs() const { return reinterpret_cast<HashDesc*>(memory->host()); }
    uint64_t* hashes() const {
      return reinterpret_cast<uint64_t*>(memory->host() + capacity * sizeof(HashDesc));
    }
  };
  struct Run {  // bytes [host, host + len) go to offset `offset` of the round's slot
    const uint8_t* host;
    uint64_t len;
    uint64_t offset;
    bool registered;
  };

  LayerCopier(const Options& options, Device* device, std::unique_ptr<Device> owned_device);
  static absl::StatusOr<std::unique_ptr<LayerCopier>> CreateOn(
      const Options& options, Device* device, std::unique_ptr<Device> owned_device,
      absl::Span<const StagingRegion> registered);
  absl::Status ScatterOnLane(CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops,
                             ReadyWords* words, uint32_t word, uint32_t ticket, Wait wait,
                             Lane* lane);
  // Enqueues the layer's copies and its ready word, then records `landed` after them.
  absl::Status EnqueueLayerLocked(CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops,
                                  ReadyWords* words, uint32_t word, uint32_t ticket,
                                  Device::Event landed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a failed layer: waits for both streams and starts the slots' words afresh (both
  // below), so the sources of every layer enqueued so far may be reused.
  void RecoverLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a failed enqueue: waits until the copy stream, the gather stream and the I/O stream have
  // passed everything enqueued so far (logged, not returned, if that fails too: the first error is
  // the caller's).
  void WaitStreamsAfterError();
  // After WaitStreamsAfterError of a failed layer (both streams idle): every slot's words and uses
  // start afresh, so a word write that could not be enqueued leaves no later wait that never ends.
  void ResetSlotWords() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns once everything enqueued on the I/O stream before the call has run; the thread
  // sleeps. Safe from several threads at once: a wait that finds `waited_` recorded again by
  // another waits for that later point, which comes after its own work.
  absl::Status WaitIoStream();
  absl::Status Init(absl::Span<const StagingRegion> registered);
  // Gather: enqueues the hash kernel over the engine objects of the ops of `ops` with a sum, on
  // the I/O stream; the buffer holding their descriptors and (once the stream has passed it)
  // hashes, or null when there is nothing to hash or the hash could not be enqueued (logged).
  std::unique_ptr<SumBuffer> EnqueueSums(CudaIpcMemory* memory,
                                         absl::Span<const engine::CopyOp> ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues the staged part of `ops` (the ones at `indices`) in rounds of one slot each.
  absl::Status EnqueueStaged(CudaIpcMemory* memory, absl::Span<const engine::CopyOp> ops,
                             std::vector<uint32_t>* indices) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One slot: copies in on the copy stream, the scatter kernel on the I/O stream, each side
  // waiting for the other's word. Both words are written even after an error, so neither stream
  // can wait forever.
  absl::Status FlushRound(CudaIpcMemory* memory) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CopyIn(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsRegistered(const uint8_t* host, uint64_t len) const;
  struct IdleKernel {
    double fixed_us = 0;  // a launch
    double us_per_mib = 0;
    double Us(uint64_t bytes) const;
  };
  // kAuto: kernels smaller than this are not judged.
  static constexpr uint64_t kMinTimedBytes = 1ull << 20;
  // kAuto: fits idle_ to the scatter kernel (slot 0 -> slot 1) timed on the idle GPU at two sizes.
  absl::Status MeasureIdleKernel();
  // The scatter kernel over `bytes` of slot 0 into slot 1, best of three (microseconds).
  absl::StatusOr<double> TimeIdleKernel(uint64_t bytes);
  // kAuto: reads the timed round, if it has run; a slow one sends the next layers to the copy
  // engines.
  void CheckTimedRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many runs from runs_[first] on form one 2D copy (equal lengths, both pitches constant);
  // 1 when strided copies are off or the next run breaks the pattern.
  size_t StridedGroup(size_t first) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const std::unique_ptr<Device> owned_device_;  // null when the caller's
  Device* const device_;
  StagingMap registered_;
  std::vector<StagingRegion> registered_list_;
  uint64_t slot_bytes_ = 0;
  uint64_t max_pitch_ = 0;  // cudaDevAttrMaxPitch
  uint8_t* gpu_base_ = nullptr;         // kSlots x slot_bytes_
  uint32_t* words_ = nullptr;           // device: copied[kSlots], consumed[kSlots]
  Device::Stream copy_stream_ = nullptr;  // primary context; no SMs needed
  // Gathers by the copy engines (primary context, no SMs), and a blocking-sync event to wait for
  // them as waited_ does for the I/O stream.
  Device::Stream gather_stream_ = nullptr;
  Device::Event gathered_ = nullptr;
  std::unique_ptr<Device::PinnedBuffer> bounce_;
  std::array<Device::Event, kSlots> bounce_free_{};  // recorded on copy_stream_
  std::unique_ptr<CopyPool> pool_;

  // The lane of calls made without one; own_mu_ serializes them whole.
  absl::Mutex own_mu_;
  std::unique_ptr<Lane> own_lane_ ABSL_GUARDED_BY(own_mu_);
  mutable absl::Mutex mu_;  // enqueueing (always taken after own_mu_)
  std::array<uint32_t, kSlots> uses_ ABSL_GUARDED_BY(mu_){};
  std::array<bool, kSlots> bounce_pending_ ABSL_GUARDED_BY(mu_){};
  // Blocking-sync (the waiting thread sleeps instead of spinning a core), for waits on the whole
  // I/O stream (WaitIoStream).
  Device::Event waited_ = nullptr;
  // kAuto state: timing events around one round's kernel, that round's bytes while its timing
  // is unread, whether the next round is to be timed.
  IdleKernel idle_;
  std::array<Device::Event, 2> timed_{};
  uint64_t timed_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Host time from recording the first timing event to recording the second (enqueueing the
  // kernel between them), microseconds.
  double timed_host_us_ ABSL_GUARDED_BY(mu_) = 0;
  bool time_next_round_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t copy_engine_left_ ABSL_GUARDED_BY(mu_) = 0;
  bool slow_ ABSL_GUARDED_BY(mu_) = false;  // the last timed round was slow (logged on change)
  Counters counters_ ABSL_GUARDED_BY(mu_);
  uint32_t next_slot_ ABSL_GUARDED_BY(mu_) = 0;
  // Scratch, reused across calls.
  std::vector<uint32_t> staged_ ABSL_GUARDED_BY(mu_);
  std::vector<engine::CopyOp> direct_ ABSL_GUARDED_BY(mu_);
  std::vector<Run> runs_ ABSL_GUARDED_BY(mu_);
  std::vector<engine::CopyOp> round_ops_ ABSL_GUARDED_BY(mu_);
  std::vector<CopyJob> jobs_ ABSL_GUARDED_BY(mu_);
  // Gather checksums' buffers: free ones, and those of gathers whose wait failed (a kernel may
  // still read them; freed with the copier).
  std::vector<std::unique_ptr<SumBuffer>> sum_buffers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<SumBuffer>> retired_sums_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::gpu

#endif  // TUTTI_DAEMON_GPU_LAYER_COPIER_H_

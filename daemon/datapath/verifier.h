// Step 3 of a transfer (check): whether the objects a read brought into staging are the objects
// that were written, by their checksums (pool::ObjectChecksum: XXH3 seeded with the namespace,
// key, epoch and object index).
//
// A Verifier takes a batch of objects and answers, per object, whether its checksum matches. The
// reader hands it each batch of reads as it completes, so checks run beside the reads of the
// devices and never on the thread leading the transfer. Each batch comes with its stream (one
// Read's, as the reader posts them: LayerReader::PostFn): a verifier that queues batches serves
// the streams queued in turn (fair_queue.h), so a Read that starts behind another's backlog of
// checks waits for one batch of each stream ahead of it, not for the backlog. Implementations:
// CpuVerifier (a WorkPool's threads, tasks of 32 objects) and daemon/gpu/gpu_verifier.h (the hash
// kernel over objects copied to the GPU); VerifierSwitch picks between them at start-up.
//
// Thread-safety: Verify may be called from any thread, concurrently.
#ifndef TUTTI_DAEMON_DATAPATH_VERIFIER_H_
#define TUTTI_DAEMON_DATAPATH_VERIFIER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "absl/types/span.h"
#include "common/types.h"
#include "daemon/datapath/work_pool.h"

namespace tutti::datapath {

// One object to check: `len` bytes at `bytes` against `expected`.
struct ObjectCheck {
  NamespaceId ns = 0;
  const Key* key = nullptr;
  uint64_t epoch = 0;
  uint32_t object = 0;  // layer * parts + part
  const uint8_t* bytes = nullptr;
  uint32_t len = 0;
  uint64_t expected = 0;
  // Out, optional: a verifier that checked a copy of the bytes in GPU memory and keeps it there
  // (daemon/gpu/gpu_verifier.h with a mirror) writes that copy's device address here before `done`,
  // if the checksum matched; it stays valid as long as `bytes` do not change. Left untouched
  // otherwise (the caller sets it to null first).
  const uint8_t** device_copy = nullptr;
  // In, optional: GPU memory this object is to be checked in (a layer staged on the GPU,
  // layer_reader.h). A verifier that copies objects to the GPU copies `bytes` here, checks the
  // copy, and on a match writes this address to *device_copy; one that cannot (the CPU's, or the
  // GPU's falling back after a CUDA error) leaves *device_copy untouched, and the caller must
  // then not use the object: `bytes` may be reused once `done` has run.
  uint8_t* place = nullptr;
};

// Answers in `matches`.
inline constexpr uint8_t kMismatch = 0;
inline constexpr uint8_t kMatch = 1;
// Only from VerifyReleasing: the object's bytes went back to the caller (`released` ran) before
// its check could finish (the GPU's, after a CUDA error). Neither valid nor known corrupt: the
// caller must not use the object, and must not take the stored block for damaged either.
inline constexpr uint8_t kNotChecked = 2;

class Verifier {
 public:
  virtual ~Verifier() = default;
  virtual std::string_view name() const = 0;
  // Sets matches[i] to kMatch if checks[i]'s checksum is its `expected`, else kMismatch, then
  // runs `done` once, on any thread (possibly inside this call). `checks`, `matches` and every
  // object's bytes stay valid and unchanged until `done` runs. `stream`: the batch's (above; any
  // one value where there is only one). Precondition: checks.size() == matches.size().
  virtual void Verify(uint64_t stream, absl::Span<const ObjectCheck> checks,
                      absl::Span<uint8_t> matches, std::function<void()> done) = 0;
  // As Verify, but the objects' bytes need stay valid and unchanged only until `released` runs:
  // once, on any thread, before `done` (never after it). A verifier that copies the objects
  // elsewhere to check them (the GPU's) runs it as soon as the copies have landed, so the caller
  // can reuse the bytes (a bounce slot) while the checks go on; it may then answer kNotChecked
  // (above). `released` must not call into CUDA (it may run on CUDA's callback thread) and should
  // be short. The default runs `released` right before `done`.
  virtual void VerifyReleasing(uint64_t stream, absl::Span<const ObjectCheck> checks,
                               absl::Span<uint8_t> matches, std::function<void()> released,
                               std::function<void()> done) {
    Verify(stream, checks, matches, [released = std::move(released), done = std::move(done)] {
      released();
      done();
    });
  }
};

// Checks on `pool` (which must outlive it), in tasks of 32 objects taken by stream in turn (the
// pool runs tasks in order; each takes the next object range of the stream whose turn it is);
// with a null pool or a pool of no threads, inline on the caller.
std::unique_ptr<Verifier> MakeCpuVerifier(WorkPool* pool);

// Forwards every batch to the verifier set last (the GPU's once the GPU data path is up), or to
// `initial` until one is set. Set while no Verify call is in progress on the verifier being
// replaced (at start-up, or after the reads have stopped); a verifier set must outlive its use.
class VerifierSwitch final : public Verifier {
 public:
  explicit VerifierSwitch(Verifier* initial) : current_(initial) {}
  std::string_view name() const override { return current()->name(); }
  void Verify(uint64_t stream, absl::Span<const ObjectCheck> checks, absl::Span<uint8_t> matches,
              std::function<void()> done) override {
    current()->Verify(stream, checks, matches, std::move(done));
  }
  void VerifyReleasing(uint64_t stream, absl::Span<const ObjectCheck> checks,
                       absl::Span<uint8_t> matches, std::function<void()> released,
                       std::function<void()> done) override {
    current()->VerifyReleasing(stream, checks, matches, std::move(released), std::move(done));
  }
  void Set(Verifier* v) { current_.store(v, std::memory_order_release); }
  Verifier* current() const { return current_.load(std::memory_order_acquire); }

 private:
  std::atomic<Verifier*> current_;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_VERIFIER_H_

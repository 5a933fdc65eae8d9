// A fake EngineIo for tests: an engine's memory that says what it is (host or device, with or
// without ready words), copies through an inner EngineIo if given (host memory, usually
// MakeHostEngineIo), and records every call and every ready word it writes in a FakeEngineLog the
// test owns. Errors are injected through the log. It lets the GPU path's session logic (one
// Retrieve in flight, every word written once, the captured word, overlapped layers) run without
// a GPU.
//
// Contract, as a cuda EngineIo (daemon/engine/cuda_engine_io.h): ScatterLayer and EnqueueLayer
// copy and then write word `layer` (if ready words are on); SignalLayers writes words [begin,
// end) below num_layers; SignalCaptured writes word num_layers with the newer of its tickets.
// After Close every call is still recorded in `calls` but is CANCELLED and writes nothing; Close
// closes the inner EngineIo.
//
// Thread-safety: the EngineIo may be used from any thread; the log's fields are read and set
// under its mutex, except `hold` (atomic) and `inside` (set before the hold).
#ifndef TUTTI_DAEMON_ENGINE_FAKE_ENGINE_IO_H_
#define TUTTI_DAEMON_ENGINE_FAKE_ENGINE_IO_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "daemon/engine/engine_io.h"

namespace tutti::engine {

// Everything the fakes of one test did, and the errors and gates a test sets for them.
struct FakeEngineLog {
  using Signals = std::vector<std::pair<uint32_t, uint32_t>>;  // (word, ticket)

  // One call into the EngineIo, in order.
  struct Call {
    enum Kind { kScatter, kEnqueue, kDrain, kSignalLayers, kGather, kSignalCaptured, kClose };
    Kind kind;
    uint32_t layer = 0;  // ScatterLayer, EnqueueLayer; SignalLayers' begin
    uint32_t end = 0;    // SignalLayers
    uint32_t ticket = 0;
    std::vector<CopyOp> ops;  // ScatterLayer, EnqueueLayer, Gather
  };

  absl::Mutex mu;
  Signals signals ABSL_GUARDED_BY(mu);                 // ready words written
  std::vector<Call> calls ABSL_GUARDED_BY(mu);         // every call made, also after Close
  std::vector<uint32_t> enqueued ABSL_GUARDED_BY(mu);  // layers that went through EnqueueLayer
  int drains ABSL_GUARDED_BY(mu) = 0;
  // Injected errors: ScatterLayer (or EnqueueLayer) of this layer fails INTERNAL, nothing copied
  // or signaled; Gather returns `gather_error` when it is not OK, nothing copied.
  int fail_layer ABSL_GUARDED_BY(mu) = -1;
  absl::Status gather_error ABSL_GUARDED_BY(mu);
  // When set, the next ScatterLayer takes it (once), notifies `inside` and waits on it.
  std::atomic<absl::Notification*> hold{nullptr};
  absl::Notification* inside = nullptr;

  void Add(uint32_t word, uint32_t ticket) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    signals.emplace_back(word, ticket);
  }
  // The words written since the last Take.
  Signals Take() ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    return std::exchange(signals, {});
  }
};

struct FakeEngineOptions {
  std::string kind = "fake";
  bool is_device = false;
  bool has_ready_words = false;
  uint32_t num_layers = 0;  // word num_layers is a Store's
  uint32_t num_blocks = 0;  // without an inner EngineIo (else the inner one's)
};

// `log` must outlive the EngineIo. `inner`, if given, does the copies (and its errors are
// returned); without one copies succeed and move no data.
std::unique_ptr<EngineIo> MakeFakeEngineIo(FakeEngineOptions options,
                                           std::unique_ptr<EngineIo> inner, FakeEngineLog* log);

}  // namespace tutti::engine

#endif  // TUTTI_DAEMON_ENGINE_FAKE_ENGINE_IO_H_

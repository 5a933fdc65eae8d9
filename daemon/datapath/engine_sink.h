// The engine end of a transfer: where a Retrieve's verified layers go. The server adapts its
// session's EngineIo to it (binding the call's ticket and its cancellation); tests use a fake.
//
// A layer is either copied (CopyLayer: its sources may be reused once the call returns) or, where
// the engine can overlap copies (device memory), enqueued (EnqueueLayer: the copy may still be in
// flight on return, so the next layer's copy overlaps its tail). Drain waits for what was
// enqueued. Which one a layer gets is the transfer's decision (retrieve_transfer.h), never the
// engine's.
//
// Errors: CANCELLED when the engine went away or the call was cancelled (nothing copied);
// INVALID_ARGUMENT for ops outside the engine's memory; INTERNAL for device errors (the layer is
// then not marked ready).
//
// Thread-safety: one transfer calls its sink from one thread at a time.
#ifndef TUTTI_DAEMON_DATAPATH_ENGINE_SINK_H_
#define TUTTI_DAEMON_DATAPATH_ENGINE_SINK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/engine/copy_op.h"

namespace tutti::datapath {

class EngineSink {
 public:
  virtual ~EngineSink() = default;

  // True when EnqueueLayer may return before the layer has landed (device memory); false when it
  // is CopyLayer under another name (host memory).
  virtual bool can_overlap() const = 0;
  // Copies `ops` (op.staging: the source) into the engine's blocks and marks `layer` ready.
  // Returns once the sources may be reused and every layer before it has landed.
  [[nodiscard]] virtual absl::Status CopyLayer(uint32_t layer,
                                               absl::Span<const engine::CopyOp> ops) = 0;
  // Like CopyLayer, but returns once the layer is enqueued and every layer before it has landed.
  // The caller keeps this layer's sources unchanged until a later CopyLayer, EnqueueLayer or
  // Drain returns.
  [[nodiscard]] virtual absl::Status EnqueueLayer(uint32_t layer,
                                                  absl::Span<const engine::CopyOp> ops) = 0;
  // Returns once every layer enqueued so far has landed.
  [[nodiscard]] virtual absl::Status Drain() = 0;
};

}  // namespace tutti::datapath

#endif  // TUTTI_DAEMON_DATAPATH_ENGINE_SINK_H_

// Internal: the state of one Retrieve (Retrieval::Rep): which layers have landed, which blocks
// failed, and how the transfer ended; and the rule that a broken transfer releases every layer
// wait (in cuda mode by writing the ready words itself, as tuttid can no longer).
//
// The reader of the RPC stream calls OnProgress for each message and OnEnd once; the engine's
// thread calls WaitLayer and Wait.
//
// Thread-safety: all methods are thread-safe.
#ifndef TUTTI_CLIENT_CPP_TRANSFER_H_
#define TUTTI_CLIENT_CPP_TRANSFER_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/cpp/device.h"
#include "tutti/client.h"

namespace tutti::client {

struct Retrieval::Rep {
  // `words` (cuda mode; null in host mode) must outlive the Rep. Layers [layer_begin, layer_end).
  Rep(uint32_t num_blocks, uint32_t layer_begin, uint32_t layer_end, uint32_t ticket,
      internal::ReadyWords* words)
      : num_blocks(num_blocks),
        layer_begin(layer_begin),
        layer_end(layer_end),
        ticket(ticket),
        words(words),
        next_layer(layer_begin) {}

  // Layer `layer` has landed for all blocks but `failed` (indices into the request). Messages out
  // of order or out of range end the transfer as INTERNAL once it ends.
  void OnProgress(uint32_t layer, absl::Span<const uint32_t> failed);
  // The stream ended with `status`. Unless it was OK with every layer reported, every block is
  // failed and, in cuda mode, the ready words are force-released to this ticket.
  void OnEnd(const absl::Status& status);

  // See Retrieval::WaitLayer and Retrieval::Wait.
  Status WaitLayer(uint32_t layer, void* cuda_stream);
  const RetrieveOutcome& Wait();
  bool ended() const;

  const uint32_t num_blocks;
  const uint32_t layer_begin;
  const uint32_t layer_end;
  const uint32_t ticket;
  internal::ReadyWords* const words;

 private:
  mutable absl::Mutex mu;
  uint32_t next_layer ABSL_GUARDED_BY(mu);  // layers [layer_begin, next_layer) have landed
  bool out_of_order ABSL_GUARDED_BY(mu) = false;
  std::vector<bool> failed_blocks ABSL_GUARDED_BY(mu);
  bool ended_ ABSL_GUARDED_BY(mu) = false;
  RetrieveOutcome outcome ABSL_GUARDED_BY(mu);
};

}  // namespace tutti::client

#endif  // TUTTI_CLIENT_CPP_TRANSFER_H_

// A minimal GPU inference "engine" for two-process tests and benchmarks against a real tuttid: it
// allocates a paged KV cache on the GPU in one of the three formats (fused K/V per layer as vLLM,
// separate K and V per layer, one MLA latent per layer), attaches it by CUDA IPC with ready
// words, and stores and retrieves blocks over gRPC while its own stream waits per layer on the
// ready words (gpu::WaitLayer), as an engine's attention would. Content is checked on the GPU,
// on the engine's stream, right after each layer's wait (content_kernel.h).
//
// Thread-safety: none; one thread drives an engine.
#ifndef TUTTI_TESTS_GPU_GPU_ENGINE_H_
#define TUTTI_TESTS_GPU_GPU_ENGINE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/ready_words.h"
#include "grpcpp/channel.h"
#include "tests/gpu/content_kernel.h"
#include "tutti/v1/kvcache.grpc.pb.h"

namespace tutti::gputest {

struct EngineShape {
  tutti::v1::KvFormat format = tutti::v1::KV_FORMAT_FUSED;
  uint32_t layers = 4;
  uint32_t kv_heads = 8;
  uint32_t head_dim = 128;
  uint32_t dtype_bytes = 2;
  uint32_t block_tokens = 16;
  uint32_t num_blocks = 64;  // engine blocks per layer tensor
  std::string model_id = "gpu-test";

  uint32_t parts() const { return format == tutti::v1::KV_FORMAT_MLA ? 1 : 2; }
  uint32_t object_len() const { return block_tokens * kv_heads * head_dim * dtype_bytes; }
};

const char* FormatName(tutti::v1::KvFormat format);

struct RetrieveResult {
  grpc::Status rpc;
  std::vector<uint32_t> layers_reported;  // progress messages, in order
  std::vector<uint32_t> failed;           // indices into the request's blocks
  double rpc_ms = 0;                      // from sending to the end of the stream, on the host
};

class GpuEngine {
 public:
  // Allocates the KV tensors (each its own allocation, rounded to 2 MiB) and the ready words on
  // GPU 0, and attaches to tuttid at `socket` with engine_pid = this process.
  static absl::StatusOr<std::unique_ptr<GpuEngine>> Create(const EngineShape& shape,
                                                           const std::string& socket,
                                                           const std::string& engine_id);
  ~GpuEngine();  // detaches (errors ignored) and frees

  const EngineShape& shape() const { return shape_; }
  uint64_t session_id() const { return session_id_; }
  cudaStream_t stream() const { return stream_; }
  gpu::ReadyWordArray& words() { return *words_; }
  tutti::v1::KvCache::Stub& stub() { return *stub_; }
  // Key `id` of this engine's model: 16 bytes.
  std::string Key(uint32_t id) const;
  uint64_t LayerBytes(size_t blocks) const {
    return uint64_t{shape_.parts()} * shape_.object_len() * blocks;
  }

  // Fills every object of engine blocks[i] with the content of key key_ids[i]. Waits.
  absl::Status Fill(const std::vector<uint32_t>& blocks, const std::vector<uint32_t>& key_ids,
                    uint64_t seed);
  // Sets every byte of the KV tensors to `byte`. Waits.
  absl::Status Poison(uint8_t byte);
  // Stores the blocks under their keys (all layers), then waits on the GPU for the captured word.
  absl::StatusOr<std::vector<tutti::v1::StoreOutcome>> Store(const std::vector<uint32_t>& blocks,
                                                             const std::vector<uint32_t>& key_ids,
                                                             bool wait_durable);
  // Lookup: (hits, lease).
  absl::StatusOr<std::pair<uint32_t, uint64_t>> Lookup(const std::vector<uint32_t>& key_ids);

  uint32_t NextTicket() { return ++ticket_; }
  // Enqueues on the engine's stream, per layer l: wait for word l >= ticket, record event l, and
  // with `check_seed` count the words of layer l's objects (blocks[i] holding key key_ids[i])
  // that differ. Call before Retrieve with the same ticket; WaitStream before the next call.
  absl::Status EnqueueLayerWaits(uint32_t ticket, const std::vector<uint32_t>& blocks,
                                 const std::vector<uint32_t>& key_ids,
                                 std::optional<uint64_t> check_seed);
  // Retrieves all layers of blocks[i] <- key key_ids[i] under `lease`. `on_progress` is called
  // for every progress message.
  RetrieveResult Retrieve(uint64_t lease, const std::vector<uint32_t>& blocks,
                          const std::vector<uint32_t>& key_ids, uint32_t ticket,
                          const std::function<void(uint32_t layer)>& on_progress = nullptr);
  // Waits up to `timeout` for the engine's stream; true if it drained.
  bool WaitStream(absl::Duration timeout);
  // After the stream drained: mismatching words per layer, and when each layer's wait ended
  // (ms after the waits were enqueued).
  absl::StatusOr<std::vector<uint64_t>> Mismatches() const;
  absl::StatusOr<std::vector<float>> LayerReadyMs() const;

 private:
  GpuEngine() = default;
  absl::Status Allocate();
  absl::Status Attach(const std::string& socket, const std::string& engine_id);
  // Object (layer l, part p) of engine block b.
  void* Object(uint32_t block, uint32_t object) const;
  absl::Status UploadRefs(const std::vector<ObjectRef>& refs, ObjectRef* dst);

  EngineShape shape_;
  std::vector<uint8_t*> regions_;
  std::vector<uint64_t> region_bytes_;
  struct Placement {
    uint32_t region;
    uint64_t offset, stride;
  };
  std::vector<Placement> placements_;
  std::unique_ptr<gpu::ReadyWordArray> words_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;  // [0]: start, [1 + l]: layer l ready
  ObjectRef* fill_refs_ = nullptr;   // device, one per object of every block
  ObjectRef* check_refs_ = nullptr;
  unsigned long long* counters_ = nullptr;  // device, one per layer
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tutti::v1::KvCache::Stub> stub_;
  uint64_t session_id_ = 0;
  std::string session_token_;
  uint32_t ticket_ = 0;
};

}  // namespace tutti::gputest

#endif  // TUTTI_TESTS_GPU_GPU_ENGINE_H_

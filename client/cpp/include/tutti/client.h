// tutti's engine client library: attach an inference engine's paged KV cache to tuttid, look up
// cached prefixes, load them layer by layer into the engine's own blocks, and store new blocks.
//
// This header shows only standard C++ and the types below: no protobuf, gRPC, Abseil or CUDA
// types, so an engine can load the library next to its own versions of those. A CUDA stream is
// passed as `void*` (a cudaStream_t / CUstream).
//
// Two memory modes, picked at Attach:
//  - host: the KV cache lies in POSIX shared memory (SharedMemory below) that tuttid maps. Waiting
//    for a layer blocks the calling thread until tuttid reports it copied.
//  - cuda: the KV cache is device memory of one GPU. The library exports IPC handles of the
//    allocations that hold it and allocates "ready words" that tuttid writes when a layer has
//    landed; waiting for a layer enqueues a GPU-side wait (cuStreamWaitValue32) on the engine's
//    stream and returns at once. Needs a tuttid in GPU mode on the same GPU.
//
// Failure model. Every call returns a Status (or a Result holding one). A failed Retrieve never
// leaves the engine waiting: if tuttid fails a block, dies, or the call breaks, every layer wait
// of that Retrieve is released (host: WaitLayer returns; cuda: the library writes the ready words
// itself) and RetrieveOutcome::failed names the blocks to recompute. When tuttid goes away the
// library re-attaches by itself once it is back (the cache on SSD survives a restart); meanwhile
// calls return UNAVAILABLE, which an engine treats as a miss (Lookup) or a dropped save (Store).
//
// Thread-safety: a Client may be used from several threads at once. Retrieves of one Client run
// one at a time (tuttid's per-session rule): Retrieve waits until the previous transfer has
// ended. A Retrieval is used by one thread.
#ifndef TUTTI_CLIENT_H_
#define TUTTI_CLIENT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tutti::client {

// The same numbering as gRPC's and Abseil's codes.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// "UNAVAILABLE", "NOT_FOUND", ...
const char* StatusCodeName(StatusCode code);

// OK, or a code and a message saying what failed and, where it helps, what to do.
class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;  // "OK" or "UNAVAILABLE: message"

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value, or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit, like absl::StatusOr
  // Precondition: !status.ok() (an OK status becomes an INTERNAL error).
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "Result built from an OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // Preconditions: ok().
  T& value() & { return value_; }
  const T& value() const& { return value_; }
  T&& value() && { return std::move(value_); }
  T& operator*() & { return value_; }
  T&& operator*() && { return std::move(value_); }
  T* operator->() { return &value_; }
  const T* operator->() const { return &value_; }

 private:
  Status status_;
  T value_{};
};

// A block key: the engine's chained prefix hash of a block's tokens, 16 bytes.
using BlockKey = std::array<uint8_t, 16>;

// The chained prefix hash "tutti-sha256-v1" (also in the Python package, bit for bit): for each
// full block i of `block_tokens` tokens,
//   key[i] = SHA-256(key[i-1] || uint32le(block_tokens) || tokens of block i as uint32le)[0:16]
// with key[-1] = `parent` (16 zero bytes for a plain prompt; set it to salt a chain, e.g. with a
// LoRA adapter id). A partial last block gets no key. Same tokens, same keys: in every process,
// every language and after restarts.
inline constexpr char kChainHashScheme[] = "tutti-sha256-v1";
std::vector<BlockKey> ChainKeys(const int32_t* tokens, size_t count, uint32_t block_tokens,
                                const BlockKey& parent = BlockKey{});

// Lowercase hex, 32 characters (for logs).
std::string KeyHex(const BlockKey& key);

enum class KvFormat : int {
  kSeparate = 1,  // one K and one V tensor per layer
  kFused = 2,     // one tensor per layer holding K and V (vLLM: [2, blocks, tokens, heads, dim])
  kMla = 3,       // one latent tensor per layer: kv_heads = 1, head_dim = latent width
  kPacked = 4,    // one tensor per layer, K and V packed in the last dim: head_dim = 2 x head size
};

struct KvLayout {
  uint32_t num_layers = 0;
  uint32_t kv_heads = 0;  // KV heads of this tensor-parallel rank
  uint32_t head_dim = 0;
  uint32_t dtype_bytes = 0;
  uint32_t block_tokens = 0;
  KvFormat format = KvFormat::kFused;

  uint32_t parts() const {
    return format == KvFormat::kMla || format == KvFormat::kPacked ? 1 : 2;
  }
  // Bytes of one (layer, part) object of one block.
  uint64_t object_bytes() const {
    return uint64_t{block_tokens} * kv_heads * head_dim * dtype_bytes;
  }
};

// Keys never cross namespaces: engines share blocks only when every field is equal.
struct ModelNamespace {
  std::string model_id;  // e.g. "meta-llama/Meta-Llama-3-8B@<revision>"
  KvLayout layout;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  std::string hash_scheme = kChainHashScheme;
};

// Where object (layer l, part p) of engine block b lives:
//   objects[l * layout.parts() + p].base + b * block_stride.
// For vLLM's fused per-layer tensor kv[l] of shape [2, num_blocks, ...]: part p's base is
// kv[l][p].data_ptr() and block_stride is the byte stride of dimension 1.
struct ObjectTensor {
  const void* base = nullptr;
  uint64_t block_stride = 0;
};

// A POSIX shared-memory object for a host-mode KV cache, created by this process (mode 0660, so
// tuttid's group can map it) and mapped read-write. Its name stays until destruction, so the
// library can re-attach after a tuttid restart; it is also removed on SIGINT, SIGTERM, SIGHUP
// and SIGQUIT. Thread-safety: immutable.
class SharedMemory {
 public:
  // `prefix`: 1..64 characters of [A-Za-z0-9_.-]. INVALID_ARGUMENT for a bad prefix or size 0,
  // RESOURCE_EXHAUSTED when /dev/shm has no room, INTERNAL for other system errors.
  static Result<std::unique_ptr<SharedMemory>> Create(const std::string& prefix, uint64_t size);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  const std::string& name() const;  // the shm_open name, with its leading '/'
  uint8_t* data() const;
  uint64_t size() const;

 private:
  struct Rep;
  explicit SharedMemory(std::unique_ptr<Rep> rep);
  std::unique_ptr<Rep> rep_;
};

// A shared-memory region this process created and maps at `data` (for engines that make their
// own, e.g. Python's; SharedMemory::region() gives one for the class above).
struct HostRegion {
  std::string shm_name;  // with its leading '/'
  const void* data = nullptr;
  uint64_t size = 0;
};
HostRegion RegionOf(const SharedMemory& shm);

enum class MemoryMode : int { kHost = 0, kCuda = 1 };

struct AttachOptions {
  std::string socket_path = "/run/tutti/tuttid.sock";
  std::string engine_id = "engine";  // free text, shown by `tuttictl sessions`
  ModelNamespace ns;
  uint32_t num_blocks = 0;            // engine blocks; valid indices are [0, num_blocks)
  std::vector<ObjectTensor> objects;  // ns.layout.num_layers * parts() entries, layer-major
  MemoryMode mode = MemoryMode::kHost;
  std::vector<HostRegion> host_regions;  // host mode: the regions that hold every object
  int cuda_device = 0;                   // cuda mode: the device that holds every object
  int connect_timeout_ms = 5000;         // for the first connection
  int call_timeout_ms = 120000;          // deadline of each call
  bool reattach = true;                  // re-attach by itself after tuttid restarts
  // tuttid keeps each user's namespaces apart; engines of any user that give the same secret
  // (16 to 64 random bytes) share one namespace (docs/security.md "Namespaces"). Empty: this
  // user's own. A secret of another length is refused by tuttid (kInvalidArgument).
  std::string namespace_secret;
};

// Blocks [0, hits) of a looked-up chain are present and pinned until Retrieve ends, Release, or
// the lease times out (lease_ttl_ms). hits = 0 holds nothing.
// Load or recompute (docs/decision.md): retrieve the first load_blocks (<= hits) keys and compute
// the rest of the prompt; the Retrieve ends the lease's other pins too. load_blocks = hits unless
// Lookup was given prompt_tokens and tuttid could predict (then decision_id != 0 and the
// predicted times to first token are set, in ms: for load_blocks, for loading nothing, for
// loading every hit).
struct Lease {
  uint64_t id = 0;
  uint32_t hits = 0;
  uint32_t ttl_ms = 0;
  uint64_t generation = 0;  // Client::generation() when it was granted
  uint32_t load_blocks = 0;
  double predicted_ttft_ms = 0;
  double predicted_recompute_ms = 0;
  double predicted_load_all_ms = 0;
  uint64_t decision_id = 0;
};

// One prefill's measured per-layer compute (Client::ReportCompute).
struct ComputeSample {
  uint32_t new_tokens = 0;      // tokens computed (>= 1)
  uint32_t context_tokens = 0;  // the whole context, the new tokens included (>= new_tokens)
  double layer_ms = 0;          // mean time of one layer's forward (> 0)
  double overhead_ms = 0;       // the prefill's time outside the layers (>= 0)
};

struct ComputeReport {
  bool decision_found = false;  // the decision_id was known to tuttid
  double prediction_error = 0;  // |predicted - measured| / measured, when found
};

enum class StoreOutcome : int {
  kUnspecified = 0,
  kCaptured = 1,        // copied; the engine may reuse its block
  kDurable = 2,         // on SSD and journaled (StoreOptions::wait_durable)
  kAlreadyPresent = 3,  // stored before; nothing copied
  kRejectedFull = 4,    // tuttid's staging is full; nothing copied; drop it or try later
  kFailed = 5,          // the write failed; the block is a future miss
  // tuttid's admission policy (pool.admission) did not write it: a future miss, not an error;
  // not worth retrying now (a later Store of the key may be admitted).
  kDeclined = 6,
  // pool.admission "dram_front": copied into tuttid's DRAM only (the engine may reuse its block);
  // found by Lookups while it stays there, but NOT durable, even with wait_durable (lost at a
  // restart; dropped if DRAM evicts it); its next sight writes it to the SSD. Not an error.
  kInDram = 7,
};

struct StoreOptions {
  uint32_t layer_begin = 0;
  uint32_t layer_end = 0;  // 0: all layers
  bool wait_durable = false;
  // cuda mode: the stream that computed the blocks; Store synchronizes it before tuttid copies
  // (tuttid's copy does not order itself after the engine's stream). null: the caller did.
  void* cuda_stream = nullptr;
};

struct RetrieveOutcome {
  Status status;                 // OK, or why the transfer broke (all blocks then failed)
  std::vector<uint32_t> failed;  // indices into the Retrieve's blocks to recompute, sorted
  uint32_t layers_done = 0;      // layers reported landed
};

// One Retrieve in flight. Destroying it waits until the transfer has ended (tuttid must not be
// writing into blocks the engine takes back). It must not outlive its Client.
class Retrieval {
 public:
  ~Retrieval();
  Retrieval(const Retrieval&) = delete;
  Retrieval& operator=(const Retrieval&) = delete;

  // Makes the engine wait until layer `layer` of every non-failed block has landed.
  // host mode: blocks until then; ABORTED (with the reason) if the transfer ended without it.
  // cuda mode: enqueues the wait on `cuda_stream` and returns at once; work enqueued on the
  // stream afterwards runs once the layer is in place (or the transfer has failed).
  // INVALID_ARGUMENT for a layer outside the Retrieve's range or a null stream in cuda mode.
  Status WaitLayer(uint32_t layer, void* cuda_stream = nullptr);

  // Blocks until the transfer has ended; then the outcome. In cuda mode, layers are in place for
  // work enqueued after WaitLayer, not necessarily for the host before the stream gets there.
  const RetrieveOutcome& Wait();

  uint32_t ticket() const;  // the ready-word ticket (cuda mode)

  struct Rep;
  explicit Retrieval(std::shared_ptr<Rep> rep);

 private:
  std::shared_ptr<Rep> rep_;
};

struct SessionInfo {
  uint64_t session_id = 0;  // 0 while detached or re-attaching
  uint64_t namespace_id = 0;
  uint64_t generation = 0;  // increases at each (re-)attach; 1 after the first
  uint64_t object_bytes = 0;
  uint32_t max_blocks_per_call = 0;
  uint32_t session_ttl_ms = 0;
  bool attached = false;
  MemoryMode mode = MemoryMode::kHost;
};

class Client {
 public:
  // Connects to tuttid at options.socket_path and attaches the engine's memory.
  // INVALID_ARGUMENT for inconsistent options (objects outside the host regions, wrong object
  // count); UNAVAILABLE when tuttid cannot be reached (the message says why) or, in cuda mode, no
  // GPU is usable; otherwise tuttid's answer (e.g. FAILED_PRECONDITION when its pool cannot hold
  // this layout, or cuda memory offered to a host-mode tuttid). The regions and tensors must
  // outlive the Client.
  static Result<std::unique_ptr<Client>> Attach(const AttachOptions& options);
  // Waits for a Retrieve in flight, stops the keep-alive thread and detaches (best effort).
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // How many leading keys of one chain are cached; those are pinned under the returned lease.
  // With prompt_tokens (the whole prompt's length, cached or not), tuttid also advises how many
  // of the hits to load (Lease::load_blocks). UNAVAILABLE while tuttid is unreachable (treat as a
  // miss); INVALID_ARGUMENT for prompt_tokens above 16777216.
  Result<Lease> Lookup(const std::vector<BlockKey>& keys, uint32_t prompt_tokens = 0);

  // Reports measured compute times of this engine's prefills (at most 1024 samples) for tuttid's
  // load-or-recompute model and, with decision_id (Lease::decision_id) and measured_ttft_ms > 0,
  // the time to first token that the prefill after that decision took. INVALID_ARGUMENT naming
  // the field for a bad value (nothing is recorded then); UNAVAILABLE while tuttid is unreachable.
  Result<ComputeReport> ReportCompute(const std::vector<ComputeSample>& samples,
                                      uint64_t decision_id = 0, double measured_ttft_ms = 0);

  // Starts copying layers [layer_begin, layer_end) (layer_end 0: all) of keys[i] into engine block
  // engine_blocks[i]; every key must be under `lease` (the lease ends with the transfer). Returns
  // at once (a background thread reads tuttid's progress); wait per layer with
  // Retrieval::WaitLayer. Waits first for the previous Retrieve of this Client to end; tuttid's
  // refusals (an expired lease: NOT_FOUND) arrive as the Retrieval's outcome. INVALID_ARGUMENT when
  // the spans differ in length; UNAVAILABLE when the lease is from before a re-attach (look up
  // again).
  Result<std::unique_ptr<Retrieval>> Retrieve(const Lease& lease, const std::vector<BlockKey>& keys,
                                              const std::vector<uint32_t>& engine_blocks,
                                              uint32_t layer_begin = 0, uint32_t layer_end = 0);

  // Copies engine block engine_blocks[i] as keys[i]. Returns one outcome per key once the blocks
  // are captured (durable with wait_durable): from then on the engine may overwrite them. In cuda
  // mode Stores of one Client run one at a time (tuttid's per-session rule).
  Result<std::vector<StoreOutcome>> Store(const std::vector<BlockKey>& keys,
                                          const std::vector<uint32_t>& engine_blocks,
                                          const StoreOptions& options = StoreOptions{});

  // Ends a lease that will not be retrieved. A lease from before a re-attach is already gone: OK.
  Status Release(const Lease& lease);

  // Detaches now; later calls fail with FAILED_PRECONDITION. Idempotent.
  Status Detach();

  SessionInfo info() const;
  uint64_t generation() const { return info().generation; }

  struct Rep;

 private:
  explicit Client(std::unique_ptr<Rep> rep);
  std::unique_ptr<Rep> rep_;
};

}  // namespace tutti::client

#endif  // TUTTI_CLIENT_H_

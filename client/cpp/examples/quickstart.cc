// tutti quick start in C++ (host mode): attach a paged KV cache in shared memory to tuttid, store
// two blocks, look them up by their token hashes, and load them layer by layer into other blocks.
//
//   bazel build //client/cpp:quickstart && bazel-bin/client/cpp/quickstart SOCKET
//
// In cuda mode: options.mode = MemoryMode::kCuda, options.cuda_device = 0, objects point into
// device memory, and WaitLayer(layer, stream) enqueues the wait on the engine's stream.
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "tutti/client.h"

using namespace tutti::client;

int main(int argc, char** argv) {
  // The engine's KV cache: 4 layers, vLLM's fused layout [2, blocks, 16, 8, 128] per layer,
  // bf16 (2 bytes), 32 blocks, in shared memory.
  const KvLayout layout{4, 8, 128, 2, 16, KvFormat::kFused};
  const uint32_t num_blocks = 32;
  const uint64_t obj = layout.object_bytes();  // 32 KiB
  auto shm = SharedMemory::Create("quickstart", uint64_t{layout.num_layers} * 2 * num_blocks * obj);
  if (!shm.ok()) return std::fprintf(stderr, "%s\n", shm.status().ToString().c_str()), 1;
  uint8_t* base = (*shm)->data();
  auto object = [&](uint32_t block, uint32_t layer, uint32_t part) {
    return base + ((uint64_t{layer} * 2 + part) * num_blocks + block) * obj;
  };

  AttachOptions options;
  if (argc > 1) options.socket_path = argv[1];
  options.engine_id = "quickstart-cpp";
  options.ns.model_id = "quickstart-model";
  options.ns.layout = layout;
  options.num_blocks = num_blocks;
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    for (uint32_t p = 0; p < 2; ++p) options.objects.push_back({object(0, l, p), obj});
  }
  options.host_regions.push_back(RegionOf(**shm));
  auto client = Client::Attach(options);
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;

  // 40 tokens: 2 full blocks. "Compute" their KV into blocks 0 and 1 and store them.
  std::vector<int32_t> tokens(40);
  std::iota(tokens.begin(), tokens.end(), 1000);
  const std::vector<BlockKey> keys = ChainKeys(tokens.data(), tokens.size(), layout.block_tokens);
  for (uint32_t b = 0; b < 2; ++b) {
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      for (uint32_t p = 0; p < 2; ++p) std::memset(object(b, l, p), 1 + b + 2 * l + p, obj);
    }
  }
  StoreOptions store;
  store.wait_durable = true;
  auto stored = (*client)->Store(keys, {0, 1}, store);
  if (!stored.ok()) return std::fprintf(stderr, "%s\n", stored.status().ToString().c_str()), 1;

  // Look up and load into blocks 10 and 11, layer by layer.
  auto lease = (*client)->Lookup(keys);
  if (!lease.ok()) return std::fprintf(stderr, "%s\n", lease.status().ToString().c_str()), 1;
  std::printf("lookup: %u of %zu blocks cached\n", lease->hits, keys.size());
  const std::vector<BlockKey> hit(keys.begin(), keys.begin() + lease->hits);
  auto retrieval = (*client)->Retrieve(*lease, hit, {10, 11});
  if (!retrieval.ok())
    return std::fprintf(stderr, "%s\n", retrieval.status().ToString().c_str()), 1;
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    Status s = (*retrieval)->WaitLayer(l);  // host mode: blocks until layer l has landed
    if (!s.ok()) std::fprintf(stderr, "layer %u: %s\n", l, s.ToString().c_str());
    // ... here the engine would run layer l's attention over blocks 10 and 11
  }
  const RetrieveOutcome& outcome = (*retrieval)->Wait();
  if (!outcome.status.ok() || !outcome.failed.empty()) {
    std::fprintf(stderr, "recompute %zu blocks: %s\n", outcome.failed.size(),
                 outcome.status.ToString().c_str());
    return 1;
  }
  for (uint32_t b = 0; b < 2; ++b) {
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      for (uint32_t p = 0; p < 2; ++p) {
        if (std::memcmp(object(10 + b, l, p), object(b, l, p), obj) != 0) {
          return std::fprintf(stderr, "block %u layer %u differs\n", 10 + b, l), 1;
        }
      }
    }
  }
  std::printf("blocks 10-11 hold exactly what blocks 0-1 held\n");
  return (*client)->Detach().ok() ? 0 : 1;
}

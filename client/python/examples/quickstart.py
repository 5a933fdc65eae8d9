"""tutti quick start (host mode): attach a paged KV cache in shared memory to tuttid, store two
blocks, look them up by their token hashes, and load them layer by layer into other blocks.

    PYTHONPATH=bazel-bin/client/python/site python3 client/python/examples/quickstart.py SOCKET

In cuda mode the only differences: the cache is a CUDA tensor, attach takes cuda_device=0 instead
of host_regions, and wait_layer(layer) enqueues a wait on torch's current stream (it returns at
once; the kernels you enqueue after it run once the layer has landed).
"""

import sys

import torch

import tutti

socket = sys.argv[1] if len(sys.argv) > 1 else tutti.DEFAULT_SOCKET

# The engine's KV cache: 4 layers, vLLM's fused layout [2, blocks, 16 tokens, 8 heads, 128] per
# layer, bf16, 32 blocks, in shared memory that tuttid maps.
layout = tutti.KvLayout(num_layers=4, kv_heads=8, head_dim=128, dtype_bytes=2, block_tokens=16)
ns = tutti.Namespace(model_id="quickstart-model", layout=layout)
num_blocks = 32
shm = tutti.SharedMemory(tutti.cache_bytes(layout, num_blocks))
cache, per_layer = tutti.host_cache_tensor(layout, num_blocks, torch.bfloat16, shm)

client = tutti.Client.attach(ns, num_blocks, tutti.objects_from_tensors(layout, per_layer),
                             host_regions=[shm.region()], socket_path=socket,
                             engine_id="quickstart")
print("attached:", client.info)

# A prompt of 40 tokens has 2 full blocks; the same tokens give the same keys everywhere.
tokens = list(range(1000, 1040))
keys = tutti.chain_keys(tokens, layout.block_tokens)

# "Compute" their KV into engine blocks 0 and 1, and store them.
cache[:, :, 0:2] = torch.randn(4, 2, 2, 16, 8, 128).to(torch.bfloat16)
print("store:", client.store(keys, [0, 1], wait_durable=True))

# Later (another request, another process, after a restart): look up and load into blocks 10, 11.
lease = client.lookup(keys)
print("lookup: %d of %d blocks cached" % (lease.hits, len(keys)))
r = client.retrieve(lease, keys[:lease.hits], [10, 11])
for layer in range(layout.num_layers):
    r.wait_layer(layer)  # blocks until layer `layer` of both blocks has landed
    # ... here the engine would run layer `layer`'s attention over blocks 10 and 11
outcome = r.wait()
print("retrieve:", outcome)
assert outcome.ok and not outcome.failed  # else: recompute the blocks in outcome.failed
assert torch.equal(cache[:, :, 10:12], cache[:, :, 0:2])
print("blocks 10-11 hold exactly what blocks 0-1 held")
client.detach()

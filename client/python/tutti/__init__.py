"""tutti: attach an inference engine's paged KV cache to tuttid (an SSD-backed KV cache daemon),
look up cached prefixes, load them layer by layer into the engine's own blocks, store new ones.

    import tutti
    layout = tutti.KvLayout(num_layers=32, kv_heads=8, head_dim=128, dtype_bytes=2,
                            block_tokens=16, format="fused")
    ns = tutti.Namespace(model_id="meta-llama/Meta-Llama-3-8B", layout=layout)
    client = tutti.Client.attach(ns, num_blocks, tutti.objects_from_tensors(layout, kv_caches),
                                 cuda_device=0)            # or host_regions=[shm.region()]
    keys = tutti.chain_keys(token_ids, layout.block_tokens)
    lease = client.lookup(keys, prompt_tokens=len(token_ids))
    r = client.retrieve(lease, keys[:lease.load_blocks], my_blocks)  # compute the rest
    for layer in range(layout.num_layers):
        r.wait_layer(layer)                                # then run the layer's attention
    failed = r.wait().failed                               # recompute these blocks

See docs/clients.md.
"""

from tutti._calls import Timeouts
from tutti._events import BlockEvent, EventBatch
from tutti._hash import HASH_SCHEME, chain_keys
from tutti._shm import HostRegion, SharedMemory
from tutti.errors import (DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound,
                          PermissionDenied, ResourceExhausted, TuttiError, Unavailable)
from tutti.layout import (KvLayout, Namespace, ObjectTensor, cache_bytes, host_cache_tensor,
                          objects_from_tensors)

try:
    from tutti._version import __version__  # tuttid's version (version.bzl)
    from tutti.client import (DEFAULT_SOCKET, Client, ComputeReport, ComputeSample, Lease,
                              RetrieveOutcome, Retrieval)
except ImportError as _e:  # the generated code is missing (a source checkout)
    if "tutti.v1" not in str(_e) and "kvcache_pb2" not in str(_e) and "_version" not in str(_e):
        raise
    raise ImportError("tutti: the generated protobuf/gRPC modules are missing (%s); use the "
                      "package built by `bazel build //client/python:tutti` "
                      "(PYTHONPATH=bazel-bin/client/python/site), install the wheel "
                      "(`bazel build //client/python:wheel`, docs/vllm.md) or run "
                      "client/python/make_site.sh DIR" % _e) from None

__all__ = [
    "HASH_SCHEME", "chain_keys", "HostRegion", "SharedMemory", "TuttiError", "Unavailable",
    "DeadlineExceeded", "NotFound", "InvalidArgument", "FailedPrecondition", "ResourceExhausted",
    "PermissionDenied", "KvLayout", "Namespace", "ObjectTensor", "cache_bytes",
    "host_cache_tensor", "objects_from_tensors", "DEFAULT_SOCKET", "Client", "Lease",
    "RetrieveOutcome", "Retrieval", "Timeouts", "ComputeSample", "ComputeReport", "BlockEvent",
    "EventBatch", "__version__",
]

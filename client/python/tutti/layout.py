"""The engine's KV-cache shape and where each block's objects live in its memory.

A block's objects are (layer, part) pairs, layer-major: parts are K and V ("fused": vLLM's one
tensor per layer of shape [2, num_blocks, block_tokens, kv_heads, head_dim]; "separate": a K and a
V tensor per layer, each [num_blocks, ...]) or one latent ("mla"). Object (layer l, part p) of
engine block b lives at objects[l * parts + p].base + b * block_stride and is object_bytes long.
"""

from dataclasses import dataclass
from typing import List, Sequence, Tuple

from tutti._hash import HASH_SCHEME

FORMATS = {"separate": 1, "fused": 2, "mla": 3, "packed": 4}


@dataclass(frozen=True)
class KvLayout:
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_tokens: int
    format: str = "fused"

    @property
    def parts(self) -> int:
        return 1 if self.format in ("mla", "packed") else 2

    @property
    def object_bytes(self) -> int:
        return self.block_tokens * self.kv_heads * self.head_dim * self.dtype_bytes

    def check(self):
        if self.format not in FORMATS:
            raise ValueError("format must be one of %s" % sorted(FORMATS))
        for name in ("num_layers", "kv_heads", "head_dim", "dtype_bytes", "block_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError("%s must be at least 1" % name)


@dataclass(frozen=True)
class Namespace:
    """Keys never cross namespaces: engines share blocks only when every field is equal."""
    model_id: str
    layout: KvLayout
    tp_rank: int = 0
    tp_size: int = 1
    hash_scheme: str = HASH_SCHEME


@dataclass(frozen=True)
class ObjectTensor:
    base: int          # address of block 0's object
    block_stride: int  # bytes from one block's object to the next


def objects_from_tensors(layout: KvLayout, kv_caches: Sequence) -> List[ObjectTensor]:
    """Object placements from torch tensors, one entry of `kv_caches` per layer:
    fused: a tensor [2, num_blocks, ...]; separate: a pair (k, v), each [num_blocks, ...];
    mla: a tensor [num_blocks, ...]. Each block's object must be contiguous."""
    if len(kv_caches) != layout.num_layers:
        raise ValueError("kv_caches: %d layers, the layout has %d" % (len(kv_caches),
                                                                      layout.num_layers))
    out = []
    for layer, t in enumerate(kv_caches):
        if layout.format == "fused":
            parts = [t[0], t[1]]
        elif layout.format == "separate":
            parts = list(t)
        else:
            parts = [t]
        if len(parts) != layout.parts:
            raise ValueError("layer %d: %d parts, want %d" % (layer, len(parts), layout.parts))
        for p in parts:
            if p[0].numel() * p.element_size() != layout.object_bytes or not p[0].is_contiguous():
                raise ValueError("layer %d: a block's object must be %d contiguous bytes" %
                                 (layer, layout.object_bytes))
            out.append(ObjectTensor(p.data_ptr(), p.stride(0) * p.element_size()))
    return out


def host_cache_tensor(layout: KvLayout, num_blocks: int, dtype, shm):
    """A vLLM-style host cache over shared memory `shm` (at least cache_bytes() long): a tensor
    of shape [num_layers, parts, num_blocks, block_tokens, kv_heads, head_dim] (mla: parts and
    kv_heads are 1), and its per-layer views in the form objects_from_tensors takes."""
    import torch
    shape = (layout.num_layers, layout.parts, num_blocks, layout.block_tokens, layout.kv_heads,
             layout.head_dim)
    numel = 1
    for s in shape:
        numel *= s
    t = torch.frombuffer(shm.buffer, dtype=dtype, count=numel).view(shape)
    if layout.format == "fused":
        per_layer = [t[l] for l in range(layout.num_layers)]
    elif layout.format == "separate":
        per_layer = [(t[l, 0], t[l, 1]) for l in range(layout.num_layers)]
    else:
        per_layer = [t[l, 0] for l in range(layout.num_layers)]
    return t, per_layer


def cache_bytes(layout: KvLayout, num_blocks: int) -> int:
    return layout.num_layers * layout.parts * num_blocks * layout.object_bytes


Regions = List[Tuple[str, int, int]]

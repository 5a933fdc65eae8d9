"""The KV cache a fake vLLM worker allocates, the way current vLLM does it: one cross-layer tensor,
logically [layers, blocks, heads, tokens, content] with K and V packed in content (2*head_size),
laid out in memory in a chosen physical order, and handed to the connector as one view per layer
([blocks, heads, tokens, content], strided as the physical order makes it).

Physical orders are named by the logical dimensions outermost first: L (layers), B (blocks),
H (kv heads), N (tokens of a block), C (content). "LBNHC" (vLLM's default: a block's tokens
outside its heads) and "LBHNC" keep each (layer, block) contiguous; "BLNHC" does too (a block's
layers adjacent); "LHBNC" does not (a layer's heads are spread over the blocks), which a connector
that needs contiguous (layer, block) objects must refuse.

Host mode: the memory is a tutti.SharedMemory region (a memfd), so that tuttid can map it; the
caller registers it (tutti.vllm.register_host_memory) before register_kv_caches. The region must
outlive every view; close() drops the views, then the region.
"""

from dataclasses import dataclass

import torch

LOGICAL = "LBHNC"
DEFAULT_ORDER = "LBNHC"


def layer_name(layer: int) -> str:
    """The attention layer's name in a Llama-architecture vLLM model."""
    return "model.layers.%d.self_attn.attn" % layer


@dataclass(frozen=True)
class CacheGeometry:
    num_layers: int
    num_blocks: int
    num_kv_heads: int
    block_size: int
    head_size: int
    dtype: torch.dtype = torch.float32
    order: str = DEFAULT_ORDER

    @property
    def logical_shape(self):
        return (self.num_layers, self.num_blocks, self.num_kv_heads, self.block_size,
                2 * self.head_size)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.logical_shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def check(self):
        if sorted(self.order) != sorted(LOGICAL):
            raise ValueError("order %r: a permutation of %s expected" % (self.order, LOGICAL))


class KvCache:
    """The cross-layer cache of one worker (one TP rank) and its per-layer views.

    `tensor` is the logical [L, B, H, N, C] view; `layers` maps each layer name to its
    [B, H, N, C] view (what register_kv_caches receives). Hybrid (`groups` KV cache groups):
    as vLLM allocates it, slot i of L is shared by model layer i * groups + g of every group g
    (the groups' block ids never overlap), so there are L * groups layer names. Not
    thread-safe."""

    def __init__(self, geometry: CacheGeometry, host: bool = True, device=None, groups: int = 1):
        geometry.check()
        self.geometry = geometry
        self.shm = None
        if device is not None:  # cuda mode: device memory, as vLLM allocates it
            flat = torch.zeros(geometry.numel, dtype=geometry.dtype, device=device)
        elif host:
            import tutti  # the host-mode region tuttid can map
            self.shm = tutti.SharedMemory(geometry.nbytes, prefix="fakevllm-kv")
            flat = torch.frombuffer(self.shm.buffer, dtype=geometry.dtype, count=geometry.numel)
        else:
            flat = torch.zeros(geometry.numel, dtype=geometry.dtype)
        physical_shape = [geometry.logical_shape[LOGICAL.index(d)] for d in geometry.order]
        physical = flat.view(physical_shape)
        # Permute the physical tensor back to the logical dimension order.
        self.tensor = physical.permute([geometry.order.index(d) for d in LOGICAL])
        self.layers = {layer_name(i): self.tensor[i // groups]
                       for i in range(geometry.num_layers * groups)}

    def poison(self, value: float = -7.0):
        """Fills every block but the null block 0 with `value` (what no KV function yields)."""
        self.tensor[:, 1:].fill_(value)

    def close(self):
        self.layers = None
        self.tensor = None
        if self.shm is not None:
            self.shm.close()
            self.shm = None

"""The KV cache specs vLLM gives connectors (vllm/v1/kv_cache_interface.py): fields only."""
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int
    dtype: Any


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    sliding_window: Any = None
    attention_chunk_size: Any = None


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    cache_dtype_str: Any = None


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int = 0


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """A state-space layer's state (conv and SSM states): one per request, not KV per token."""
    shapes: tuple = ()
    dtypes: tuple = ()
    page_size_padded: Any = None
    mamba_type: str = "mamba2"
    num_speculative_blocks: int = 0


@dataclass
class KVCacheTensor:
    size: int
    shared_by: list


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list = field(default_factory=list)
    kv_cache_groups: list = field(default_factory=list)

"""vLLM's KV cache events (vllm/distributed/kv_events.py; msgspec Structs there, dataclasses here,
with the same fields and defaults)."""
from dataclasses import dataclass
from typing import Any, Optional, Union

ExternalBlockHash = Union[bytes, int]
MEDIUM_GPU = "GPU"


class KVCacheEvent:
    """Base class for all KV cache-related events."""


@dataclass(frozen=True)
class BlockStored(KVCacheEvent):
    block_hashes: list
    parent_block_hash: Optional[Any]
    token_ids: list
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None  # "LOCAL" | "REMOTE" (vllm#48281)

    def __hash__(self):
        return hash((tuple(self.block_hashes), self.parent_block_hash, tuple(self.token_ids),
                     self.block_size, self.lora_id, self.medium))


@dataclass(frozen=True)
class BlockRemoved(KVCacheEvent):
    block_hashes: list
    medium: Optional[str]
    group_idx: Optional[int] = None
    locality: Optional[str] = None

    def __hash__(self):
        return hash((tuple(self.block_hashes), self.medium, self.group_idx))


@dataclass(frozen=True)
class AllBlocksCleared(KVCacheEvent):
    pass

"""vLLM's GPU block pool and prefix cache (v1/core/block_pool.py, kv_cache_manager.py), one KV
cache group, as the scheduler uses them:

- Block 0 is the null block and never handed out; blocks 1..num_blocks-1 start in the free queue.
- A full block gets the request's block hash when it is allocated for tokens that complete it
  (the tokens are computed in that same step, or loaded by the connector); a later request whose
  block_hashes match takes it as a local hit (get_computed_blocks), at most num_tokens - 1 tokens.
- free() returns a request's blocks tail first to the end of the free queue (LRU eviction of the
  cached ones); a block taken from the queue loses its hash.
- reset_prefix_cache() drops every hash, only while no block is in use.
- gpu_events: the BlockStored events vLLM's GPU tier publishes as blocks get cached (medium
  "GPU", hashes through maybe_convert_block_hash, each block's extra keys), for tests that join
  them with a connector's events.
Not thread-safe (the scheduler's thread only).
"""

from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

from vllm.distributed.kv_events import MEDIUM_GPU, BlockStored
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys, maybe_convert_block_hash


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_cnt = [0] * num_blocks
        self.block_hash: List[Optional[bytes]] = [None] * num_blocks
        self.free_queue: "OrderedDict[int, None]" = OrderedDict((b, None)
                                                                for b in range(1, num_blocks))
        self.cached: Dict[bytes, int] = {}
        self.req_blocks: Dict[str, List[int]] = {}
        self.num_cached_blocks: Dict[str, int] = {}
        self.gpu_events: List[BlockStored] = []

    # --- prefix cache ---
    def get_computed_blocks(self, request) -> Tuple[List[int], int]:
        """The longest run of cached blocks matching the request's block hashes, and its
        tokens; the last token is always recomputed (vLLM's max_cache_hit_length)."""
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for h in request.block_hashes[:max_blocks]:
            b = self.cached.get(h)
            if b is None:
                break
            hits.append(b)
        return hits, len(hits) * self.block_size

    def reset_prefix_cache(self) -> bool:
        if any(self.ref_cnt[1:]):
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        return True

    # --- allocation ---
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_blocks(self, req_id: str) -> KVCacheBlocks:
        return KVCacheBlocks((list(self.req_blocks.get(req_id, [])),))

    def get_block_ids(self, req_id: str):
        return (list(self.req_blocks.get(req_id, [])),)

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[List[int]] = None,
                       num_external_computed_tokens: int = 0) -> Optional[KVCacheBlocks]:
        """Blocks for the request's computed tokens plus num_new_tokens: takes the local hits,
        allocates the rest; returns the newly allocated blocks, or None (nothing changed) when
        the free queue cannot supply them."""
        new_computed_blocks = list(new_computed_blocks or [])
        blocks = self.req_blocks.setdefault(request.request_id, [])
        num_computed = (request.num_computed_tokens + num_new_computed_tokens +
                        num_external_computed_tokens)
        need = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new = need - len(blocks) - len(new_computed_blocks)
        evictable_hits = sum(1 for b in new_computed_blocks if self.ref_cnt[b] == 0)
        if num_new > self.num_free_blocks - evictable_hits:
            if not blocks:
                del self.req_blocks[request.request_id]
            return None
        for b in new_computed_blocks:
            if self.ref_cnt[b] == 0:
                del self.free_queue[b]
            self.ref_cnt[b] += 1
        blocks.extend(new_computed_blocks)
        fresh = [self._pop_free() for _ in range(max(num_new, 0))]
        blocks.extend(fresh)
        self._cache_full_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks((fresh,))

    def _pop_free(self) -> int:
        b, _ = self.free_queue.popitem(last=False)
        h = self.block_hash[b]
        if h is not None:
            self.block_hash[b] = None
            if self.cached.get(h) == b:
                del self.cached[h]
        self.ref_cnt[b] = 1
        return b

    def _cache_full_blocks(self, request, num_tokens: int):
        blocks = self.req_blocks[request.request_id]
        done = self.num_cached_blocks.get(request.request_id, 0)
        full = min(num_tokens // self.block_size, len(request.block_hashes))
        for i in range(done, full):
            b, h = blocks[i], request.block_hashes[i]
            if self.block_hash[b] is None:
                self.block_hash[b] = h
                self.cached.setdefault(h, b)
        self.num_cached_blocks[request.request_id] = max(done, full)
        if full > done:
            self._stored_event(request, done, full)

    def _stored_event(self, request, done, full):
        bs, hashes, lora = self.block_size, request.block_hashes, request.lora_request
        extra, mm_idx = [], 0
        for i in range(done, full):
            keys, mm_idx = generate_block_hash_extra_keys(request, i * bs, (i + 1) * bs, mm_idx)
            extra.append(keys)
        self.gpu_events.append(BlockStored(
            block_hashes=[maybe_convert_block_hash(h) for h in hashes[done:full]],
            parent_block_hash=maybe_convert_block_hash(hashes[done - 1]) if done else None,
            token_ids=list(request.all_token_ids[done * bs:full * bs]), block_size=bs,
            lora_id=lora.lora_int_id if lora else None, medium=MEDIUM_GPU,
            lora_name=lora.lora_name if lora else None, extra_keys=extra))

    def free(self, req_id: str):
        blocks = self.req_blocks.pop(req_id, [])
        self.num_cached_blocks.pop(req_id, None)
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free_queue[b] = None

"""vLLM's GPU block pool and prefix cache (v1/core/block_pool.py, kv_cache_manager.py), as the
scheduler uses them, with one or several KV cache groups (vLLM's hybrid KV cache manager):

- Block 0 is the null block and never handed out; blocks 1..num_blocks-1 start in the free queue.
- A full block gets the request's block hash when it is allocated for tokens that complete it
  (the tokens are computed in that same step, or loaded by the connector); a later request whose
  block_hashes match takes it as a local hit (get_computed_blocks), at most num_tokens - 1 tokens.
- free() returns a request's blocks tail first to the end of the free queue (LRU eviction of the
  cached ones); a block taken from the queue loses its hash.
- reset_prefix_cache() drops every hash, only while no block is in use.
- Several groups (windows: each group's sliding window in tokens, None for full attention): one
  block id space and free queue for all (as vLLM's one BlockPool), a block table and a prefix
  cache per group (hashes per group). A sliding group's blocks outside the window are freed and
  replaced by the null block: with c tokens computed it skips max(0, c - W + 1) tokens
  (get_num_skipped_tokens), at allocation (local hits and the connector's external tokens
  included: allocate_new_computed_blocks pads the skipped blocks with nulls) and on every later
  allocate_slots (remove_skipped_blocks). A local hit is the longest prefix every group can
  serve: full groups all its blocks, sliding groups ceil((W - 1) / block_size) blocks before it.
- gpu_events: the BlockStored events vLLM's GPU tier publishes as blocks get cached (medium
  "GPU", hashes through maybe_convert_block_hash, each block's extra keys), for tests that join
  them with a connector's events.
Not thread-safe (the scheduler's thread only).
"""

from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

from vllm.distributed.kv_events import MEDIUM_GPU, BlockStored
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys, maybe_convert_block_hash


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, windows: Optional[Sequence] = None):
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is the null block)")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.windows = list(windows) if windows else [None]
        self.ref_cnt = [0] * num_blocks
        self.block_hash: List[Optional[tuple]] = [None] * num_blocks  # (group, hash)
        self.free_queue: "OrderedDict[int, None]" = OrderedDict((b, None)
                                                                for b in range(1, num_blocks))
        self.cached: Dict[tuple, int] = {}  # (group, hash) -> block
        self.req_blocks: Dict[str, List[List[int]]] = {}
        self.num_cached_blocks: Dict[str, int] = {}
        self.gpu_events: List[BlockStored] = []

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    def _window_blocks(self, g) -> Optional[int]:
        w = self.windows[g]
        return None if w is None else max(-(-(w - 1) // self.block_size), 0)

    def _skipped(self, g, num_computed_tokens) -> int:
        w = self.windows[g]
        return 0 if w is None else max(0, num_computed_tokens - w + 1) // self.block_size

    # --- prefix cache ---
    def get_computed_blocks(self, request) -> Tuple[List[List[int]], int]:
        """Per group, the blocks of the longest prefix every group has cached (nulls where a
        sliding group needs none), and its tokens; the last token is always recomputed (vLLM's
        max_cache_hit_length)."""
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = request.block_hashes[:max_blocks]
        k = len(hashes)
        for g, w in enumerate(self.windows):
            if w is None:
                n = 0
                while n < k and (g, hashes[n]) in self.cached:
                    n += 1
                k = n
        while k > 0:
            ok = True
            for g in range(self.num_groups):
                w = self._window_blocks(g)
                if w is None:
                    continue
                if not all((g, hashes[i]) in self.cached for i in range(max(0, k - w), k)):
                    ok = False
                    break
            if ok:
                break
            k -= 1
        out = []
        for g in range(self.num_groups):
            w = self._window_blocks(g)
            lo = 0 if w is None else max(0, k - w)
            out.append([0] * lo + [self.cached[(g, hashes[i])] for i in range(lo, k)])
        return out, k * self.block_size

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
        return KVCacheBlocks(self.get_block_ids(req_id))

    def get_block_ids(self, req_id: str):
        blocks = self.req_blocks.get(req_id)
        if blocks is None:
            return tuple([] for _ in self.windows)
        return tuple(list(g) for g in blocks)

    def _release(self, b):
        if b == 0:
            return
        self.ref_cnt[b] -= 1
        if self.ref_cnt[b] == 0:
            self.free_queue[b] = None

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks=None,
                       num_external_computed_tokens: int = 0) -> Optional[KVCacheBlocks]:
        """Blocks for the request's computed tokens plus num_new_tokens: takes the local hits
        (per group: new_computed_blocks[g]), pads a sliding group's skipped blocks with nulls,
        allocates the rest; returns the newly allocated blocks per group, or None (nothing but
        the freeing of skipped blocks changed) when the free queue cannot supply them."""
        G = self.num_groups
        if new_computed_blocks and not isinstance(new_computed_blocks[0], (list, tuple)):
            new_computed_blocks = [new_computed_blocks]  # one group: a plain list of blocks
        new_computed = [list(g) for g in (new_computed_blocks or [[] for _ in range(G)])]
        req_id = request.request_id
        is_new = req_id not in self.req_blocks
        blocks = self.req_blocks.setdefault(req_id, [[] for _ in range(G)])
        num_computed = (request.num_computed_tokens + num_new_computed_tokens +
                        num_external_computed_tokens)
        if not is_new:  # remove_skipped_blocks
            for g in range(G):
                for i in range(min(self._skipped(g, num_computed), len(blocks[g]))):
                    if blocks[g][i] != 0:
                        self._release(blocks[g][i])
                        blocks[g][i] = 0
        need = -(-(num_computed + num_new_tokens) // self.block_size)
        plan = []  # per group: (hits to take, nulls to pad, new blocks)
        for g in range(G):
            if is_new:
                skip = self._skipped(g, num_computed)
                hits = new_computed[g][skip:]  # nulls stay nulls (not counted)
                pad = skip
                have = pad + len(hits)
            else:
                hits, pad, have = [], 0, len(blocks[g])
            plan.append((hits, pad, max(need - have, 0)))
        takes = [b for hits, _, _ in plan for b in hits]
        evictable_hits = sum(1 for b in set(takes) if b != 0 and self.ref_cnt[b] == 0)
        if sum(n for _, _, n in plan) > self.num_free_blocks - evictable_hits:
            if is_new:
                del self.req_blocks[req_id]
            return None
        fresh_all = []
        for g, (hits, pad, n) in enumerate(plan):
            blocks[g].extend([0] * pad)
            for b in hits:
                if b == 0:
                    continue
                if self.ref_cnt[b] == 0:
                    del self.free_queue[b]
                self.ref_cnt[b] += 1
            blocks[g].extend(hits)
            fresh = [self._pop_free() for _ in range(n)]
            blocks[g].extend(fresh)
            fresh_all.append(fresh)
        self._cache_full_blocks(request, min(num_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks(tuple(fresh_all))

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
        for g in range(self.num_groups):
            for i in range(done, min(full, len(blocks[g]))):
                b, h = blocks[g][i], (g, request.block_hashes[i])
                if b != 0 and self.block_hash[b] is None:
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
        groups = self.req_blocks.pop(req_id, [])
        self.num_cached_blocks.pop(req_id, None)
        for blocks in groups:
            for b in reversed(blocks):
                self._release(b)

"""A reference inference engine over tutti: paged KV blocks, a free list, and prefill with prefix
reuse through tuttid, the way an engine (vLLM, SGLang) would integrate the client library.

prefill(tokens):
  1. keys = chain_keys(tokens) of the full blocks (at most (len - 1) // block_tokens of them, so
     at least one token is computed and gives logits);
  2. lease = lookup(keys): the leading `hits` blocks are in tuttid;
  3. retrieve those blocks into this request's own (fresh) blocks; the model computes only the
     tokens after them, waiting per layer (before_layer -> Retrieval.wait_layer) so layer l+1
     loads while layer l computes;
  4. if any loaded block failed (or tuttid broke off), recompute the whole request;
  5. store the request's full blocks that tuttid does not have yet.
The request's blocks are returned to the free list (poisoned with NaN, so a block read before it
is rewritten shows up in the logits).
"""

import time
from dataclasses import dataclass, field
from typing import List, Optional

import torch

import tutti


@dataclass
class PrefillResult:
    logits: torch.Tensor
    hits: int = 0                 # blocks loaded from tuttid
    computed_tokens: int = 0      # tokens the model computed
    recomputed: bool = False      # a load failed and the request was recomputed
    failed: List[int] = field(default_factory=list)
    stored: List[str] = field(default_factory=list)
    block_table: List[int] = field(default_factory=list)
    seconds: float = 0.0


class BlockPool:
    def __init__(self, num_blocks):
        self.free = list(range(num_blocks))

    def allocate(self, n):
        if n > len(self.free):
            raise RuntimeError("out of KV blocks")
        out, self.free = self.free[:n], self.free[n:]
        return out

    def release(self, blocks):
        self.free.extend(blocks)


class Engine:
    """`cache`: the model's paged cache tensor [layers, 2, blocks, tokens, heads, dim] (host
    shared memory in host mode, device memory in cuda mode); `client`: an attached tutti.Client
    over that cache, or None for an engine without tuttid."""

    def __init__(self, model, cache, client: Optional["tutti.Client"] = None, poison=True,
                 store_batch=64):
        self.model = model
        self.cache = cache
        self.client = client
        self.bt = model.block_tokens
        self.pool = BlockPool(cache.shape[2])
        self.poison = poison
        self.store_batch = store_batch
        self.max_keys = client.info["max_blocks_per_call"] if client is not None else 0

    def _sync(self):
        if self.cache.is_cuda:
            torch.cuda.synchronize()

    def free(self, blocks):
        if self.poison:
            self.cache[:, :, blocks] = float("nan")
        self.pool.release(blocks)

    def prefill(self, tokens, use_cache=True, store=True, store_limit=None, wait_durable=True,
                hook=None, keep_blocks=False) -> PrefillResult:
        """Logits of every token after the loaded prefix. store_limit: store at most that many
        leading blocks (to make a partly cached prefix). hook(layer): called before each layer's
        wait (tests use it to kill tuttid mid-load)."""
        t0 = time.perf_counter()
        tokens = list(tokens)
        keys = tutti.chain_keys(tokens, self.bt)
        blocks = self.pool.allocate((len(tokens) + self.bt - 1) // self.bt)
        res = PrefillResult(logits=None, block_table=blocks)
        hits, retrieval = 0, None
        if use_cache and self.client is not None:
            usable = min((len(tokens) - 1) // self.bt, self.max_keys)
            hits, retrieval = self._start_load(keys[:usable], blocks)

        def before_layer(layer):
            if hook is not None:
                hook(layer)
            if retrieval is not None:
                retrieval.wait_layer(layer, None if not self.cache.is_cuda else
                                     torch.cuda.current_stream())

        start = hits * self.bt
        try:
            res.logits = self.model.forward(tokens[start:], start, blocks, self.cache,
                                            before_layer)
        except tutti.TuttiError:  # host mode: the load broke off before a layer landed
            pass
        if retrieval is not None:
            out = retrieval.wait()
            if not out.ok or out.failed:
                res.failed, res.recomputed = out.failed, True
                hits, start = 0, 0
                res.logits = self.model.forward(tokens, 0, blocks, self.cache)
        res.hits, res.computed_tokens = hits, len(tokens) - start
        self._sync()
        res.seconds = time.perf_counter() - t0
        if store and self.client is not None:
            res.stored = self._store(keys, blocks, hits, store_limit, wait_durable)
        if not keep_blocks:
            self.free(blocks)
        return res

    def _start_load(self, keys, blocks):
        if not keys:
            return 0, None
        try:
            lease = self.client.lookup(keys)
        except tutti.Unavailable:
            return 0, None  # tuttid is away: a miss
        if lease.hits == 0:
            return 0, None
        try:
            return lease.hits, self.client.retrieve(lease, keys[:lease.hits], blocks[:lease.hits])
        except tutti.Unavailable:
            return 0, None

    def _store(self, keys, blocks, hits, limit, wait_durable):
        """Stores keys[hits:limit] in batches of store_batch blocks (tuttid's staging is bounded);
        blocks rejected for full staging are retried a few times, then dropped."""
        n = len(keys) if limit is None else min(limit, len(keys))
        stream = torch.cuda.current_stream() if self.cache.is_cuda else None
        outcomes = []
        for begin in range(hits, n, self.store_batch):
            todo = list(range(begin, min(n, begin + self.store_batch)))
            result = {}
            for attempt in range(50):
                try:
                    out = self.client.store([keys[i] for i in todo], [blocks[i] for i in todo],
                                            wait_durable=wait_durable, stream=stream)
                except tutti.Unavailable:
                    out = ["dropped"] * len(todo)
                result.update(zip(todo, out))
                todo = [i for i, o in zip(todo, out) if o == "rejected_full"]
                if not todo:
                    break
                time.sleep(0.02)
            outcomes.extend(result[i] for i in sorted(result))
        return outcomes

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
With decide=True (load or recompute, docs/decision.md) step 2 passes the prompt's length, step 3
retrieves only the first lease.load_blocks blocks (the Retrieve ends the lease's other pins too)
and the model computes every token after them. Every prefill with a client times each layer's
compute (host: perf_counter; cuda: CUDA events; the wait for a layer's load is left out) and
reports it (report_compute: the mean layer time for n new tokens at context T, and the time
outside the layers); a decided prefill also reports its measured TTFT (lookup to logits) so that
tuttid counts its prediction error.
The request's blocks are returned to the free list (poisoned with NaN, so a block read before it
is rewritten shows up in the logits).
"""

import time
from dataclasses import dataclass, field
from typing import List, Optional

import torch

import tutti


class LayerTimer:
    """Per-layer compute time of one forward, the waits for loads left out (llama.forward's
    timer). Host: perf_counter; cuda: events on the current stream (read after a sync)."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.marks = []  # (what, layer, time or event)

    def mark(self, what, layer):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((what, layer, ev))
        else:
            self.marks.append((what, layer, time.perf_counter()))

    def _ms(self, a, b):
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

    def layer_ms(self):
        """Compute ms of each layer: from its start to its wait, and from the wait's end to the
        next layer's start (or the loop's end)."""
        out, begin, resume = [], None, None
        for what, _, t in self.marks:
            if what == "layer":
                if resume is not None:
                    out[-1] += self._ms(resume, t)
                begin = t
            elif what == "wait":
                out.append(self._ms(begin, t))
            elif what == "resume":
                resume = t
            elif what == "end" and resume is not None:
                out[-1] += self._ms(resume, t)
        return out

    def loop_ms(self):
        """From the first layer's start to the last one's end, waits included."""
        return self._ms(self.marks[0][2], self.marks[-1][2])


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
    cached: int = 0               # the lookup's hits (hits <= cached with decide=True)
    decision_id: Optional[int] = None
    predicted_ttft_ms: Optional[float] = None
    predicted_recompute_ms: Optional[float] = None
    predicted_load_all_ms: Optional[float] = None
    ttft_ms: float = 0.0          # lookup to logits (synchronized)
    layer_ms: List[float] = field(default_factory=list)  # compute of each layer, waits left out
    overhead_ms: float = 0.0      # ttft_ms outside the layer loop
    prediction_error: Optional[float] = None  # tuttid's answer to the reported TTFT


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
                hook=None, keep_blocks=False, decide=False, report=True) -> PrefillResult:
        """Logits of every token after the loaded prefix. store_limit: store at most that many
        leading blocks (to make a partly cached prefix). hook(layer): called before each layer's
        wait (tests use it to kill tuttid mid-load). decide: load only the leading blocks tuttid
        advises (lease.load_blocks), compute the rest. report: send the layer timings (and, when
        decided, the TTFT) to tuttid after the prefill."""
        t0 = time.perf_counter()
        tokens = list(tokens)
        keys = tutti.chain_keys(tokens, self.bt)
        blocks = self.pool.allocate((len(tokens) + self.bt - 1) // self.bt)
        res = PrefillResult(logits=None, block_table=blocks)
        hits, retrieval = 0, None
        if use_cache and self.client is not None:
            usable = min((len(tokens) - 1) // self.bt, self.max_keys)
            hits, retrieval = self._start_load(keys[:usable], blocks,
                                               len(tokens) if decide else None, res)
        timer = LayerTimer(self.cache.is_cuda) if self.client is not None else None

        def before_layer(layer):
            if hook is not None:
                hook(layer)
            if retrieval is not None:
                retrieval.wait_layer(layer, None if not self.cache.is_cuda else
                                     torch.cuda.current_stream())

        start = hits * self.bt
        try:
            res.logits = self.model.forward(tokens[start:], start, blocks, self.cache,
                                            before_layer, timer)
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
        res.ttft_ms = res.seconds * 1e3
        if timer is not None and not res.recomputed:
            res.layer_ms = timer.layer_ms()
            res.overhead_ms = max(0.0, res.ttft_ms - timer.loop_ms())
        if store and self.client is not None:
            res.stored = self._store(keys, blocks, hits, store_limit, wait_durable)
        if report and res.layer_ms:
            self._report(res, len(tokens))
        if not keep_blocks:
            self.free(blocks)
        return res

    def _start_load(self, keys, blocks, prompt_tokens, res):
        """Looks up `keys` (with prompt_tokens: asks for advice) and starts loading the blocks to
        load; (blocks loading, Retrieval or None)."""
        if not keys:
            return 0, None
        try:
            lease = self.client.lookup(keys, prompt_tokens=prompt_tokens)
        except tutti.Unavailable:
            return 0, None  # tuttid is away: a miss
        res.cached = lease.hits
        load = lease.hits
        if prompt_tokens is not None:
            load = lease.load_blocks
            res.decision_id = lease.decision_id
            res.predicted_ttft_ms = lease.predicted_ttft_ms
            res.predicted_recompute_ms = lease.predicted_recompute_ms
            res.predicted_load_all_ms = lease.predicted_load_all_ms
        try:
            if load == 0:
                self.client.release(lease)  # a no-op without hits
                return 0, None
            return load, self.client.retrieve(lease, keys[:load], blocks[:load])
        except tutti.Unavailable:
            return 0, None

    def _report(self, res, context_tokens):
        """Sends one ComputeSample (the mean layer time) and, when decided, the measured TTFT."""
        sample = tutti.ComputeSample(res.computed_tokens, context_tokens,
                                     sum(res.layer_ms) / len(res.layer_ms), res.overhead_ms)
        decided = res.decision_id is not None
        try:
            r = self.client.report_compute(
                [sample], decision_id=res.decision_id if decided else None,
                measured_ttft_ms=res.ttft_ms if decided else None)
            res.prediction_error = r.prediction_error
        except tutti.Unavailable:
            pass  # tuttid is away: the sample is lost, nothing else

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

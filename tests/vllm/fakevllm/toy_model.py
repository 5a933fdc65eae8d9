"""A toy decoder with vLLM's attention-layer contract towards a KV connector.

Every token's KV at (position, layer, head, TP rank) is a deterministic function of its token id
(kv_values), so any block the model reads can be checked: per layer, the forward pass
  1. waits for the layer's load (connector.wait_for_layer_load(name)),
  2. writes the scheduled tokens' KV into their slots (vLLM's reshape_and_cache),
  3. reads every context token of every scheduled request through its block table and compares it
     with kv_values (vLLM's attention reads the same slots; the tokens written in this step are
     compared with what was written),
  4. hands the layer to the connector (connector.save_kv_layer(name, kv_layer, attn_metadata)).
A mismatch is recorded per request with the vLLM block id that held it. As in a real model, the
KV a layer writes depends on what the layers before it read: once a request read wrong context
KV at a layer, every later layer writes its scheduled tokens' KV wrong (off by one), so blocks
computed on top of a failed load are wrong too; under TP on every rank (the attention output is
all-reduced over the ranks: here the taint, over vLLM's TP group). The sampled token is a hash
of the token ids the last layer's KV decodes to (content element 0 holds the token id), so a
wrong block also changes the output.

Hybrid models (windows: each KV cache group's sliding window, None for full attention): layer l
is in group l % len(windows) and reads and writes through that group's block table; a
sliding-window layer reads only the tokens its window covers (positions past p - W for the token
at p), so the blocks before it may be freed (null) in that group's table. The sampled token
comes from the last full-attention layer's read (the whole context).
"""

import hashlib
from dataclasses import dataclass, field
from typing import Dict, List, Set

import torch

from fakevllm.kv_cache import KvCache, layer_name

VOCAB = 32000
_MOD = 1000003  # values below 2^20: exact in float32


def kv_values(token_ids: torch.Tensor, positions: torch.Tensor, layer: int, num_heads: int,
              content: int, rank: int) -> torch.Tensor:
    """The KV of tokens [n] at positions [n]: a float32 tensor [n, heads, content]. Element 0 is
    the token id, element 1 the position; the rest mixes (token, position, layer, head, rank)."""
    t = token_ids.to(torch.int64).view(-1, 1, 1)
    p = positions.to(torch.int64).view(-1, 1, 1)
    h = torch.arange(num_heads, dtype=torch.int64).view(1, -1, 1)
    c = torch.arange(content, dtype=torch.int64).view(1, 1, -1)
    v = (t * 2654435761 + p * 40503 + h * 7919 + c * 31337 + layer * 9973 + rank * 104729) % _MOD
    v[:, :, 0:1] = t.expand(-1, num_heads, 1)
    v[:, :, 1:2] = p.expand(-1, num_heads, 1)
    return v.to(torch.float32)


def sample(token_ids: List[int]) -> int:
    """The toy model's next token for a context of token ids."""
    digest = hashlib.sha256(repr(list(token_ids)).encode()).digest()
    return int.from_bytes(digest[:4], "little") % VOCAB


@dataclass
class ScheduledSeq:
    """One request's part of a step, as the model runner prepared it."""
    req_id: str
    token_ids: List[int]      # every token of the request known to the runner
    block_ids: List[List[int]]  # its block table, per KV cache group
    num_computed: int         # context tokens already in the cache
    num_scheduled: int        # tokens computed in this step


@dataclass
class ToyAttentionMetadata:
    """What vLLM hands save_kv_layer as attn_metadata (the fields of its common metadata)."""
    slot_mapping: torch.Tensor       # [num scheduled tokens]: block_id * block_size + offset
    query_start_loc: List[int]
    seq_lens: List[int]
    block_table: List[List[int]]
    num_actual_tokens: int


@dataclass
class StepCheck:
    """Per request, the blocks whose KV was wrong when read (vLLM block ids)."""
    bad_blocks: Dict[str, Set[int]] = field(default_factory=dict)


class ToyAttention:
    """vLLM's Attention layer as connectors see it through forward_context.no_compile_layers:
    layer_name and kv_cache (one tensor per virtual engine)."""

    def __init__(self, name, kv_layer):
        self.layer_name = name
        self.kv_cache = [kv_layer]


def attention_metadata(seqs: List[ScheduledSeq], block_size: int,
                       group: int = 0) -> ToyAttentionMetadata:
    """The metadata of the layers of KV cache group `group` (its block tables)."""
    slots, starts, lens = [], [0], []
    for s in seqs:
        table = s.block_ids[group]
        for pos in range(s.num_computed, s.num_computed + s.num_scheduled):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        starts.append(starts[-1] + s.num_scheduled)
        lens.append(s.num_computed + s.num_scheduled)
    return ToyAttentionMetadata(torch.tensor(slots, dtype=torch.int64), starts, lens,
                                [list(s.block_ids[group]) for s in seqs], len(slots))


def _all_ranks(tainted: Set[str], seqs: List[ScheduledSeq]) -> Set[str]:
    """The requests tainted on any TP rank (every rank runs the same batch)."""
    from vllm.distributed import parallel_state
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return tainted
    import torch.distributed as dist
    flags = torch.tensor([int(s.req_id in tainted) for s in seqs], dtype=torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=parallel_state.get_tp_group().cpu_group)
    return {s.req_id for s, f in zip(seqs, flags.tolist()) if f}


class ToyModel:
    def __init__(self, cache: KvCache, rank: int, windows=None):
        self.cache = cache
        self.rank = rank
        self.windows = tuple(windows) if windows else (None,)
        if all(w is not None for w in self.windows):
            raise ValueError("the toy model samples from a full-attention layer: give one")
        g = cache.geometry
        self.block_size = g.block_size
        self.num_heads = g.num_kv_heads
        self.content = 2 * g.head_size

    def _slots(self, seq: ScheduledSeq, begin: int, end: int, group: int = 0):
        pos = torch.arange(begin, end, dtype=torch.int64)
        table = torch.tensor(seq.block_ids[group], dtype=torch.int64)
        return pos, table[pos // self.block_size], pos % self.block_size

    def _write(self, kv_layer, layer: int, seq: ScheduledSeq, tainted: bool, group: int = 0):
        """Writes the scheduled tokens' KV; `tainted`: an earlier layer read wrong context, so
        this KV is wrong too. Returns what was written ([n, heads, content])."""
        begin, end = seq.num_computed, seq.num_computed + seq.num_scheduled
        pos, blocks, offsets = self._slots(seq, begin, end, group)
        tokens = torch.tensor(seq.token_ids[begin:end], dtype=torch.int64)
        kv = kv_values(tokens, pos, layer, self.num_heads, self.content, self.rank)
        if tainted:
            kv += 1.0
        dev = kv_layer.device
        # [n, heads, content] at (block, :, offset, :)
        kv_layer[blocks.to(dev), :, offsets.to(dev), :] = kv.to(kv_layer.dtype).to(dev)
        return kv

    def _check(self, kv_layer, layer: int, seq: ScheduledSeq, written, check: StepCheck,
               group: int = 0):
        """Reads the request's context (a sliding-window layer: the tokens its window covers
        for the scheduled ones); True if a token before this step's read wrong."""
        begin, end = seq.num_computed, seq.num_computed + seq.num_scheduled
        window = self.windows[group]
        lo = 0 if window is None else max(0, begin - window + 1)
        pos, blocks, offsets = self._slots(seq, lo, end, group)
        tokens = torch.tensor(seq.token_ids[lo:begin], dtype=torch.int64)
        want = torch.cat([kv_values(tokens, pos[:begin - lo], layer, self.num_heads,
                                    self.content, self.rank), written])
        dev = kv_layer.device  # cuda: reading back waits for the stream (its layer waits first)
        got = kv_layer[blocks.to(dev), :, offsets.to(dev), :].cpu()
        wrong = (got != want).flatten(1).any(dim=1)
        if bool(wrong.any()):
            bad = check.bad_blocks.setdefault(seq.req_id, set())
            bad.update(int(b) for b in blocks[wrong].tolist())
        return got, bool(wrong[:begin - lo].any())

    def forward(self, seqs: List[ScheduledSeq], connector, attn_metadata) -> (Dict[str, int],
                                                                              StepCheck):
        """Runs every layer over the scheduled tokens; returns the sampled token of each request
        whose scheduled tokens reach its last known token, and what the reads found wrong."""
        check = StepCheck()
        last_read, tainted = {}, set()
        for layer, (name, kv_layer) in enumerate(self.cache.layers.items()):
            assert name == layer_name(layer)
            group = layer % len(self.windows)
            if connector is not None:
                connector.wait_for_layer_load(name)
            written = {s.req_id: self._write(kv_layer, layer, s, s.req_id in tainted, group)
                       for s in seqs}
            for s in seqs:
                got, wrong = self._check(kv_layer, layer, s, written[s.req_id], check, group)
                if self.windows[group] is None:
                    last_read[s.req_id] = got
                if wrong:
                    tainted.add(s.req_id)
            tainted = _all_ranks(tainted, seqs)
            if connector is not None:
                meta = attn_metadata.get(name) if isinstance(attn_metadata, dict) else \
                    attn_metadata
                connector.save_kv_layer(name, kv_layer, meta)
        sampled = {}
        for s in seqs:
            if s.num_computed + s.num_scheduled == len(s.token_ids):
                decoded = last_read[s.req_id][:, 0, 0].to(torch.int64).tolist()
                sampled[s.req_id] = sample(decoded)
        return sampled, check

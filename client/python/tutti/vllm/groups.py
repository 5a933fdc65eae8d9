"""vLLM's KV cache groups (KVCacheConfig.kv_cache_groups) as the connector serves them, and the
cut of a prefix hit that every group can serve.

A hybrid model (vLLM's hybrid KV cache manager, connectors that implement SupportsHMA) has
several groups, each with its own layers, spec and block table per request:
- "full": FullAttentionSpec (also with sliding_window set: vLLM then keeps every block, as
  without the hybrid manager) and MLAAttentionSpec. A hit of blocks [0, k) needs all k blocks.
- "sliding": SlidingWindowSpec of W tokens. vLLM frees (nulls) a request's blocks outside the
  window: with c tokens computed it skips max(0, c - W + 1) tokens (get_num_skipped_tokens), so
  a hit of blocks [0, k) needs only blocks [k - window_blocks(W), k) (window_blocks =
  ceil((W - 1) / block_size)), and the tokens before them never again.
- Refused (ValueError naming the group): state-space / linear-attention groups (MambaSpec and
  the like: their state at a block boundary is not in any block, so vLLM would have to give the
  connector a state per block boundary), chunked local attention, cross-attention and encoder
  specs, any spec this module does not know, and groups whose block size is not the cache's.

Each group is its own tuttid namespace (tutti.vllm.worker): its layers, its layout, the same
keys (the chain of the request's tokens), so a group's presence is looked up and its blocks are
stored and loaded with its own block ids.

cut(): the largest block k in (local, upper] such that every sliding group holds the blocks of
its window before k that are past the local (GPU) prefix; local when there is none.
"""

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

FULL = "full"
SLIDING = "sliding"
MAX_CUT_ROUNDS = 8  # candidate cuts tried per lookup before it counts as a miss

_FULL_SPECS = ("FullAttentionSpec", "MLAAttentionSpec")
_STATE_SPECS = ("MambaSpec", "LinearAttentionSpec", "ShortConvSpec", "GatedDeltaNetSpec")


@dataclass(frozen=True)
class Group:
    index: int                 # the group's place in KVCacheConfig.kv_cache_groups
    kind: str                  # FULL or SLIDING
    layer_names: Tuple[str, ...]
    spec: object               # vLLM's KVCacheSpec of the group
    window_tokens: int = 0     # SLIDING: the spec's sliding_window
    window_blocks: int = 0     # SLIDING: blocks a hit needs before its cut

    def describe(self) -> str:
        """For messages and namespaces: "full" or "sliding_window=128"."""
        return self.kind if self.kind == FULL else "sliding_window=%d" % self.window_tokens


def window_blocks(window_tokens: int, block_size: int) -> int:
    """Blocks before a cut at a block boundary that a sliding window of `window_tokens` reads:
    ceil((W - 1) / block_size) (vLLM's sliding_window_contiguous_blocks)."""
    return max(-(-(int(window_tokens) - 1) // block_size), 0)


def skipped_blocks(group: Group, computed_tokens: int, block_size: int) -> int:
    """Leading blocks vLLM has freed (nulled) in a sliding group's table once `computed_tokens`
    are computed: max(0, c - W + 1) // block_size tokens' blocks; 0 for a full group."""
    if group.kind != SLIDING:
        return 0
    return max(0, int(computed_tokens) - group.window_tokens + 1) // block_size


def _name(kvg, i):
    names = list(getattr(kvg, "layer_names", []) or [])
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return "KV cache group %d (%s; layers %s)" % (i, type(kvg.kv_cache_spec).__name__, shown)


def group_of(kvg, i: int, block_size: Optional[int]) -> Group:
    """The Group of vLLM's KVCacheGroupSpec `kvg` (index i); raises ValueError for a group the
    connector cannot serve, naming it and saying what would be needed."""
    spec = kvg.kv_cache_spec
    kind = type(spec).__name__
    names = tuple(kvg.layer_names)
    if kind in _STATE_SPECS or "Mamba" in kind or hasattr(spec, "shapes"):
        raise ValueError(
            "%s is a state-space / linear-attention group: TuttiConnector cannot cache it. Its "
            "state after a prefix is one state per request, not KV per block; a prefix hit would "
            "need vLLM to give the connector that state at every block boundary (and to take "
            "one back at the cut), which vLLM's KV connector interface does not do. Run without "
            "the connector, or a model without such layers" % _name(kvg, i))
    if block_size is not None and int(getattr(spec, "block_size", block_size)) != block_size:
        raise ValueError("%s has block size %s, the cache %d; TuttiConnector needs one block "
                         "size for every group" % (_name(kvg, i), spec.block_size, block_size))
    if kind == "SlidingWindowSpec":
        w = int(getattr(spec, "sliding_window", 0) or 0)
        if w < 1:
            raise ValueError("%s: sliding_window %r; a window of at least one token expected" %
                             (_name(kvg, i), w))
        bs = int(spec.block_size)
        return Group(i, SLIDING, names, spec, w, window_blocks(w, bs))
    if kind in _FULL_SPECS:
        if getattr(spec, "attention_chunk_size", None):
            raise ValueError("%s uses chunked local attention (attention_chunk_size %s), which "
                             "TuttiConnector does not serve" % (_name(kvg, i),
                                                                spec.attention_chunk_size))
        return Group(i, FULL, names, spec)
    raise ValueError("%s: TuttiConnector serves full attention (FullAttentionSpec, "
                     "MLAAttentionSpec) and sliding-window attention (SlidingWindowSpec) groups, "
                     "not %s" % (_name(kvg, i), kind))


def groups_of(kv_cache_config, block_size: Optional[int] = None) -> List[Group]:
    """The Groups of vLLM's KVCacheConfig (empty when it has none). Raises ValueError for any
    group the connector cannot serve (group_of) and for a layer in two groups."""
    out, seen = [], {}
    kvgs = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    if block_size is None and kvgs:
        block_size = getattr(kvgs[0].kv_cache_spec, "block_size", None)
        block_size = None if block_size is None else int(block_size)
    for i, kvg in enumerate(kvgs):
        g = group_of(kvg, i, block_size)
        for n in g.layer_names:
            if n in seen:
                raise ValueError("layer %s is in KV cache groups %d and %d" % (n, seen[n], i))
            seen[n] = i
        out.append(g)
    return out


def is_hybrid(groups: Sequence[Group]) -> bool:
    """Whether the groups need the per-group path: several groups, or a sliding one."""
    return len(groups) > 1 or any(g.kind == SLIDING for g in groups)


def cut(local: int, upper: int, windows: Sequence[Tuple[int, int]],
        first_missing: Callable[[int, int, int], int], max_rounds: int = MAX_CUT_ROUNDS) -> int:
    """The largest cut k (blocks) in (local, upper] that every sliding group can serve, else
    `local`. windows: (group, window_blocks) of each sliding group; first_missing(group, begin,
    end): the first block in [begin, end) that group lacks, or `end`. A group serves k when it
    holds blocks [max(local, k - w), k) (below `local` the GPU prefix has them).

    A block m missing in a group rules out every cut in (m, m + w]: the next candidate is m
    itself, so each round moves down past a missing block. After `max_rounds` rounds: `local`
    (a miss; each round costs a Lookup per rank)."""
    k = upper
    rounds = 0
    while k > local:
        if rounds >= max_rounds:
            return local
        rounds += 1
        for g, w in windows:
            begin = max(local, k - w)
            m = first_missing(g, begin, k)
            if m < k:
                k = m
                break
        else:
            return k
    return local


def group_namespace(ns, group: Group, num_groups: int, max_model_id: int = 256):
    """The namespace of one group of a hybrid model: `ns` (the group's layout) with
    "|group=<i>/<n>:<full|sliding_window=W>" appended to its model_id, so that groups (other
    layers, other KV) never share blocks. A lone full-attention group keeps `ns` as it is."""
    import dataclasses
    if num_groups == 1 and group.kind == FULL:
        return ns
    mid = "%s|group=%d/%d:%s" % (ns.model_id, group.index, num_groups, group.describe())
    if len(mid) > max_model_id:
        raise ValueError("namespace model_id %r is %d characters; at most %d (a shorter model "
                         "path?)" % (mid, len(mid), max_model_id))
    return dataclasses.replace(ns, model_id=mid)

"""Admission and eviction policies of the trace cache simulation (trace_sim.py), in pure Python.

A policy owns the cache: a set of blocks of at most `capacity`, ordered by recency (evictions
take the least recently used). The simulation asks it, per request, in the order an engine
drives tuttid:
  lookup(chain)          -> how many leading blocks are cached (they become recently used);
  store(blocks, request) -> which of `blocks` (one Store call: the blocks the engine computed,
                            none of them cached when the call came) are written; the others are
                            declined. Written blocks are inserted, evicting as needed.
tuttid's own rule is StoreAll with chain-order recency: LookupAndPin touches the hits from head
to tail, a Store's blocks are published in call order, and a block already present is answered
"already present" without being touched.

Eviction order ("recency"): "chain" (tuttid today: within a request, the head is used first, so
the tail is the most recent) or "tail_first" (within a request, blocks are touched from the tail
back to the head, so the head is the most recent and a chain loses its tail before its head: a
hit needs the head).
"""

from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Sequence

RECENCIES = ("chain", "tail_first")


@dataclass(frozen=True)
class StoreContext:
    """What tuttid knows when a Store arrives: how far the request's Lookup hit, and the chain."""
    hits: int
    chain_len: int
    partial_tail: bool  # the chain's last block is not full (engines rarely store those)


class LruCache:
    def __init__(self, capacity: int, recency: str = "chain"):
        if capacity <= 0:
            raise ValueError("capacity must be at least 1 block")
        if recency not in RECENCIES:
            raise ValueError("recency must be one of %s" % (RECENCIES,))
        self.capacity = capacity
        self.recency = recency
        self._blocks: "OrderedDict[object, None]" = OrderedDict()
        self.evictions = 0

    def __contains__(self, block):
        return block in self._blocks

    def __len__(self):
        return len(self._blocks)

    def _order(self, blocks):
        return blocks if self.recency == "chain" else list(reversed(blocks))

    def touch(self, blocks: Sequence):
        for b in self._order(blocks):
            self._blocks.move_to_end(b)

    def insert(self, blocks: Sequence):
        """Inserts `blocks` (none cached, at most capacity of them), evicting the LRU ones."""
        for b in self._order(blocks):
            if len(self._blocks) >= self.capacity:
                self._blocks.popitem(last=False)
                self.evictions += 1
            self._blocks[b] = None

    def remove(self, blocks: Sequence):
        for b in blocks:
            del self._blocks[b]

    def victim(self):
        return next(iter(self._blocks)) if self._blocks else None


class Policy:
    """Store-all: every offered block is written (tuttid today, vLLM's file tier, LMCache)."""
    name = "store_all"

    def __init__(self, capacity: int, recency: str = "chain"):
        self.cache = LruCache(capacity, recency)

    def lookup(self, chain: Sequence) -> int:
        hits = 0
        for b in chain:
            if b not in self.cache:
                break
            hits += 1
        self.cache.touch(chain[:hits])
        return hits

    def admit(self, block, ctx: StoreContext, last: bool) -> bool:
        return True

    def store(self, blocks: Sequence, ctx: StoreContext, ends_chain: bool) -> List:
        """The blocks written; `ends_chain`: the call's last block is the chain's last."""
        n = len(blocks)
        written = [b for i, b in enumerate(blocks)
                   if self.admit(b, ctx, ends_chain and i == n - 1)]
        self.cache.insert(written)
        return written


class Ghost:
    """Recently offered blocks: a set bounded to `size` (0: unbounded), oldest dropped first."""

    def __init__(self, size: int = 0):
        self.size = size
        self._seen: "OrderedDict[object, None]" = OrderedDict()

    def seen_before(self, block) -> bool:
        """Whether `block` was offered before (and still remembered); remembers it now."""
        hit = block in self._seen
        if hit:
            self._seen.move_to_end(block)
        else:
            self._seen[block] = None
            if self.size and len(self._seen) > self.size:
                self._seen.popitem(last=False)
        return hit


class SecondSight(Policy):
    """Write on second sight (SGLang HiCache's selective write): a block is written the second
    time it is offered; the ghost remembers every offered block (unbounded) unless bounded."""
    name = "second_sight"

    def __init__(self, capacity, recency="chain", ghost_blocks=0):
        super().__init__(capacity, recency)
        self.ghost = Ghost(ghost_blocks)

    def admit(self, block, ctx, last):
        return self.ghost.seen_before(block)


class Continuation(SecondSight):
    """Second sight with a bounded ghost, plus: a block that continues a prefix that hit
    (ctx.hits > 0: a later turn of a conversation, or a request on a shared document) is
    written at first sight; optionally a chain's partial last block never is."""
    name = "continuation"

    def __init__(self, capacity, recency="chain", ghost_blocks=0, skip_partial_tail=False,
                 min_hits=1):
        super().__init__(capacity, recency, ghost_blocks)
        self.skip_partial_tail = skip_partial_tail
        self.min_hits = min_hits

    def admit(self, block, ctx, last):
        seen = self.ghost.seen_before(block)
        if self.skip_partial_tail and last and ctx.partial_tail:
            return False
        return seen or ctx.hits >= self.min_hits


class TinyLfu(Policy):
    """TinyLFU-style admission (Caffeine; CacheLib's flash admission): a count-min sketch of
    offers and hits, halved every `window` events; a block is written when the cache has room or
    its estimated frequency beats the eviction victim's."""
    name = "tinylfu"

    def __init__(self, capacity, recency="chain", window_factor=4, width_factor=2):
        super().__init__(capacity, recency)
        self.width = max(64, width_factor * capacity)
        self.window = max(64, window_factor * capacity)
        self.rows = [dict() for _ in range(4)]  # sparse rows: index -> count
        self.events = 0

    def _indices(self, block):
        h = hash(block)
        return [((h >> (13 * r)) ^ (h * (r + 1) * 0x9E3779B1)) % self.width for r in range(4)]

    def _count(self, block):
        self.events += 1
        for row, i in zip(self.rows, self._indices(block)):
            row[i] = min(row.get(i, 0) + 1, 15)
        if self.events >= self.window:
            self.events = 0
            self.rows = [{i: c // 2 for i, c in row.items() if c // 2} for row in self.rows]

    def estimate(self, block):
        return min(row.get(i, 0) for row, i in zip(self.rows, self._indices(block)))

    def lookup(self, chain):
        hits = super().lookup(chain)
        for b in chain[:hits]:
            self._count(b)
        return hits

    def admit(self, block, ctx, last):
        self._count(block)
        if len(self.cache) < self.cache.capacity:
            return True
        victim = self.cache.victim()
        return self.estimate(block) > self.estimate(victim)


class DramFront(Policy):
    """A DRAM tier in front of the SSD that holds what the SSD declined (CacheLib's DRAM before
    flash): a block offered for the first time goes to DRAM only; the second sight earns it its
    place on flash (written then). A second sight is: a Lookup hit in DRAM (the block is
    promoted: written to the SSD from DRAM, leaving DRAM), or an offer of a block in DRAM or in
    the ghost (recently offered blocks, `ghost_blocks`, 0: unbounded). Lookup hits count from
    either tier; only SSD writes count as written. DRAM and SSD are exclusive."""
    name = "dram_front"

    def __init__(self, capacity, recency="chain", dram_blocks=1, ghost_blocks=0):
        super().__init__(capacity, recency)
        self.dram = LruCache(max(1, dram_blocks), recency)
        self.ghost = Ghost(ghost_blocks)
        self.promoted = 0  # by a Lookup hit
        self.promoted_on_offer = 0  # offered again while in DRAM

    def lookup(self, chain):
        hits = 0
        for b in chain:
            if b not in self.cache and b not in self.dram:
                break
            hits += 1
        in_dram = [b for b in chain[:hits] if b in self.dram]
        self.cache.touch([b for b in chain[:hits] if b in self.cache])
        if in_dram:
            self.dram.remove(in_dram)
            self.cache.insert(in_dram)
            self.promoted += len(in_dram)
        return hits

    def store(self, blocks, ctx, ends_chain):
        written, declined = [], []
        for b in blocks:
            again = self.ghost.seen_before(b) or b in self.dram
            (written if again else declined).append(b)
        again_in_dram = [b for b in written if b in self.dram]
        self.promoted_on_offer += len(again_in_dram)
        self.dram.remove(again_in_dram)
        self.cache.insert(written)
        self.dram.insert(declined[-self.dram.capacity:])
        return written


class OracleReuse(Policy):
    """Not a policy tuttid could run: an upper bound. Writes a block only if the trace uses it
    again later (future knowledge: prepare() counts every reference in advance)."""
    name = "oracle_reuse"

    def __init__(self, capacity, recency="chain"):
        super().__init__(capacity, recency)
        self.left: Dict[object, int] = {}

    def prepare(self, chains):
        for ch in chains:
            for b in ch:
                self.left[b] = self.left.get(b, 0) + 1

    def lookup(self, chain):
        for b in chain:
            self.left[b] -= 1
        return super().lookup(chain)

    def admit(self, block, ctx, last):
        return self.left.get(block, 0) > 0


POLICIES: Dict[str, type] = {p.name: p for p in (Policy, SecondSight, Continuation, TinyLfu,
                                                  DramFront, OracleReuse)}

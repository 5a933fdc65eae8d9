"""A step's loads on one TP rank as Retrieves of at most max_blocks_per_call blocks and 1024
leases each (tuttid's bounds on one Retrieve): a long prompt's chain comes as several LoadSpecs,
one per Lookup chunk, each with its own lease.

start() issues the first Retrieve and returns at once when one is enough; each further one
waits for the one before (a Client has one Retrieve in flight), so start() then returns when
all but the last have ended. Retrievals has Retrieval's wait_layer / wait, over all of them.

Thread-safety: the worker's thread only.
"""

import logging
from typing import List, Optional, Set, Tuple

from tutti import errors
from tutti.client import RetrieveOutcome

log = logging.getLogger("tutti.vllm")

MAX_LEASES = 1024


class Retrievals:
    """Several Retrieves of one step, as one: block i of the step is the i-th of their blocks."""

    def __init__(self):
        self._parts: List[Tuple[object, int]] = []  # (Retrieval, index of its first block)

    def add(self, retrieval, first: int):
        self._parts.append((retrieval, first))

    def __bool__(self):
        return bool(self._parts)

    def wait_layer(self, layer: int, stream=None):
        """Retrieval.wait_layer on each, every one waited even when one raised (a broken one
        must not let the forward read another's blocks before they land); then raises the first
        error."""
        first = None
        for r, _ in self._parts:
            try:
                r.wait_layer(layer, stream)
            except errors.TuttiError as e:
                first = first or e
        if first is not None:
            raise first

    def wait(self, timeout=None) -> RetrieveOutcome:
        """Waits for all; failed indexes over the step's blocks; code/message: the first broken
        transfer's."""
        out = RetrieveOutcome()
        for r, first in self._parts:
            o = r.wait(timeout)
            if o is None:
                return None
            out.failed.extend(first + i for i in o.failed)
            if not o.ok and out.ok:
                out.code, out.message = o.code, o.message
        return out


def _batches(specs, rank: int, limit: int):
    """([batches of specs within the bounds], block ids of the specs this rank cannot load: no
    lease on it, or more blocks than one Retrieve takes)."""
    batch, blocks, refused, out = [], 0, set(), []
    for spec in specs:
        lease = spec.lease_ids.get(rank, 0)
        if not lease or len(spec.keys) > limit:
            refused.update(spec.block_ids)
            continue
        if batch and (blocks + len(spec.keys) > limit or len(batch) >= MAX_LEASES):
            out.append(batch)
            batch, blocks = [], 0
        batch.append(spec)
        blocks += len(spec.keys)
    if batch:
        out.append(batch)
    return out, refused


def start(client, specs, rank: int, limit: int) -> Tuple[Optional[Retrievals], List[int],
                                                           Set[int]]:
    """Starts loading `specs` (LoadSpecs) on this rank. Returns (the Retrievals or None, the
    vLLM block ids it loads in order, the block ids that will not load: report them failed)."""
    batches, refused = _batches(specs, rank, limit)
    rs, loading = Retrievals(), []
    for batch in batches:
        keys = [k for s in batch for k in s.keys]
        blocks = [b for s in batch for b in s.block_ids]
        try:
            r = client.retrieve(None, keys, blocks,
                                more_leases=[s.lease_ids[rank] for s in batch])
        except errors.TuttiError as e:
            refused.update(blocks)
            log.info("TP rank %d: Retrieve of %d blocks refused: %s", rank, len(keys), e)
            continue
        rs.add(r, len(loading))
        loading.extend(blocks)
    return (rs if rs else None), loading, refused

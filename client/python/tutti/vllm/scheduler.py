"""The connector's scheduler side: one memory-less tuttid session per TP rank, lookups that
never hold up a step, the loads and saves of each step, and the KV events of every rank.

- get_num_new_matched_tokens: Lookup on every rank (Timeouts.short = extra config
  "lookup_timeout_ms", default 200) of the request's keys (tutti.vllm.keys, derived once per
  block); hits = min over ranks of Lease.load_blocks, at most (num_tokens - 1) // block_size
  blocks (vLLM computes at least the last token). A chain longer than tuttid's
  max_blocks_per_call is looked up in chunks of that many keys, the next chunk only while every
  key of the previous one hit; each chunk has its own lease per rank. Any error is a miss;
  UNAVAILABLE (tuttid away or not answering in time) also skips that rank (a miss) for a
  back-off (0.5 s doubling to 8 s) or until its session is back; other errors are answers of a
  live tuttid about this request (e.g. INVALID_ARGUMENT), logged, no back-off. Calling it again
  for a request releases the leases of the earlier call. Every rank's Lookup goes out from one
  tutti.Client.lookup_many call: through tutti._lookup (libgrpc++, completed on this thread
  without the GIL) where it loads, else grpcio.
- update_state_after_alloc: loads of blocks [local hits, hits) of the request's blocks (one
  LoadSpec per chunk, with that chunk's leases), the leases of chunks not loaded released.
- build_connector_meta: the loads since the last step, and the saves: the full blocks computed by
  the end of this step (num_computed_tokens + scheduled tokens) that were neither loaded, nor
  local prefix hits, nor saved before (also across preemption). A request whose blocks cannot be
  keyed (tutti.vllm.keys refuses an extra key) neither loads nor saves. With
  publish_fence (vLLM's EAGLE successor-aware hashes) only blocks below the request's
  num_publishable_block_hashes (base.py: applied before storing by hash); the rest when a
  later step finds them publishable.
- update_connector_output: blocks that failed to load (invalid_block_ids) make the saves of the
  last steps (the workers dropped those of a step whose load failed) and, for each request whose
  own load failed, its blocks from the first failed one due again: they are saved once vLLM has
  recomputed them (a block a request shares as a GPU prefix hit is saved by the loader).
- request_finished: releases its leases (a load that will not happen), forgets it; returns
  (True, None) when the request had saves (a worker may still hold pending saves of it: vLLM
  keeps its blocks until every worker listed it in finished_sending), (False, None) otherwise.
  The workers report exactly the requests that had SaveSpecs, so both sides agree.
- take_events: what the ranks' WatchEvents streams said (tutti.vllm.events).
- Hybrid models (several KV cache groups, tutti.vllm.groups; one namespace and session per
  group and rank): the full-attention groups look up the chain as above (hits: the smallest);
  then groups.cut moves the cut down until every sliding-window group holds its window's blocks
  before it (Lookups of those blocks only, without load advice), at most MAX_CUT_ROUNDS
  candidates. Loads and saves are per group with the group's block ids: a sliding group loads
  only its window before the cut and saves only blocks vLLM still holds (not yet outside the
  window when the step began); null blocks (vLLM's block 0) are neither loaded nor saved. A
  block vLLM holds where the connector has nothing to load is reported failed (recomputed).
  request_finished_all_groups (vLLM's SupportsHMA) is request_finished.
- Per-request caps from a router, in request.kv_transfer_params (request_caps): max_load_tokens
  (vLLM #55885; 0: load nothing, no Lookup; N > 0: at most N tokens loaded beyond
  num_computed_tokens, whole blocks, so the hits end at block (num_computed_tokens + N) // bs;
  with tuttid's advice the smaller load wins) and max_offload_tokens (only blocks wholly inside
  the request's first N tokens are saved: block i when (i + 1) * bs <= N; 0: none). A value that
  is not an int >= 0 (bools, floats, strings, negatives) is logged once per request, naming it,
  and that cap is ignored (as vLLM does); None or absent: no cap.

Thread-safety: vLLM calls the scheduler hooks from one thread; the event watchers are
background threads (one per rank) that share only the event queue (a lock).
"""

import dataclasses
import logging
import numbers
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import tutti
from tutti import errors
from tutti.vllm import groups as kvgroups
from tutti.vllm.events import LOCALITY, MEDIUM, BlockInfo, EventTranslator, external_hash
from tutti.vllm.keys import KeyChain
from tutti.vllm.metadata import LoadSpec, SaveSpec, TuttiConnectorMetadata, TuttiHandshake

log = logging.getLogger("tutti.vllm")

MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
MAX_PENDING_EVENTS = 1 << 16
DEFAULT_MAX_BLOCKS_PER_CALL = 2048  # tuttid's default limits.max_blocks_per_call


class RankLink:
    """One rank's memory-less session. `connect(handshake)` makes a client (tests: a fake); it
    is tried now and then again in the background, never on the caller's thread, until it works.
    client() is None while unattached, away or backing off after a failed call."""

    def __init__(self, handshake: TuttiHandshake, connect: Callable, clock=time.monotonic):
        self.handshake = handshake
        self._connect = connect
        self._clock = clock
        self._lock = threading.Lock()
        self._client = None
        self._connecting = False
        self._until = 0.0
        self._backoff = MIN_BACKOFF_S
        self._closed = False
        try:
            self._client = connect(handshake)
        except Exception as e:  # tuttid not there yet: keep trying in the background
            log.warning("tuttid of TP rank %d at %s: %s; treating lookups as misses until it "
                        "answers", handshake.tp_rank, handshake.socket, e)
            self._fail_locked()

    def client(self):
        with self._lock:
            if self._clock() < self._until:
                return None
            if self._client is None:
                self._start_connect_locked()
                return None
            if not self._client.info.get("attached", True):
                return None
            return self._client

    def attached_client(self):
        """The client whatever the back-off (for the event watcher), or None."""
        with self._lock:
            return self._client

    def max_blocks_per_call(self) -> int:
        """Keys one Lookup may carry (this rank's tuttid's limits.max_blocks_per_call)."""
        with self._lock:
            c = self._client
        n = c.info.get("max_blocks_per_call") if c is not None else None
        return max(int(n or DEFAULT_MAX_BLOCKS_PER_CALL), 1)

    def failed(self, err):
        with self._lock:
            log.info("TP rank %d: %s; lookups miss for %.1f s", self.handshake.tp_rank, err,
                     self._backoff)
            self._fail_locked()

    def succeeded(self):
        with self._lock:
            self._backoff = MIN_BACKOFF_S

    def _fail_locked(self):
        self._until = self._clock() + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)

    def _start_connect_locked(self):
        if self._connecting or self._closed:
            return
        self._connecting = True
        threading.Thread(target=self._connect_once, daemon=True,
                         name="tutti-sched-connect").start()

    def _connect_once(self):
        try:
            c = self._connect(self.handshake)
        except Exception:
            c = None
        with self._lock:
            self._connecting = False
            if c is None:
                self._fail_locked()
            elif self._closed:
                c.detach()
            else:
                self._client = c
                self._backoff = MIN_BACKOFF_S

    def close(self):
        with self._lock:
            self._closed = True
            c, self._client = self._client, None
        if c is not None:
            c.detach()


LOAD_CAP = "max_load_tokens"
OFFLOAD_CAP = "max_offload_tokens"


@dataclass(frozen=True)
class Caps:
    """A request's caps from kv_transfer_params: None is no cap."""
    load: Optional[int] = None
    offload: Optional[int] = None


def request_caps(request) -> Caps:
    """max_load_tokens and max_offload_tokens of request.kv_transfer_params (None or a dict
    without them: no caps). A value that is not an int >= 0 (a bool, a float, a string, a
    negative number) is refused: a warning names the request and the value, and that cap is
    ignored (vLLM ignores invalid max_load_tokens with a warning too); the other cap still
    applies. An explicit None is the same as an absent key."""
    params = getattr(request, "kv_transfer_params", None)
    if not isinstance(params, Mapping):
        return Caps()
    out = {}
    for name, field_ in ((LOAD_CAP, "load"), (OFFLOAD_CAP, "offload")):
        v = params.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
            log.warning("request %s: kv_transfer_params %s = %r is not an integer >= 0; "
                        "ignored (no %s cap for this request)", request.request_id, name, v,
                        field_)
            continue
        out[field_] = int(v)
    return Caps(**out)


@dataclass
class _Chunk:
    begin: int                 # its first block
    hits: int                  # blocks [begin, begin + hits) hit on every rank
    leases: Dict[int, object]  # rank -> _Held: the pins of those blocks
    group: int = 0             # the KV cache group (hybrid models)


@dataclass
class _Pending:
    chunks: List[_Chunk]
    local: int
    hits: int
    chain: int = 0           # blocks looked up
    fresh_until: float = 0.0  # clock time until which the answer may be given again
    cap: Optional[int] = None  # the hits' end that max_load_tokens allowed (blocks)


@dataclass
class _Req:
    request: object
    block_ids: List[List[int]] = field(default_factory=lambda: [[]])  # per KV cache group
    done: int = 0  # blocks [0, done) need no save: loaded, local prefix hits, or saved
    loaded: tuple = (0, 0)  # the blocks [begin, end) of its load


class TuttiScheduler:
    def __init__(self, block_size: int, tp_size: int, connect: Optional[Callable] = None,
                 watch_events: bool = True, clock=time.monotonic, events_medium: str = MEDIUM,
                 events_locality: str = LOCALITY, groups=None):
        """`connect(handshake)` returns a client for one rank (default: a memory-less
        tutti.Client, see lookup_only_connect). `groups`: the KV cache groups
        (groups.groups_of(kv_cache_config)); several, or a sliding one: a hybrid model, one
        session per group and rank (connect gets the handshake with that group's namespace)."""
        self.block_size = block_size
        self.tp_size = tp_size
        self.groups = list(groups or [])
        self._hybrid = kvgroups.is_hybrid(self.groups)
        self._full = [g for g in self.groups if g.kind == kvgroups.FULL]
        self._windows = [(g.index, g.window_blocks) for g in self.groups
                         if g.kind == kvgroups.SLIDING]
        # The group whose sessions are self._links (events, the non-hybrid lookups): the first
        # full-attention group, else group 0.
        self._lead = self._full[0].index if self._full else 0
        self._group_links: Dict[int, Dict[int, RankLink]] = {}
        self.publish_fence = False  # TuttiConnector.set_eagle_prefix_cache_hashing
        self._connect = connect or lookup_only_connect()
        self._watch = watch_events
        self._clock = clock
        self._links: Dict[int, RankLink] = {}
        self._pending: Dict[str, _Pending] = {}
        self._local: Dict[str, int] = {}
        self._reqs: Dict[str, _Req] = {}
        self._chains: Dict[str, KeyChain] = {}
        self._unkeyable: set = set()  # requests with an extra key keys.py cannot encode
        self._caps: Dict[str, Caps] = {}  # per request, read (and warned about) once
        self._saved: set = set()  # requests that had saves: request_finished holds their blocks
        self._loads: List[LoadSpec] = []
        # Per recent step (two: async scheduling runs one ahead): {req_id: its `done` before the
        # step's saves}, to save again what workers dropped after a failed load.
        self._recent_saves = deque(maxlen=2)
        self._events_lock = threading.Lock()
        self._events = deque(maxlen=MAX_PENDING_EVENTS)
        self.translator = EventTranslator(tp_size, block_size, medium=events_medium,
                                          locality=events_locality)
        self._stop = threading.Event()
        self._watchers: List[threading.Thread] = []
        self._streams: Dict[int, object] = {}

    # --- start-up ---
    def set_handshakes(self, metadata):
        """vLLM's set_xfer_handshake_metadata: {tp_rank: TuttiHandshake} of every worker."""
        shakes = _flatten(metadata)
        missing = sorted(set(range(self.tp_size)) - set(shakes))
        if missing:
            raise ValueError("TuttiConnector: no handshake from TP ranks %s (got %s)" %
                             (missing, sorted(shakes)))
        if self._hybrid:
            for rank, h in shakes.items():
                if len(h.namespaces()) != len(self.groups):
                    raise ValueError("TuttiConnector: TP rank %d's worker has %d KV cache group "
                                     "namespaces, the scheduler's config %d groups" % (
                                         rank, len(h.namespaces()), len(self.groups)))
            for g in self.groups:
                self._group_links[g.index] = {
                    rank: RankLink(dataclasses.replace(shakes[rank],
                                                       namespace=shakes[rank].namespaces()[
                                                           g.index]),
                                   self._connect, self._clock)
                    for rank in sorted(shakes)}
            self._links = self._group_links[self._lead]
        else:
            for rank in sorted(shakes):
                self._links[rank] = RankLink(shakes[rank], self._connect, self._clock)
        if self._watch:
            for rank, link in self._links.items():
                t = threading.Thread(target=self._watch_rank, args=(rank, link), daemon=True,
                                     name="tutti-events-%d" % rank)
                t.start()
                self._watchers.append(t)

    # --- lookups ---
    def caps(self, request) -> Caps:
        """The request's kv_transfer_params caps, read once (a bad value is warned about once)."""
        req_id = request.request_id
        c = self._caps.get(req_id)
        if c is None:
            c = self._caps[req_id] = request_caps(request)
        return c

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        req_id = request.request_id
        local = num_computed_tokens // self.block_size
        max_blocks = max(request.num_tokens - 1, 0) // self.block_size
        load_cap = self.caps(request).load
        # max_load_tokens: at most that many tokens past num_computed_tokens, in whole blocks
        cap = None if load_cap is None else (num_computed_tokens + load_cap) // self.block_size
        again = self._repeat(req_id, local, max_blocks, cap)
        if again is not None:
            return again
        self._release_pending(req_id)
        self._local[req_id] = local
        limit = max_blocks if cap is None else min(max_blocks, cap)
        if limit <= local or len(self._links) != self.tp_size:
            return 0, False  # (max_load_tokens 0, or less than a block: no Lookup at all)
        n = self._derive(request, max_blocks)
        if not n:
            return 0, False
        if self._hybrid:
            return self._hybrid_matched(request, n, local, limit, max_blocks, cap,
                                        num_computed_tokens)
        chunks = self._lookup_chunks(self._chains[req_id], n, request.num_tokens, limit)
        chunks = self._cap_chunks(chunks, limit)
        hits = sum(c.hits for c in chunks)
        if hits <= local:
            for c in chunks:
                self._release(c.leases)
            return 0, False
        return self._hold(req_id, chunks, local, hits, max_blocks, cap, num_computed_tokens)

    def _hold(self, req_id, chunks, local, hits, max_blocks, cap, num_computed_tokens):
        """Keeps the request's leased chunks as its pending answer (given again until half the
        leases' TTL has passed); returns get_num_new_matched_tokens' answer for `hits` blocks."""
        ttl_s = min(h.lease.ttl_ms for c in chunks for h in c.leases.values()) / 1000.0
        self._pending[req_id] = _Pending(chunks, local, hits, max_blocks,
                                         self._clock() + ttl_s / 2, cap)
        return hits * self.block_size - num_computed_tokens, False

    def _cap_chunks(self, chunks, end) -> List[_Chunk]:
        """The chunks' hits cut at block `end` (max_load_tokens; tuttid's advice is already in
        their hits: the smaller wins). A chunk wholly past it is released now; a chunk cut
        inside keeps its lease, whose pins past `end` end with the Retrieve of its blocks
        before `end` (a Retrieve ends its leases whole), or with its release."""
        kept = []
        for c in chunks:
            if c.begin >= end:
                self._release(c.leases)
                continue
            c.hits = min(c.hits, end - c.begin)
            kept.append(c)
        return kept

    def _derive(self, request, n) -> int:
        """Keys of the request's blocks [0, n): how many it has. 0 for a request whose blocks
        cannot be keyed (logged once): it neither loads nor saves."""
        req_id = request.request_id
        if req_id in self._unkeyable:
            return 0
        chain = self._chains.get(req_id)
        if chain is None:
            chain = self._chains[req_id] = KeyChain(self.block_size)
        try:
            return chain.derive(request, n)
        except ValueError as e:
            log.warning("request %s: %s; it neither loads from nor saves to tuttid", req_id, e)
            self._unkeyable.add(req_id)
            return 0

    def _hybrid_matched(self, request, n, local, limit, max_blocks, cap, num_computed_tokens):
        """get_num_new_matched_tokens of a hybrid model: the full groups' hits (each group's
        chain lookup), then the cut every sliding group can serve (groups.cut)."""
        req_id = request.request_id
        chain = self._chains[req_id]
        upper = min(n, limit)
        chunks: List[_Chunk] = []
        for g in self._full:
            if upper <= local:
                break
            got = self._lookup_chunks(chain, n, request.num_tokens, upper,
                                      self._group_links[g.index], g.index)
            chunks.extend(got)
            upper = min(upper, sum(c.hits for c in got))
        looked = []  # (group, begin, end, chunks) of every window lookup, in order

        def first_missing(g, begin, end):
            got = self._lookup_window(chain, g, begin, end)
            looked.append((g, begin, end, got))
            return begin + sum(c.hits for c in got)

        k = local
        if upper > local:
            k = kvgroups.cut(local, upper, self._windows, first_missing)
        last = {}
        for g, begin, end, got in looked:
            if g in last:
                for c in last[g][3]:
                    self._release(c.leases)
            last[g] = (g, begin, end, got)
        for g, begin, end, got in last.values():
            w = dict(self._windows)[g]
            if k > local and (begin, end) == (max(local, k - w), k):
                chunks.extend(got)
            else:
                for c in got:
                    self._release(c.leases)
        chunks = self._cap_chunks(chunks, k)
        if k <= local or not chunks:
            for c in chunks:
                self._release(c.leases)
            return 0, False
        return self._hold(req_id, chunks, local, k, max_blocks, cap, num_computed_tokens)

    def _lookup_window(self, chain, group, begin, end) -> List[_Chunk]:
        """Blocks [begin, end) of a sliding group: chunks of leading hits (presence only: no
        load advice for a window)."""
        links = self._group_links[group]
        step = min(link.max_blocks_per_call() for link in links.values())
        out = []
        for b in range(begin, end, step):
            e = min(b + step, end)
            leases = self._lookup_all(chain.packed(b, e), None, links)
            if leases is None:
                break
            hits = min(h.lease.hits for h in leases.values())
            if hits <= 0:
                self._release(leases)
                break
            out.append(_Chunk(b, hits, leases, group))
            if hits < e - b:
                break
        return out

    def _lookup_chunks(self, chain, n, prompt_tokens, limit=None, links=None,
                       group=0) -> List[_Chunk]:
        """Looks up blocks [0, n) in chunks of at most max_blocks_per_call keys, the next
        chunk only while the previous one hit in full, and none that starts at or past block
        `limit` (nothing of it could load). A chunk is looked up whole (tuttid advises on the
        chain it is given). The chunks that hit something (every rank's leases); none on a
        miss. `links`: the sessions to ask (default self._links), of KV cache group `group`."""
        links = links if links is not None else self._links
        step = min(link.max_blocks_per_call() for link in links.values())
        chunks = []
        for begin in range(0, n, step):
            if limit is not None and begin >= limit:
                break
            end = min(begin + step, n)
            leases = self._lookup_all(chain.packed(begin, end), prompt_tokens, links)
            if leases is None:
                break
            hits = min(min(h.lease.load_blocks, h.lease.hits) for h in leases.values())
            if hits <= 0:
                self._release(leases)
                break
            chunks.append(_Chunk(begin, hits, leases, group))
            if hits < end - begin:
                break
        return chunks

    def _repeat(self, req_id, local, max_blocks, cap):
        """The answer of this request's previous call when nothing it depends on changed: the
        same local prefix, the same chain and cap, and its leases young (less than half their
        TTL): the pins keep every hit present, so no Lookup is needed (vLLM asks again every
        step while a request waits for blocks). None: look up again."""
        p = self._pending.get(req_id)
        if (p is None or p.local != local or p.chain != max_blocks or p.cap != cap
                or self._clock() >= p.fresh_until):
            return None
        return (p.hits - local) * self.block_size, False

    def _lookup_all(self, keys, prompt_tokens, links=None):
        """{rank: Lease} from every rank, or None (a miss; what was pinned is released). The
        ranks' Lookups are in flight together: the wait is the slowest rank's, not their sum.
        tutti.Client.lookup_many sends them all from one call (through tutti._lookup where it
        loads: no GIL, no hand-off to grpcio's thread). A client without it (a fake): the last
        rank's on this thread (lookup_inline) while the others' are in flight. `links`: the
        sessions to ask (default self._links)."""
        links = links if links is not None else self._links
        ranks = sorted(links)
        clients = []
        for rank in ranks:
            client = links[rank].client()
            if client is None:
                return None
            clients.append(client)
        if not clients:
            return None
        many = getattr(type(clients[0]), "lookup_many", None)
        if many is not None and all(type(c) is type(clients[0]) for c in clients):
            return self._lookup_many(many, keys, prompt_tokens, ranks, clients, links)
        started, leases, ok = {}, {}, True
        for rank, client in zip(ranks, clients):
            try:
                inline = getattr(client, "lookup_inline", None) if rank == ranks[-1] else None
                if inline is not None:
                    started[rank] = (client, _Answered(inline(keys, prompt_tokens=prompt_tokens)))
                else:
                    started[rank] = (client, client.start_lookup(keys,
                                                                 prompt_tokens=prompt_tokens))
            except Exception as e:  # any error: a miss
                self._lookup_failed(rank, e, links)
                ok = False
                break
        for rank, (client, pending) in started.items():  # collect every answer: pins to release
            try:
                leases[rank] = (client, pending.result())
                links[rank].succeeded()
            except Exception as e:
                self._lookup_failed(rank, e, links)
                ok = False
        if not ok:
            self._release(leases)
            return None
        return {rank: _Held(c, lease) for rank, (c, lease) in leases.items()}

    def _lookup_many(self, many, keys, prompt_tokens, ranks, clients, links):
        """_lookup_all through the clients' lookup_many: [Lease or error] per rank."""
        try:
            answers = many([(c, keys, prompt_tokens) for c in clients])
        except Exception as e:  # a bug or a broken native module: a miss on every rank
            log.warning("Lookup on every TP rank failed: %s", e)
            return None
        leases, ok = {}, True
        for rank, client, answer in zip(ranks, clients, answers):
            if isinstance(answer, BaseException):
                self._lookup_failed(rank, answer, links)
                ok = False
            else:
                leases[rank] = (client, answer)
                links[rank].succeeded()
        if not ok:
            self._release(leases)
            return None
        return {rank: _Held(c, lease) for rank, (c, lease) in leases.items()}

    def _lookup_failed(self, rank, err, links=None):
        """UNAVAILABLE: tuttid away or too slow: back off from the rank. Anything else is a
        live tuttid refusing this Lookup (or a bug here): this request misses, others go on."""
        links = links if links is not None else self._links
        if isinstance(err, errors.Unavailable):
            links[rank].failed(err)
            return
        links[rank].succeeded()
        log.warning("TP rank %d refused a Lookup (a miss, the rank stays in use): %s", rank, err)

    def _release(self, leases):
        """Ends the leases ({rank: _Held or (client, lease)}); errors are ignored (a lease
        expires on its own). Every rank's at once through the clients' release_many."""
        pairs = []
        for held in leases.values():
            client, lease = (held.client, held.lease) if isinstance(held, _Held) else held
            if lease.id != 0:
                pairs.append((client, lease))
        if not pairs:
            return
        many = getattr(type(pairs[0][0]), "release_many", None)
        if many is not None and all(type(c) is type(pairs[0][0]) for c, _ in pairs):
            try:
                many(pairs)
            except Exception:  # the leases expire on their own
                pass
            return
        for client, lease in pairs:
            try:
                client.release(lease)
            except Exception:  # the lease expires on its own
                pass

    def _release_pending(self, req_id):
        p = self._pending.pop(req_id, None)
        if p is not None:
            for c in p.chunks:
                self._release(c.leases)

    # --- allocation and steps ---
    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        req_id = request.request_id
        st = self._reqs.setdefault(req_id, _Req(request))
        st.request = request
        st.block_ids = [list(g) for g in blocks.get_block_ids()]
        local = self._local.pop(req_id, 0)
        p = self._pending.pop(req_id, None)
        done = local
        if p is not None and num_external_tokens > 0:
            n = min(num_external_tokens // self.block_size, p.hits - p.local,
                    min(len(ids) for ids in st.block_ids) - p.local)
            self._add_loads(req_id, st, p, p.local + n)
            done = p.local + n
            st.loaded = (p.local, done)
        elif p is not None:
            for c in p.chunks:
                self._release(c.leases)
        st.done = max(st.done, done)

    def _add_loads(self, req_id, st, p, end):
        """LoadSpecs of blocks [p.local, end), one per chunk under that chunk's leases (the
        worker's Retrieve ends them); the leases of chunks outside it are released."""
        chain = self._chains[req_id]
        covered = {}  # group -> blocks it loads
        for c in p.chunks:
            lo, hi = max(c.begin, p.local), min(c.begin + c.hits, end)
            ids = st.block_ids[c.group][lo:hi] if lo < hi else []
            keys = chain.keys(lo, hi) if lo < hi else []
            if self._hybrid:  # vLLM's null block: a position it skips (outside a window)
                pairs = [(k, b) for k, b in zip(keys, ids) if b != 0]
                keys, ids = [k for k, _ in pairs], [b for _, b in pairs]
                covered.setdefault(c.group, set()).update(range(lo, hi))
            if not keys:
                self._release(c.leases)
                continue
            self._loads.append(LoadSpec(req_id, keys, ids,
                                        {r: h.lease.id for r, h in c.leases.items()}, c.group))
        if self._hybrid:
            self._unserved(req_id, st, p.local, end, covered, chain)

    def _unserved(self, req_id, st, local, end, covered, chain):
        """Hybrid: blocks in [local, end) that vLLM holds (not null) in a group's table but that
        group does not load (a window vLLM sees otherwise, or fewer tokens allocated than
        offered): a LoadSpec without leases, so every worker reports them failed and vLLM
        recomputes from there. Never a block vLLM reads unfilled."""
        for g in self.groups:
            ids = st.block_ids[g.index]
            have = covered.get(g.index, set())
            bad = [i for i in range(local, min(end, len(ids))) if ids[i] != 0 and i not in have]
            if bad:
                log.warning("request %s: KV cache group %d (%s) holds blocks %s past the GPU "
                            "prefix that tutti cannot fill; reported failed (recomputed)",
                            req_id, g.index, g.describe(), bad[:8])
                self._loads.append(LoadSpec(req_id, [chain.keys(i, i + 1)[0] for i in bad],
                                            [ids[i] for i in bad], {}, g.index))

    def build_connector_meta(self, so) -> TuttiConnectorMetadata:
        saves = []
        self._recent_saves.append({})
        for r in so.scheduled_new_reqs:
            st = self._reqs.get(r.req_id)
            if st is not None:
                st.block_ids = [list(g) for g in r.block_ids]
                end = r.num_computed_tokens + so.num_scheduled_tokens.get(r.req_id, 0)
                self._collect_save(r.req_id, st, end, saves, r.num_computed_tokens)
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                st.block_ids = [list(g) for g in new] if new else [[] for _ in st.block_ids]
            elif new:
                if len(st.block_ids) < len(new):
                    st.block_ids.extend([] for _ in range(len(new) - len(st.block_ids)))
                for ids, more in zip(st.block_ids, new):
                    ids.extend(more)
            end = cached.num_computed_tokens[i] + so.num_scheduled_tokens.get(req_id, 0)
            self._collect_save(req_id, st, end, saves, cached.num_computed_tokens[i])
        preempted = sorted(so.preempted_req_ids or ())
        for req_id in preempted:
            self._release_pending(req_id)
            if req_id in self._reqs:
                self._reqs[req_id].block_ids = [[] for _ in self._reqs[req_id].block_ids]
        loads, self._loads = self._loads, []
        return TuttiConnectorMetadata(loads=loads, saves=saves, preempted=preempted)

    def _collect_save(self, req_id, st, end_tokens, saves, computed_tokens=0):
        """Saves of the request's blocks completed by `end_tokens` (its step began with
        `computed_tokens` computed: a sliding group's blocks vLLM freed before it are not)."""
        request = st.request
        end = min(end_tokens // self.block_size, min(len(ids) for ids in st.block_ids))
        offload_cap = self.caps(request).offload
        if offload_cap is not None:  # max_offload_tokens: blocks wholly inside the first N
            end = min(end, offload_cap // self.block_size)
        full = self._derive(request, end)
        if self.publish_fence:
            full = min(full, int(getattr(request, "num_publishable_block_hashes", 0)))
        if full <= st.done or req_id in self._unkeyable:
            return
        chain = self._chains[req_id]
        keys = chain.keys(st.done, full)
        before = len(saves)
        if not self._hybrid:
            saves.append(SaveSpec(req_id, keys, st.block_ids[0][st.done:full]))
        for g in (self.groups if self._hybrid else ()):
            lo = max(st.done, kvgroups.skipped_blocks(g, computed_tokens, self.block_size))
            ids = st.block_ids[g.index]
            pairs = [(keys[i - st.done], ids[i]) for i in range(lo, full) if ids[i] != 0]
            if pairs:
                saves.append(SaveSpec(req_id, [k for k, _ in pairs], [b for _, b in pairs],
                                      g.index))
        self._recent_saves[-1].setdefault(req_id, st.done)
        if len(saves) > before:  # the workers expect it in finished_sending
            self._saved.add(req_id)
        self._remember(request, chain, st.done, full, keys)
        st.done = full

    def _remember(self, request, chain, begin, end, keys):
        """What BlockStored will say of these blocks: vLLM's hash of each as vLLM's own events
        give it (events.external_hash), so the disk tier's events join the GPU tier's."""
        bs = self.block_size
        tokens = request.all_token_ids
        hashes = request.block_hashes
        lora = getattr(request, "lora_request", None)
        lora_id = getattr(lora, "lora_int_id", None) if lora is not None else None
        lora_name = getattr(lora, "lora_name", None) if lora is not None else None
        with self._events_lock:
            for i, key in zip(range(begin, min(end, len(hashes))), keys):
                parent = external_hash(hashes[i - 1]) if i > 0 else None
                self.translator.remember(key, BlockInfo(
                    external_hash(hashes[i]), parent, tuple(tokens[i * bs:(i + 1) * bs]),
                    lora_id, lora_name, chain.extra_keys(i)))

    def update_connector_output(self, connector_output):
        bad = getattr(connector_output, "invalid_block_ids", None)
        if bad:
            log.info("%d blocks failed to load this step; vLLM recomputes them", len(bad))
            self._save_again(set(bad))

    def _save_again(self, bad):
        """After a failed load: the blocks whose saves workers dropped, and each request's blocks
        from its first failed one (vLLM recomputes them), are saved when next computed."""
        for step in self._recent_saves:
            for req_id, done in step.items():
                st = self._reqs.get(req_id)
                if st is not None:
                    st.done = min(st.done, done)
        self._recent_saves.clear()
        for st in self._reqs.values():  # its own load's failed blocks, not a shared prefix's
            begin, end = st.loaded
            first = next((i for i in range(begin, min(end, len(st.block_ids[0])))
                          if any(i < len(ids) and ids[i] != 0 and ids[i] in bad
                                 for ids in st.block_ids)), None)
            if first is not None:
                st.done = min(st.done, first)

    def request_finished(self, request, block_ids):
        req_id = request.request_id
        self._release_pending(req_id)
        self._local.pop(req_id, None)
        self._reqs.pop(req_id, None)
        self._chains.pop(req_id, None)
        self._caps.pop(req_id, None)
        self._unkeyable.discard(req_id)
        if req_id in self._saved:
            self._saved.discard(req_id)
            return True, None
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        """vLLM's SupportsHMA hook (every group's block ids): as request_finished."""
        return self.request_finished(request, block_ids[0] if block_ids else [])

    # --- events ---
    def take_events(self):
        with self._events_lock:
            out = list(self._events)
            self._events.clear()
        return out

    def _watch_rank(self, rank, link):
        after, boot = 0, 0
        backoff = MIN_BACKOFF_S
        while not self._stop.is_set():
            client = link.attached_client()
            if client is None:
                self._stop.wait(backoff)
                continue
            try:
                stream = client.watch_events(after, boot)
                self._streams[rank] = stream
                for batch in stream:
                    after, boot = self._on_batch(rank, batch, after, boot)
                    backoff = MIN_BACKOFF_S
            except errors.TuttiError as e:
                log.debug("TP rank %d events: %s", rank, e)
            except Exception as e:  # e.g. a tuttid without WatchEvents
                log.warning("TP rank %d events: %r", rank, e)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _on_batch(self, rank, batch, after, boot):
        with self._events_lock:
            if batch.first:
                self._events.extend(self.translator.on_stream_start(
                    rank, batch.pool_id, batch.boot_id, batch.blocks_lost_at_start,
                    batch.resumed))
                boot = batch.boot_id
            self._events.extend(self.translator.on_events(
                rank, [(e.kind, e.key) for e in batch.events]))
        if batch.events:
            after = batch.events[-1].seq
        return after, boot

    def shutdown(self):
        self._stop.set()
        for stream in list(self._streams.values()):
            stream.cancel()
        for p in list(self._pending):
            self._release_pending(p)
        self._chains.clear()
        self._caps.clear()
        for link in self._links.values():
            link.close()
        for links in self._group_links.values():
            if links is not self._links:
                for link in links.values():
                    link.close()
        for t in self._watchers:
            t.join(timeout=2.0)


@dataclass
class _Held:
    client: object
    lease: object


@dataclass
class _Answered:
    """A Lookup answered on the scheduler's thread, as a started one (result())."""
    lease: object

    def result(self):
        return self.lease


def _flatten(metadata):
    """{tp_rank: TuttiHandshake} from vLLM's merged dict (values may be nested dicts)."""
    out = {}
    for k, v in (metadata or {}).items():
        if isinstance(v, dict):
            out.update(_flatten(v))
        elif isinstance(v, TuttiHandshake):
            out[v.tp_rank] = v
        else:
            raise ValueError("TuttiConnector: handshake of rank %r is a %s, not a TuttiHandshake"
                             % (k, type(v).__name__))
    return out


def lookup_only_connect(lookup_timeout_s: float = 0.5, connect_timeout_s: float = 1.0):
    """A connect() making memory-less tutti.Clients: lookups get `lookup_timeout_s`."""
    timeouts = tutti.Timeouts(short=lookup_timeout_s)

    def connect(h: TuttiHandshake):
        c = tutti.Client.attach_lookup_only(h.namespace, h.engine_group, socket_path=h.socket,
                                            engine_id="vllm-scheduler-rank%d" % h.tp_rank,
                                            connect_timeout=connect_timeout_s,
                                            timeouts=timeouts,
                                            namespace_secret=h.namespace_secret)
        c.warm_lookup_many()  # the first request's Lookups need not wait for the connection
        return c
    return connect

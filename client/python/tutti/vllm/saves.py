"""A worker's pending saves: blocks a Store refused (STORE_REJECTED_FULL: tuttid's store staging
is full until its writer drains it to SSD) and that are stored again later, while vLLM still
holds the engine blocks.

vLLM's async-save contract (KVConnectorBase_V1): a running request keeps its blocks until it is
preempted (the worker's handle_preemptions runs before they are reused) or finishes; a finished
request whose scheduler-side request_finished returned True keeps them until every worker listed
it in get_finished's finished_sending. So:

- add(req_id, keys, blocks, why): the blocks of a step's Store that were refused; they are
  retried by a background thread (`start()`), or by retry_once() (tests), in batches of at most
  `batch` blocks, backing off (min_backoff_s doubling to max_backoff_s) while tuttid keeps
  refusing. A retry Store is a capture of complete blocks: store(keys, blocks) must not wait for
  the engine's stream (the worker gives it an idle side stream in cuda mode).
- expect(req_ids): requests that had saves (SaveSpecs) in a step; finished(ids) (get_finished)
  returns those of them vLLM said finished once nothing of theirs is pending or in flight (in
  this call or a later one); each such id is returned exactly once.
- drop(req_ids) (preemption): forgets those requests' pending blocks and returns once no Store
  holding any of their blocks is in flight; a retry that was in flight never re-queues them.
- Bounds: a block is given up `deadline_s` after it was first refused, when tuttid is away
  (Unavailable: every pending block), when the Store fails otherwise, or when `max_blocks` are
  pending already. Every block given up is counted per cause (stats()) and logged, at most once
  per `log_interval_s`, with the cause and tuttid's rejected_why.

Thread-safety: every method may be called from any thread; one lock guards the state; store()
is called without it, from one thread at a time (the retry thread, or retry_once's caller).
"""

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Set

from tutti import errors

log = logging.getLogger("tutti.vllm")


class _ReqSaves:
    """One request's pending blocks (until it is dropped: then `dead`, and a new one is made if
    the request saves again after it resumes)."""

    def __init__(self, req_id: str):
        self.req_id = req_id
        self.pending = 0   # entries in the queue
        self.inflight = 0  # entries in a Store now
        self.dead = False


@dataclass
class _Entry:
    req: _ReqSaves
    key: bytes
    block: int
    deadline: float


class PendingSaves:
    def __init__(self, store: Callable, deadline_s: float = 10.0, max_blocks: int = 4096,
                 batch: int = 64, min_backoff_s: float = 0.005, max_backoff_s: float = 0.25,
                 log_interval_s: float = 10.0, clock=time.monotonic, name: str = "TP rank 0"):
        """`store(keys, blocks)` returns one outcome per key ("captured", "durable",
        "already_present", "rejected_full", "failed"), optionally with .rejected_why, or raises
        a TuttiError."""
        if deadline_s < 0 or max_blocks < 0 or batch < 1:
            raise ValueError("pending saves: deadline %r s, max %r blocks, batch %r" %
                             (deadline_s, max_blocks, batch))
        self._store = store
        self.deadline_s, self.max_blocks, self.batch = deadline_s, max_blocks, batch
        self._min_backoff, self._max_backoff = min_backoff_s, max_backoff_s
        self._backoff = min_backoff_s
        self._log_interval = log_interval_s
        self._clock = clock
        self._name = name
        self._cv = threading.Condition()
        self._queue = deque()                 # _Entry, oldest first
        self._reqs: Dict[str, _ReqSaves] = {}  # req_id -> its live _ReqSaves
        self._expected: Set[str] = set()      # requests that had saves, not yet reported
        self._finishing: Set[str] = set()     # ... that vLLM said finished
        self._next_try = 0.0
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self._stats = {"refused": 0, "stored_late": 0, "retries": 0, "declined": 0}
        self._dropped: Dict[str, int] = {}    # cause -> blocks given up (since start)
        self._unlogged: Dict[str, int] = {}   # cause -> blocks given up since the last log
        self._why = ""
        self._last_log = None

    # --- the step's side ---
    def expect(self, req_ids: Iterable[str]):
        with self._cv:
            self._expected.update(req_ids)

    def add(self, req_id: str, keys: List[bytes], blocks: List[int], why: str = ""):
        """Queues refused blocks (req_id's keys[i] in engine block blocks[i]) for a retry."""
        if not keys:
            return
        with self._cv:
            if why:
                self._why = why
            self._stats["refused"] += len(keys)
            room = max(self.max_blocks - len(self._queue), 0)
            if room < len(keys):
                self._give_up_locked("max_pending_saves (%d blocks) reached" % self.max_blocks,
                                     len(keys) - room)
                keys, blocks = keys[:room], blocks[:room]
            if not keys:
                return
            req = self._reqs.get(req_id)
            if req is None:
                req = self._reqs[req_id] = _ReqSaves(req_id)
            deadline = self._clock() + self.deadline_s
            for k, b in zip(keys, blocks):
                self._queue.append(_Entry(req, k, int(b), deadline))
            req.pending += len(keys)
            self._cv.notify_all()

    def give_up(self, cause: str, n: int, why: str = ""):
        """Counts `n` blocks dropped without being queued (e.g. the step's own Store failed)."""
        with self._cv:
            if why:
                self._why = why
            self._give_up_locked(cause, n)

    def drop(self, req_ids: Iterable[str]):
        """Preemption: forgets the requests' pending blocks; returns once none of their blocks
        is in a Store (their engine blocks may be reused after that)."""
        ids = set(req_ids)
        with self._cv:
            reqs = [self._reqs.pop(r) for r in ids if r in self._reqs]
            if not reqs:
                return
            for req in reqs:
                req.dead = True
            kept = deque(e for e in self._queue if not e.req.dead)
            dropped = len(self._queue) - len(kept)
            self._queue = kept
            for req in reqs:
                req.pending = 0
            if dropped:
                self._give_up_locked("request preempted", dropped)
            self._cv.wait_for(lambda: all(req.inflight == 0 for req in reqs))

    def finished(self, finished_req_ids: Iterable[str]) -> Set[str]:
        """get_finished: of the expected requests vLLM said finished (now or before), those with
        nothing pending nor in flight (each returned once)."""
        with self._cv:
            self._finishing.update(r for r in finished_req_ids if r in self._expected)
            self._expire_locked()
            done = set()
            for r in self._finishing:
                req = self._reqs.get(r)
                if req is None or (req.pending == 0 and req.inflight == 0):
                    done.add(r)
            for r in done:
                self._finishing.discard(r)
                self._expected.discard(r)
                self._reqs.pop(r, None)
            return done

    def wait_idle(self, timeout: float) -> bool:
        """Waits until nothing is pending nor in flight (the retry thread's work); False if
        `timeout` seconds passed first."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and all(
                r.inflight == 0 for r in self._reqs.values()), timeout=timeout)

    def stats(self) -> dict:
        """Blocks refused, stored by a retry, retry Stores sent, and given up per cause."""
        with self._cv:
            out = dict(self._stats)
            out["dropped"] = dict(self._dropped)
            out["pending"] = len(self._queue)
            return out

    # --- retries ---
    def start(self):
        self._thread = threading.Thread(target=self._run, daemon=True, name="tutti-save-retry")
        self._thread.start()

    def _run(self):
        while True:
            with self._cv:
                while not self._closed:
                    wait = self._next_try - self._clock()
                    if self._queue and wait <= 0:
                        break
                    self._cv.wait(timeout=wait if self._queue else None)
                if self._closed:
                    return
            self.retry_once()

    def retry_once(self) -> int:
        """One retry Store of the oldest pending blocks (past their deadline: given up first).
        Returns how many were sent."""
        with self._cv:
            self._expire_locked()
            batch = []
            while self._queue and len(batch) < self.batch:
                e = self._queue.popleft()
                e.req.pending -= 1
                e.req.inflight += 1
                batch.append(e)
            if not batch:
                return 0
            self._stats["retries"] += 1
        outcomes, err = None, None
        try:
            outcomes = self._store([e.key for e in batch], [e.block for e in batch])
            if len(outcomes) != len(batch):
                raise errors.TuttiError("Store answered %d outcomes for %d blocks" %
                                        (len(outcomes), len(batch)), "INTERNAL")
        except errors.TuttiError as e:
            err = e
        except Exception as e:  # never let the retry thread die
            err = errors.TuttiError(repr(e), "INTERNAL")
        with self._cv:
            self._settle_locked(batch, outcomes, err)
            self._cv.notify_all()
        return len(batch)

    def _settle_locked(self, batch, outcomes, err):
        for e in batch:
            e.req.inflight -= 1
        live = [(i, e) for i, e in enumerate(batch) if not e.req.dead]
        # in_dram: tuttid kept it in DRAM only (pool.admission "dram_front"): stored, not durable
        stored = ("captured", "durable", "already_present", "in_dram")
        lost = sum(1 for i, e in enumerate(batch) if e.req.dead and (
            err is not None or outcomes[i] not in stored + ("declined",)))
        self._give_up_locked("request preempted", lost)
        if err is not None:
            if isinstance(err, errors.Unavailable):
                n = len(self._queue)
                for q in self._queue:
                    q.req.pending -= 1
                self._queue.clear()
                self._give_up_locked("tuttid away (%s)" % err, len(live) + n)
            else:
                self._give_up_locked("Store failed (%s)" % err, len(live))
            self._backoff = self._max_backoff
            self._next_try = self._clock() + self._backoff
            return
        why = getattr(outcomes, "rejected_why", "") or ""
        if why:
            self._why = why
        refused, failed = [], 0
        for i, e in live:
            o = outcomes[i]
            if o == "rejected_full":
                refused.append(e)
            elif o in stored:
                self._stats["stored_late"] += 1
            elif o == "declined":  # tuttid's admission policy chose not to write it: settled
                self._stats["declined"] += 1
            else:
                failed += 1
        if failed:
            self._give_up_locked("Store outcome failed", failed)
        for e in reversed(refused):  # back at the front, in their order
            e.req.pending += 1
            self._queue.appendleft(e)
        if refused:
            self._backoff = min(max(self._backoff * 2, self._min_backoff), self._max_backoff)
            self._next_try = self._clock() + self._backoff
        else:
            self._backoff = self._min_backoff
            self._next_try = self._clock()

    def _expire_locked(self):
        now = self._clock()
        if not self._queue or all(e.deadline > now for e in self._queue):
            return
        kept = deque()
        n = 0
        for e in self._queue:
            if e.deadline > now:
                kept.append(e)
            else:
                e.req.pending -= 1
                n += 1
        self._queue = kept
        self._give_up_locked("still refused after save_retry_deadline_ms (%.0f ms)" %
                             (self.deadline_s * 1000), n)

    def _give_up_locked(self, cause, n):
        if n <= 0:
            return
        self._dropped[cause] = self._dropped.get(cause, 0) + n
        self._unlogged[cause] = self._unlogged.get(cause, 0) + n
        now = self._clock()
        if self._last_log is not None and now - self._last_log < self._log_interval:
            return
        self._last_log = now
        parts = ", ".join("%d: %s" % (c, cause) for cause, c in sorted(self._unlogged.items()))
        self._unlogged.clear()
        log.warning("%s: saves given up (blocks: cause) %s; tuttid said: %s", self._name, parts,
                    self._why or "-")

    def close(self):
        """Stops the retry thread; what is pending is dropped (not counted)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

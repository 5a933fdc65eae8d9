"""One replay engine: a host-mode engine attached to tuttid through the public Python client
(tutti.Client), serving trace requests as an inference engine would (trace_replay.py).

Per request: Lookup of its chain (trace_format.chain, keys trace_format.key_of) in calls of at
most `call_blocks` keys, the next call only when the previous one hit all its keys; the hits are
pinned. With the chain in one call, the Lookup carries the prompt's length and tuttid's advice
(Lease.load_blocks: how many hits are worth loading, docs/decision.md) is honoured: Retrieve of
the first load_blocks hits (every layer, waited for), the other hits count as recomputed. Then
Store of the blocks after the hits (the engine computed them), in calls of at most call_blocks;
blocks tuttid refuses for full staging ("rejected_full": staging or the write backlog) are
offered again up to `store_retries` times, each call waiting up to staging_wait_ms for room,
then dropped (counted). With wait_durable each Store returns once its blocks are durable, so the
next request sees them (the mode whose counts equal the simulation's).

Memory: the engine's KV cache is `call_blocks` blocks in one shared-memory region laid out
[object][block][object_bytes]; every Retrieve and Store uses blocks [0, n). With `verify`, each
stored block is filled with bytes derived from its key and object index first, and every
retrieved block is compared with them (a mismatch raises ReplayError).
"""

import hashlib
import time
from dataclasses import dataclass, field
from typing import List

import tutti

import trace_format


class ReplayError(RuntimeError):
    """The replay cannot go on (a wrong byte, a broken call); the message says what."""


@dataclass(frozen=True)
class Geometry:
    """The replayed model's KV geometry: num_layers x (K, V) objects of object_bytes per block
    of block_tokens tokens."""
    block_tokens: int = 512
    num_layers: int = 2
    object_bytes: int = 16384

    def layout(self) -> tutti.KvLayout:
        per_token = self.object_bytes // self.block_tokens
        if per_token * self.block_tokens != self.object_bytes or per_token % 2:
            raise ValueError("object_bytes %d must be a multiple of 2 x block_tokens (%d)" %
                             (self.object_bytes, 2 * self.block_tokens))
        return tutti.KvLayout(num_layers=self.num_layers, kv_heads=1, head_dim=per_token // 2,
                              dtype_bytes=2, block_tokens=self.block_tokens)

    @property
    def num_objects(self) -> int:
        return 2 * self.num_layers

    @property
    def block_bytes(self) -> int:
        return self.num_objects * self.object_bytes


@dataclass
class RequestResult:
    index: int
    blocks: int = 0
    hits: int = 0
    loaded: int = 0
    load_failed: int = 0
    written: int = 0          # stored blocks tuttid took (captured or durable)
    already_present: int = 0
    dropped: int = 0          # refused every time, or failed
    refusals: int = 0         # rejected_full answers, retried or not
    declined: int = 0         # declined by tuttid's admission policy (pool.admission): not retried
    in_dram: int = 0          # kept in tuttid's DRAM only (pool.admission "dram_front"): not retried
    lag_s: float = 0.0        # started this long after its (scaled) arrival time
    retrieve_s: float = 0.0
    store_s: float = 0.0
    load_prefix: int = 0      # the chain's leading keys Retrieve was asked for (loaded or failed)
    stored_keys: List[bytes] = field(default_factory=list)  # keys tuttid took (captured, durable)
    errors: List[str] = field(default_factory=list)


def _content(key: bytes, obj: int, size: int) -> bytes:
    seed = hashlib.blake2b(key + obj.to_bytes(2, "little"), digest_size=64).digest()
    return (seed * (size // 64 + 1))[:size]


class TraceEngine:
    def __init__(self, socket_path: str, geometry: Geometry, call_blocks: int, name: str,
                 wait_durable: bool, store_retries: int = 3, staging_wait_ms: int = 1000,
                 verify: bool = False, model_id: str = "trace-replay"):
        self.geometry = geometry
        self.call_blocks = call_blocks
        self.wait_durable = wait_durable
        self.store_retries = store_retries
        self.staging_wait_ms = staging_wait_ms
        self.verify = verify
        layout = geometry.layout()
        ob = geometry.object_bytes
        self.shm = tutti.SharedMemory(geometry.num_objects * call_blocks * ob)
        region = self.shm.region()
        base = region[1]
        objects = [tutti.ObjectTensor(base + o * call_blocks * ob, ob)
                   for o in range(geometry.num_objects)]
        self.client = tutti.Client.attach(tutti.Namespace(model_id=model_id, layout=layout),
                                          call_blocks, objects, host_regions=[region],
                                          socket_path=socket_path, engine_id=name)
        limit = self.client.info["max_blocks_per_call"]
        if limit and call_blocks > limit:
            self.close()
            raise ReplayError("call_blocks %d is above tuttid's max_blocks_per_call %d" %
                              (call_blocks, limit))

    def close(self):
        try:
            self.client.detach()
        except AttributeError:
            pass
        self.shm.close()

    # --- engine memory ---
    def _offset(self, obj: int, block: int) -> int:
        return (obj * self.call_blocks + block) * self.geometry.object_bytes

    def _fill(self, keys):
        ob, buf = self.geometry.object_bytes, self.shm.buffer
        for b, key in enumerate(keys):
            for o in range(self.geometry.num_objects):
                at = self._offset(o, b)
                buf[at:at + ob] = _content(key, o, ob)

    def _check(self, keys, failed):
        ob, buf = self.geometry.object_bytes, self.shm.buffer
        for b, key in enumerate(keys):
            if b in failed:
                continue
            for o in range(self.geometry.num_objects):
                at = self._offset(o, b)
                if bytes(buf[at:at + ob]) != _content(key, o, ob):
                    raise ReplayError("block %s (object %d) came back with other bytes than "
                                      "were stored" % (key.hex(), o))

    # --- one request ---
    def serve(self, index: int, req: trace_format.Request) -> RequestResult:
        keys = trace_format.keys_of(trace_format.chain(req, self.geometry.block_tokens))
        res = RequestResult(index, blocks=len(keys))
        res.hits = self._lookup_and_load(keys, req.input_length, res)
        t = time.monotonic()
        for i in range(res.hits, len(keys), self.call_blocks):
            self._store(keys[i:i + self.call_blocks], res)
        res.store_s = time.monotonic() - t
        return res

    def serve_loads(self, index: int, keys) -> RequestResult:
        """Reads only (trace_sustained's pass alone): Lookup of `keys` (no prompt length, so no
        advice) in calls of at most call_blocks, Retrieve of every hit; no Store."""
        res = RequestResult(index, blocks=len(keys))
        for i in range(0, len(keys), self.call_blocks):
            part = keys[i:i + self.call_blocks]
            lease = self.client.lookup(part)
            self._load(lease, part[:lease.hits], res)
            res.hits += lease.hits
            if lease.hits < len(part):
                break
        return res

    def _lookup_and_load(self, keys, prompt_tokens, res) -> int:
        hits = 0
        one_call = len(keys) <= self.call_blocks
        for i in range(0, len(keys), self.call_blocks):
            part = keys[i:i + self.call_blocks]
            lease = self.client.lookup(part, prompt_tokens if one_call else None)
            load = min(lease.load_blocks, lease.hits) if one_call else lease.hits
            self._load(lease, part[:load], res)
            res.load_prefix = i + load
            hits += lease.hits
            if lease.hits < len(part):
                break
        return hits

    def _load(self, lease, keys, res):
        if not keys:
            if lease.hits:
                self.client.release(lease)
            return
        t = time.monotonic()
        outcome = self.client.retrieve(lease, keys, list(range(len(keys)))).wait()
        res.retrieve_s += time.monotonic() - t
        if not outcome.ok:
            res.errors.append("retrieve: %s: %s" % (outcome.code, outcome.message))
        failed = set(outcome.failed)
        res.loaded += len(keys) - len(failed)
        res.load_failed += len(failed)
        if self.verify:
            self._check(keys, failed)

    def _store(self, keys, res):
        if self.verify:
            self._fill(keys)
        blocks = list(range(len(keys)))
        for attempt in range(self.store_retries + 1):
            out = self.client.store([keys[b] for b in blocks], blocks,
                                    wait_durable=self.wait_durable,
                                    staging_wait_ms=self.staging_wait_ms)
            again = []
            for b, o in zip(blocks, out):
                if o in ("captured", "durable"):
                    res.written += 1
                    res.stored_keys.append(keys[b])
                elif o == "already_present":
                    res.already_present += 1
                elif o == "rejected_full":
                    res.refusals += 1
                    again.append(b)
                elif o == "declined":
                    res.declined += 1
                elif o == "in_dram":
                    res.in_dram += 1
                else:
                    res.dropped += 1
            if not again:
                return
            blocks = again
        res.dropped += len(blocks)

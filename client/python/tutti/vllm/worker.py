"""The connector's worker side (one per TP rank): attaches the rank's KV cache to its tuttid,
loads each step's prefixes in one Retrieve under the scheduler's leases, and stores each step's
new full blocks.

- register_kv_caches: geometry (tutti.vllm.geometry) -> namespace -> Client.attach with a random
  engine_group of this worker. Host mode (CI): the tensors must lie in SharedMemory given to
  register_host_memory() first; cuda mode: the tensors' device.
- start_load: Retrieves of every LoadSpec (RetrieveRequest.lease_ids = this rank's leases), as
  few as tuttid's bounds allow (max_blocks_per_call blocks, 1024 leases each: tutti.vllm.loads).
- wait_layer: Retrieval.wait_layer(l) on torch's current stream (cuda: a GPU-side wait, the host
  returns at once; host mode: blocks until the layer landed).
- saves, "end" (default): one Store per max_blocks_per_call blocks of all layers, in wait_for_save
  (cuda: after the forward's stream synced). "layer": cuda mode records an event per layer in
  save_layer and a background thread Stores that layer once its event completed (the forward's
  host thread never waits); wait_for_save waits for them. Host mode stores the layer at once.
- saves of a step that loads: its blocks may be computed on top of the loaded ones (the loading
  requests', and those of requests whose GPU prefix hits are blocks being loaded), so nothing of
  the step is stored before the load's outcome is known: wait_for_save waits for the Retrieve
  first ("layer": the step's layers are held and stored whole there). If any load of the step
  failed on any TP rank (under TP every rank's KV past the loaded prefix depends on every rank's
  loaded KV: the ranks agree through one all-reduce over vLLM's TP CPU group, in each step that
  loads), every save of the step is dropped (counted, cause "computed over a failed load"); the
  scheduler side saves again what vLLM recomputes (TuttiScheduler.update_connector_output). vLLM
  calls wait_for_save before get_block_ids_with_load_errors, and a stored block cannot be taken
  back.
  Blocks tuttid refused (store staging full) become pending saves (tutti.vllm.saves), retried
  whole by a background thread while vLLM holds the blocks: handle_preemptions drops a
  preempted request's and waits for its retry in flight; get_finished reports a request that
  had saves in finished_sending once nothing of it is pending (the scheduler's request_finished
  returned True for exactly those). Given up after retry_deadline_s, when tuttid is away, past
  max_pending_saves blocks, or on a failed Store: counted and logged with the cause.
- load_errors: the vLLM block ids of blocks that did not load, in the step they were loaded
  (sync loading: the Retrieve is waited for in wait_for_save / load_errors). A dead tuttid breaks
  the Retrieve (deadline or session end): every block of it is reported.

Thread-safety: vLLM calls the worker hooks from one thread; the layer saver and the save
retrier have their own threads.
"""

import logging
import os
import queue
import threading
import time
from typing import List, Optional

import tutti
from tutti import errors
from tutti.vllm import geometry as geo
from tutti.vllm import loads
from tutti.vllm.keys import namespace
from tutti.vllm.metadata import TuttiConnectorMetadata, TuttiHandshake
from tutti.vllm.saves import PendingSaves

log = logging.getLogger("tutti.vllm")

_HOST_MEMORY: List[object] = []
_HOST_LOCK = threading.Lock()


def register_host_memory(shm) -> None:
    """Host mode: `shm` (a tutti.SharedMemory) holds KV cache tensors this process will
    register (register_kv_caches). Call before that; the memory must outlive the connector."""
    with _HOST_LOCK:
        _HOST_MEMORY.append(shm)


def any_tp_rank(flag: bool) -> bool:
    """Whether `flag` is True on any TP rank: an all-reduce over vLLM's TP group (its gloo CPU
    group). Every rank must call it in the same step."""
    import torch
    import torch.distributed as dist
    from vllm.distributed.parallel_state import get_tp_group
    t = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=get_tp_group().cpu_group)
    return bool(t.item())


def _host_regions(g: geo.Geometry):
    """The registered SharedMemory regions that hold every object of `g`."""
    with _HOST_LOCK:
        shms = [s for s in _HOST_MEMORY if s.fd is not None]
    stride = max(o.block_stride for o in g.objects)
    used = []
    for o in g.objects:
        end = o.base + (g.num_blocks - 1) * o.block_stride + g.layout.object_bytes
        holder = next((s for s in shms if s.address <= o.base and end <= s.address + s.size),
                      None)
        if holder is None:
            raise ValueError("host-mode KV cache at 0x%x (%d blocks of stride %d) is not inside "
                             "shared memory given to tutti.vllm.register_host_memory()" %
                             (o.base, g.num_blocks, stride))
        if holder not in used:
            used.append(holder)
    return [s.region() for s in used]


class TuttiWorker:
    def __init__(self, model_config, kv_cache_config, tp_rank: int, tp_size: int, socket: str,
                 save_mode: str = "end", vllm_version: str = "unknown",
                 timeouts: Optional[tutti.Timeouts] = None, retry_deadline_s: float = 10.0,
                 max_pending_saves: int = 4096, clock=time.monotonic,
                 namespace_secret: bytes = b"", any_rank=any_tp_rank):
        """any_rank(flag): whether flag is True on any TP rank (called by every rank in each
        step that loads, when tp_size > 1)."""
        if save_mode not in ("end", "layer"):
            raise ValueError("kv_connector_extra_config save: %r; give \"end\" or \"layer\"" %
                             (save_mode,))
        self.tp_rank, self.tp_size, self.socket = tp_rank, tp_size, socket
        self.save_mode = save_mode
        self._model_config = model_config
        self._kv_cache_config = kv_cache_config
        self._version = vllm_version
        self._timeouts = timeouts
        self.engine_group = os.urandom(16)
        self._any_rank = any_rank
        self.namespace_secret = namespace_secret
        self.geometry = None
        self.namespace = None
        self.client = None
        self._meta = None
        self._retrieval = None
        self._load_blocks: List[int] = []
        self._load_failed = False  # a load of this step failed on this rank
        self._errors = set()
        self._saver = None
        self._step: Optional[_Step] = None
        self._retry_stream = None
        self._pending = PendingSaves(self._retry_store, deadline_s=retry_deadline_s,
                                     max_blocks=max_pending_saves, clock=clock,
                                     name="TP rank %d" % tp_rank)

    # --- start-up ---
    def register_kv_caches(self, kv_caches):
        g = geo.derive(kv_caches, self._kv_cache_config)
        self.geometry = g
        self.namespace = namespace(self._model_config, g, self.tp_rank, self.tp_size,
                                   self._version)
        common = dict(socket_path=self.socket, engine_id="vllm-worker-rank%d" % self.tp_rank,
                      engine_group=self.engine_group, timeouts=self._timeouts,
                      namespace_secret=self.namespace_secret)
        if g.device is not None:
            self.client = tutti.Client.attach(self.namespace, g.num_blocks, list(g.objects),
                                              cuda_device=g.device, **common)
        else:
            self.client = tutti.Client.attach(self.namespace, g.num_blocks, list(g.objects),
                                              host_regions=_host_regions(g), **common)
        self._on_attached()
        log.info("TP rank %d attached to tuttid at %s: %s, %s, %d blocks", self.tp_rank,
                 self.socket, self.namespace.model_id, g.order, g.num_blocks)

    def _on_attached(self):
        """After self.client and self.geometry are set (tests set them to fakes and call this):
        the layer saver and the retry thread (cuda mode: its Stores sync an idle side stream)."""
        if self.geometry.device is not None:
            import torch
            self._retry_stream = torch.cuda.Stream(device=self.geometry.device)
            if self.save_mode == "layer":
                self._saver = _LayerSaver(self)
        self._pending.start()

    def handshake(self) -> TuttiHandshake:
        if self.namespace is None:
            raise RuntimeError("TuttiConnector: get_handshake_metadata before register_kv_caches")
        return TuttiHandshake(self.tp_rank, self.socket, self.namespace, self.engine_group,
                              self.namespace_secret)

    # --- loads ---
    def bind(self, meta: TuttiConnectorMetadata):
        """The step's metadata: its preemptions are handled first (as handle_preemptions), its
        saves' requests are expected in finished_sending (the scheduler holds their blocks)."""
        self._meta = meta
        self._load_failed = False
        self.handle_preemptions(getattr(meta, "preempted", None))
        saves = list(getattr(meta, "saves", None) or ())
        self._step = None
        if not saves:
            return
        self._pending.expect(spec.req_id for spec in saves)
        if self.client is None:
            self._pending.give_up("not attached", sum(len(s.keys) for s in saves))
            return
        self._step = _Step(self, saves, held=bool(getattr(meta, "loads", None)))

    def start_load(self):
        meta = self._meta
        if meta is None or not meta.loads or self.client is None:
            return
        limit = max(int(self.client.info.get("max_blocks_per_call") or 512), 1)
        self._retrieval, self._load_blocks, refused = loads.start(self.client, meta.loads,
                                                                  self.tp_rank, limit)
        self._errors.update(refused)
        if refused:
            self._load_failed = True

    def wait_layer(self, layer_name):
        r = self._retrieval
        if r is None:
            return
        try:
            r.wait_layer(self.geometry.layer_index(layer_name))
        except errors.TuttiError:
            pass  # the transfer broke: its blocks are reported by load_errors

    def _finish_load(self):
        r, self._retrieval = self._retrieval, None
        if r is None:
            return
        outcome = r.wait()
        if not outcome.ok:
            log.info("TP rank %d: Retrieve broke (%s: %s); %d blocks recomputed", self.tp_rank,
                     outcome.code, outcome.message, len(self._load_blocks))
        failed = [self._load_blocks[i] for i in outcome.failed]
        if failed or not outcome.ok:
            self._load_failed = True
        self._errors.update(failed)
        self._load_blocks = []

    def load_errors(self):
        self._finish_load()
        out, self._errors = self._errors, set()
        return out

    # --- saves ---
    def save_layer(self, layer_name, kv_layer):
        if self.save_mode != "layer" or self._step is None:
            return
        layer = self.geometry.layer_index(layer_name)
        if self._saver is not None:
            self._saver.layer_done(self._step, layer)
        else:
            self._step.store(layer, layer + 1)

    def wait_for_save(self):
        """The step's saves, once its load's outcome is known (the module's docstring)."""
        step, self._step = self._step, None
        if step is not None and self._saver is not None:
            self._saver.drain()
        self._finish_load()
        meta = self._meta
        if self.tp_size > 1 and meta is not None and getattr(meta, "loads", None):
            self._load_failed = self._any_rank(self._load_failed)
        if step is None:
            return
        if self._load_failed:
            step.drop("computed over a failed load")
        elif self.save_mode == "end" or step.held:
            step.held = False
            step.store(0, 0)
        step.settle()

    def handle_preemptions(self, preempted_req_ids):
        """Before vLLM reuses the blocks of preempted requests: their pending saves are dropped,
        and a retry Store that reads any of them has ended when this returns."""
        if self._pending is not None and preempted_req_ids:
            self._pending.drop(preempted_req_ids)

    def get_finished(self, finished_req_ids):
        """finished_sending: the requests that had saves, that vLLM said finished (in this call
        or an earlier one), and whose pending saves are stored or given up."""
        if self._pending is None:
            done = self._expected & set(finished_req_ids or ())
            self._expected -= done
        else:
            done = self._pending.finished(finished_req_ids or ())
        return (done or None), None

    def save_stats(self):
        """Blocks refused, stored late, given up per cause (PendingSaves.stats), or {}."""
        return self._pending.stats() if self._pending is not None else {}

    def _retry_store(self, keys, blocks):
        return self.client.store(keys, blocks, stream=self._retry_stream)

    def clear(self):
        self._meta = None
        self._step = None

    def shutdown(self):
        if self._saver is not None:
            self._saver.close()
        self._pending.close()
        if self.client is not None:
            self.client.detach()
            self.client = None


class _Step:
    """One step's saves: the flat (request, key, block) lists of its SaveSpecs, stored by
    store(layers) once ("end") or per layer ("layer"); settle() hands what tuttid refused to the
    worker's PendingSaves as whole blocks (all layers). In "layer" mode a block refused at one
    layer gets none of its later layers this step: sending them would capture a partial block
    that holds staging until tuttid's partial_store_ttl_ms drops it. A whole-block retry copies
    only the layers tuttid lacks and completes such a partial if it exists.

    Thread-safety: store() runs on the forward's thread or on the layer saver's, one at a time
    (the saver's queue); settle() after them (wait_for_save)."""

    def __init__(self, worker, saves, held=False):
        self._w = worker
        self.held = held      # the step loads: nothing is stored before wait_for_save
        self.reqs, self.keys, self.blocks = [], [], []
        for spec in saves:
            self.reqs.extend([spec.req_id] * len(spec.keys))
            self.keys.extend(spec.keys)
            self.blocks.extend(spec.block_ids)
        self.done = set()     # indices that need no more layers (stored, present, or dropped)
        self.refused = set()  # indices tuttid refused (rejected_full): retried whole
        self.why = ""
        self.lost = False     # tuttid away or the Store failed: the rest of the step is dropped

    def drop(self, cause):
        """Nothing more of the step is stored: counted as given up for `cause`."""
        left = [i for i in range(len(self.keys)) if i not in self.done]
        self.done.update(left)
        self.refused.clear()
        self.lost = True
        if left:
            log.info("TP rank %d: %d blocks not stored: %s", self._w.tp_rank, len(left), cause)
            self._w._pending.give_up(cause, len(left))

    def store(self, layer_begin, layer_end, stream=None):
        if self.lost or self.held:
            return
        w = self._w
        todo = [i for i in range(len(self.keys)) if i not in self.done]
        limit = max(int(w.client.info.get("max_blocks_per_call") or 512), 1)
        for c in range(0, len(todo), limit):
            part = todo[c:c + limit]
            try:
                out = w.client.store([self.keys[i] for i in part], [self.blocks[i] for i in part],
                                     layer_begin=layer_begin, layer_end=layer_end, stream=stream)
            except errors.TuttiError as e:
                left = [i for i in range(len(self.keys)) if i not in self.done]
                self.done.update(left)
                self.refused.difference_update(left)
                self.lost = True
                cause = ("tuttid away (%s)" if isinstance(e, errors.Unavailable) else
                         "Store failed (%s)") % e
                w._pending.give_up(cause, len(left))
                return
            self.why = getattr(out, "rejected_why", "") or self.why
            last = layer_end == 0 or layer_end >= w.geometry.layout.num_layers
            for i, o in zip(part, out):
                if o == "rejected_full":
                    self.refused.add(i)
                    self.done.add(i)
                elif o == "failed":
                    self.done.add(i)
                    w._pending.give_up("Store outcome failed", 1)
                elif o == "already_present" or last:
                    self.done.add(i)

    def settle(self):
        by_req = {}
        for i in sorted(self.refused):
            by_req.setdefault(self.reqs[i], []).append(i)
        for req_id, idx in by_req.items():
            self._w._pending.add(req_id, [self.keys[i] for i in idx],
                                 [self.blocks[i] for i in idx], self.why)


class _LayerSaver:
    """cuda mode, save "layer": save_layer records a CUDA event on the forward's stream; this
    thread waits for the event on the host and Stores the layer (Client.store syncs its idle
    side stream, not the forward's). drain() waits until every queued layer was handled, so
    every layer of the step is complete once it returns (pending retries rely on that)."""

    def __init__(self, worker: TuttiWorker):
        import torch
        self._torch = torch
        self._worker = worker
        self._queue = queue.Queue()
        self._stream = torch.cuda.Stream(device=worker.geometry.device)
        self._thread = threading.Thread(target=self._run, daemon=True, name="tutti-layer-save")
        self._thread.start()

    def layer_done(self, step, layer):
        ev = self._torch.cuda.Event()
        ev.record(self._torch.cuda.current_stream())
        self._queue.put((step, layer, ev))

    def _run(self):
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                step, layer, ev = item
                ev.synchronize()
                step.store(layer, layer + 1, stream=self._stream)
            finally:
                self._queue.task_done()

    def drain(self):
        self._queue.join()

    def close(self):
        self._queue.put(None)
        self._thread.join(timeout=5.0)

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
- Hybrid models (several KV cache groups, tutti.vllm.groups): one session per group, each with
  the group's layers, layout and namespace (tutti.vllm.groups.group_namespace); LoadSpecs and
  SaveSpecs name their group, and a layer's waits and saves go to its group's Retrieve and Store.
  A sliding-window group's refused blocks are not retried: vLLM frees a block once it leaves
  the window, while the request runs, without telling the worker (given up, counted).

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
from tutti.client import StoreOutcomes
from tutti.vllm import geometry as geo
from tutti.vllm import groups as kvgroups
from tutti.vllm import loads
from tutti.vllm.keys import namespace
from tutti.vllm.metadata import TuttiConnectorMetadata, TuttiHandshake
from tutti.vllm.saves import PendingSaves

log = logging.getLogger("tutti.vllm")

# Pending saves of group g > 0 carry block | g << _GROUP_SHIFT (one PendingSaves per worker).
_GROUP_SHIFT = 32

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
        # Per KV cache group (one when not hybrid): its Group (None: no spec given), Geometry,
        # Namespace and Client; layer name -> (group, layer of the group's layout).
        self.groups: List[Optional[kvgroups.Group]] = []
        self._geometries: List[object] = []
        self._namespaces: List[object] = []
        self._clients: List[object] = []
        self._layer_of = {}
        self._hybrid = False  # several groups, or a sliding one: a namespace per group
        self._meta = None
        self._loading = {}  # group -> (its Retrievals, the vLLM block ids they load, in order)
        self._load_failed = False  # a load of this step failed on this rank
        self._errors = set()
        self._saver = None
        self._steps = {}  # group -> the step's _Step of that group
        self._retry_stream = None
        self._pending = PendingSaves(self._retry_store, deadline_s=retry_deadline_s,
                                     max_blocks=max_pending_saves, clock=clock,
                                     name="TP rank %d" % tp_rank)

    # --- group 0's (the only group's) geometry, namespace and client ---
    @property
    def geometry(self):
        return self._geometries[0] if self._geometries else None

    @geometry.setter
    def geometry(self, g):
        self._geometries[:1] = [g]

    @property
    def namespace(self):
        return self._namespaces[0] if self._namespaces else None

    @namespace.setter
    def namespace(self, ns):
        self._namespaces[:1] = [ns]

    @property
    def client(self):
        return self._clients[0] if self._clients else None

    @client.setter
    def client(self, c):
        self._clients[:1] = [c]

    # --- start-up ---
    def register_kv_caches(self, kv_caches):
        """Derives every KV cache group's geometry (refusing what the connector cannot serve,
        tutti.vllm.groups) and attaches one session per group."""
        pairs = geo.derive_groups(kv_caches, self._kv_cache_config)
        self.groups = [g for g, _ in pairs]
        self._geometries = [geom for _, geom in pairs]
        hybrid = pairs[0][0] is not None and kvgroups.is_hybrid(self.groups)
        self._hybrid = hybrid
        self._namespaces = []
        for g, geom in pairs:
            ns = namespace(self._model_config, geom, self.tp_rank, self.tp_size, self._version)
            if hybrid:
                ns = kvgroups.group_namespace(ns, g, len(pairs))
            self._namespaces.append(ns)
        self._layer_of = {name: (gi, li) for gi, geom in enumerate(self._geometries)
                          for li, name in enumerate(geom.layer_names)}
        common = dict(socket_path=self.socket, engine_group=self.engine_group,
                      timeouts=self._timeouts, namespace_secret=self.namespace_secret)
        self._clients = []
        try:
            for gi, (geom, ns) in enumerate(zip(self._geometries, self._namespaces)):
                engine_id = "vllm-worker-rank%d" % self.tp_rank + ("-group%d" % gi if hybrid
                                                                   else "")
                if geom.device is not None:
                    c = tutti.Client.attach(ns, geom.num_blocks, list(geom.objects),
                                            cuda_device=geom.device, engine_id=engine_id,
                                            **common)
                else:
                    c = tutti.Client.attach(ns, geom.num_blocks, list(geom.objects),
                                            host_regions=_host_regions(geom),
                                            engine_id=engine_id, **common)
                self._clients.append(c)
        except BaseException:
            for c in self._clients:
                c.detach()
            self._clients = []
            raise
        self._on_attached()
        for ns, geom in zip(self._namespaces, self._geometries):
            log.info("TP rank %d attached to tuttid at %s: %s, %s, %d blocks", self.tp_rank,
                     self.socket, ns.model_id, geom.order, geom.num_blocks)

    def _where(self, layer_name):
        """(group, layer of the group's layout) of vLLM layer `layer_name`."""
        if self._layer_of:
            return self._layer_of[layer_name]
        return 0, self.geometry.layer_index(layer_name)

    def _retries(self, group: int) -> bool:
        """Whether refused blocks of `group` may be retried after their step: not for a
        sliding-window group (vLLM frees its blocks as they leave the window)."""
        g = self.groups[group] if group < len(self.groups) else None
        return g is None or g.kind != kvgroups.SLIDING

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
                              self.namespace_secret,
                              tuple(self._namespaces) if self._hybrid else ())

    # --- loads ---
    def bind(self, meta: TuttiConnectorMetadata):
        """The step's metadata: its preemptions are handled first (as handle_preemptions), its
        saves' requests are expected in finished_sending (the scheduler holds their blocks)."""
        self._meta = meta
        self._load_failed = False
        self.handle_preemptions(getattr(meta, "preempted", None))
        saves = list(getattr(meta, "saves", None) or ())
        self._steps = {}
        if not saves:
            return
        self._pending.expect(spec.req_id for spec in saves)
        by_group = {}
        for spec in saves:
            by_group.setdefault(getattr(spec, "group", 0), []).append(spec)
        held = bool(getattr(meta, "loads", None))
        for g, specs in sorted(by_group.items()):
            if g >= len(self._clients) or self._clients[g] is None:
                self._pending.give_up("not attached", sum(len(s.keys) for s in specs))
                continue
            self._steps[g] = _Step(self, specs, held=held, group=g)

    def start_load(self):
        meta = self._meta
        if meta is None or not meta.loads:
            return
        by_group = {}
        for spec in meta.loads:
            by_group.setdefault(getattr(spec, "group", 0), []).append(spec)
        for g, specs in sorted(by_group.items()):
            client = self._clients[g] if g < len(self._clients) else None
            if client is None:
                self._errors.update(b for s in specs for b in s.block_ids)
                self._load_failed = True
                continue
            limit = max(int(client.info.get("max_blocks_per_call") or 512), 1)
            r, blocks, refused = loads.start(client, specs, self.tp_rank, limit)
            if r is not None:
                self._loading[g] = (r, blocks)
            self._errors.update(refused)
            if refused:
                self._load_failed = True

    def wait_layer(self, layer_name):
        if not self._loading:
            return
        g, layer = self._where(layer_name)
        r = self._loading.get(g)
        if r is None:
            return
        try:
            r[0].wait_layer(layer)
        except errors.TuttiError:
            pass  # the transfer broke: its blocks are reported by load_errors

    def _finish_load(self):
        loading, self._loading = self._loading, {}
        for r, blocks in loading.values():
            outcome = r.wait()
            if not outcome.ok:
                log.info("TP rank %d: Retrieve broke (%s: %s); %d blocks recomputed",
                         self.tp_rank, outcome.code, outcome.message, len(blocks))
            failed = [blocks[i] for i in outcome.failed]
            if failed or not outcome.ok:
                self._load_failed = True
            self._errors.update(failed)

    def load_errors(self):
        self._finish_load()
        out, self._errors = self._errors, set()
        return out

    # --- saves ---
    def save_layer(self, layer_name, kv_layer):
        if self.save_mode != "layer" or not self._steps:
            return
        g, layer = self._where(layer_name)
        step = self._steps.get(g)
        if step is None:
            return
        if self._saver is not None:
            self._saver.layer_done(step, layer)
        else:
            step.store(layer, layer + 1)

    def wait_for_save(self):
        """The step's saves, once its load's outcome is known (the module's docstring)."""
        steps, self._steps = self._steps, {}
        if steps and self._saver is not None:
            self._saver.drain()
        self._finish_load()
        meta = self._meta
        if self.tp_size > 1 and meta is not None and getattr(meta, "loads", None):
            self._load_failed = self._any_rank(self._load_failed)
        for step in steps.values():
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
        """Stores a retry batch: group 0's blocks as they are, group g's (block | g << 32) with
        group g's client; one outcome per key, in order."""
        if all(b >> _GROUP_SHIFT == 0 for b in blocks):
            return self.client.store(keys, blocks, stream=self._retry_stream)
        by_group = {}
        for i, b in enumerate(blocks):
            by_group.setdefault(b >> _GROUP_SHIFT, []).append(i)
        out, why = [None] * len(keys), ""
        for g, idx in sorted(by_group.items()):
            mask = (1 << _GROUP_SHIFT) - 1
            res = self._clients[g].store([keys[i] for i in idx], [blocks[i] & mask for i in idx],
                                         stream=self._retry_stream)
            why = getattr(res, "rejected_why", "") or why
            for i, o in zip(idx, res):
                out[i] = o
        res = StoreOutcomes(out)
        res.rejected_why = why
        return res

    def clear(self):
        self._meta = None
        self._steps = {}

    def shutdown(self):
        if self._saver is not None:
            self._saver.close()
        self._pending.close()
        clients, self._clients = self._clients, []
        for c in clients:
            if c is not None:
                c.detach()


class _Step:
    """One step's saves: the flat (request, key, block) lists of its SaveSpecs, stored by
    store(layers) once ("end") or per layer ("layer"); settle() hands what tuttid refused to the
    worker's PendingSaves as whole blocks (all layers). In "layer" mode a block refused at one
    layer gets none of its later layers this step: sending them would capture a partial block
    that holds staging until tuttid's partial_store_ttl_ms drops it. A whole-block retry copies
    only the layers tuttid lacks and completes such a partial if it exists.

    Thread-safety: store() runs on the forward's thread or on the layer saver's, one at a time
    (the saver's queue); settle() after them (wait_for_save)."""

    def __init__(self, worker, saves, held=False, group=0):
        self._w = worker
        self.group = group    # the KV cache group whose client and layers these are
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
        client = w._clients[self.group]
        todo = [i for i in range(len(self.keys)) if i not in self.done]
        limit = max(int(client.info.get("max_blocks_per_call") or 512), 1)
        for c in range(0, len(todo), limit):
            part = todo[c:c + limit]
            try:
                out = client.store([self.keys[i] for i in part], [self.blocks[i] for i in part],
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
            last = layer_end == 0 or layer_end >= w._geometries[self.group].layout.num_layers
            for i, o in zip(part, out):
                if o == "rejected_full":
                    self.refused.add(i)
                    self.done.add(i)
                elif o == "failed":
                    self.done.add(i)
                    w._pending.give_up("Store outcome failed", 1)
                elif o in ("already_present", "declined", "in_dram") or last:
                    # declined: tuttid's admission policy did not write it; in_dram: kept in its
                    # DRAM only (dram_front); neither is an error
                    self.done.add(i)

    def settle(self):
        if self.refused and not self._w._retries(self.group):
            n = len(self.refused)
            self.refused.clear()
            self._w._pending.give_up("refused, sliding-window group %d: not retried (vLLM frees "
                                     "its blocks as they leave the window)" % self.group, n,
                                     self.why)
            return
        by_req = {}
        for i in sorted(self.refused):
            by_req.setdefault(self.reqs[i], []).append(i)
        tag = self.group << _GROUP_SHIFT
        for req_id, idx in by_req.items():
            self._w._pending.add(req_id, [self.keys[i] for i in idx],
                                 [self.blocks[i] | tag for i in idx], self.why)


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

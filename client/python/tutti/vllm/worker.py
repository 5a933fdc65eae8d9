"""The connector's worker side (one per TP rank): attaches the rank's KV cache to its tuttid,
loads each step's prefixes in one Retrieve under the scheduler's leases, and stores each step's
new full blocks.

- register_kv_caches: geometry (tutti.vllm.geometry) -> namespace -> Client.attach with a random
  engine_group of this worker. Host mode (CI): the tensors must lie in SharedMemory given to
  register_host_memory() first; cuda mode: the tensors' device.
- start_load: one Retrieve of every LoadSpec (RetrieveRequest.lease_ids = this rank's leases).
  At most max_blocks_per_call blocks and 1024 leases per step: the rest are reported failed.
- wait_layer: Retrieval.wait_layer(l) on torch's current stream (cuda: a GPU-side wait, the host
  returns at once; host mode: blocks until the layer landed).
- saves, "end" (default): one Store per max_blocks_per_call blocks of all layers, in wait_for_save
  (cuda: after the forward's stream synced). "layer": cuda mode records an event per layer in
  save_layer and a background thread Stores that layer once its event completed (the forward's
  host thread never waits); wait_for_save waits for them. Host mode stores the layer at once.
  A failed Store is logged and dropped (a later miss).
- load_errors: the vLLM block ids of blocks that did not load, in the step they were loaded
  (sync loading: the Retrieve is waited for in wait_for_save / load_errors). A dead tuttid breaks
  the Retrieve (deadline or session end): every block of it is reported.

Thread-safety: vLLM calls the worker hooks from one thread; the layer saver has its own thread.
"""

import logging
import os
import queue
import threading
from typing import List, Optional

import tutti
from tutti import errors
from tutti.vllm import geometry as geo
from tutti.vllm.keys import namespace
from tutti.vllm.metadata import TuttiConnectorMetadata, TuttiHandshake

log = logging.getLogger("tutti.vllm")

_HOST_MEMORY: List[object] = []
_HOST_LOCK = threading.Lock()
MAX_LEASES = 1024


def register_host_memory(shm) -> None:
    """Host mode: `shm` (a tutti.SharedMemory) holds KV cache tensors this process will
    register (register_kv_caches). Call before that; the memory must outlive the connector."""
    with _HOST_LOCK:
        _HOST_MEMORY.append(shm)


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
                 timeouts: Optional[tutti.Timeouts] = None):
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
        self.geometry = None
        self.namespace = None
        self.client = None
        self._meta = None
        self._retrieval = None
        self._load_blocks: List[int] = []
        self._errors = set()
        self._saver = None

    # --- start-up ---
    def register_kv_caches(self, kv_caches):
        g = geo.derive(kv_caches, self._kv_cache_config)
        self.geometry = g
        self.namespace = namespace(self._model_config, g, self.tp_rank, self.tp_size,
                                   self._version)
        common = dict(socket_path=self.socket, engine_id="vllm-worker-rank%d" % self.tp_rank,
                      engine_group=self.engine_group, timeouts=self._timeouts)
        if g.device is not None:
            self.client = tutti.Client.attach(self.namespace, g.num_blocks, list(g.objects),
                                              cuda_device=g.device, **common)
        else:
            self.client = tutti.Client.attach(self.namespace, g.num_blocks, list(g.objects),
                                              host_regions=_host_regions(g), **common)
        if self.save_mode == "layer" and g.device is not None:
            self._saver = _LayerSaver(self)
        log.info("TP rank %d attached to tuttid at %s: %s, %s, %d blocks", self.tp_rank,
                 self.socket, self.namespace.model_id, g.order, g.num_blocks)

    def handshake(self) -> TuttiHandshake:
        if self.namespace is None:
            raise RuntimeError("TuttiConnector: get_handshake_metadata before register_kv_caches")
        return TuttiHandshake(self.tp_rank, self.socket, self.namespace, self.engine_group)

    # --- loads ---
    def bind(self, meta: TuttiConnectorMetadata):
        self._meta = meta

    def start_load(self):
        meta = self._meta
        if meta is None or not meta.loads or self.client is None:
            return
        keys, blocks, leases = [], [], []
        limit = max(int(self.client.info.get("max_blocks_per_call") or 512), 1)
        for spec in meta.loads:
            lease = spec.lease_ids.get(self.tp_rank, 0)
            if not lease or len(keys) + len(spec.keys) > limit or len(leases) >= MAX_LEASES:
                self._errors.update(spec.block_ids)
                continue
            keys.extend(spec.keys)
            blocks.extend(spec.block_ids)
            leases.append(lease)
        if not keys:
            return
        try:
            self._retrieval = self.client.retrieve(None, keys, blocks, more_leases=leases)
            self._load_blocks = blocks
        except errors.TuttiError as e:
            log.info("TP rank %d: Retrieve of %d blocks refused: %s", self.tp_rank, len(keys), e)
            self._errors.update(blocks)

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
        self._errors.update(self._load_blocks[i] for i in outcome.failed)
        self._load_blocks = []

    def load_errors(self):
        self._finish_load()
        out, self._errors = self._errors, set()
        return out

    # --- saves ---
    def save_layer(self, layer_name, kv_layer):
        if self.save_mode != "layer" or not self._saves():
            return
        layer = self.geometry.layer_index(layer_name)
        if self._saver is not None:
            self._saver.layer_done(layer)
        else:
            self._store(layer, layer + 1)

    def wait_for_save(self):
        if self._saves():
            if self.save_mode == "end":
                self._store(0, 0)
            elif self._saver is not None:
                self._saver.drain()
        self._finish_load()

    def _saves(self):
        return self._meta.saves if self._meta is not None and self.client is not None else []

    def _store(self, layer_begin, layer_end, stream=None):
        keys, blocks = [], []
        for spec in self._saves():
            keys.extend(spec.keys)
            blocks.extend(spec.block_ids)
        limit = max(int(self.client.info.get("max_blocks_per_call") or 512), 1)
        for i in range(0, len(keys), limit):
            try:
                self.client.store(keys[i:i + limit], blocks[i:i + limit], layer_begin=layer_begin,
                                  layer_end=layer_end, stream=stream)
            except errors.TuttiError as e:
                log.info("TP rank %d: Store of %d blocks dropped: %s", self.tp_rank,
                         len(keys[i:i + limit]), e)

    def clear(self):
        self._meta = None

    def shutdown(self):
        if self._saver is not None:
            self._saver.close()
        if self.client is not None:
            self.client.detach()
            self.client = None


class _LayerSaver:
    """cuda mode, save "layer": save_layer records a CUDA event on the forward's stream; this
    thread makes a side stream wait for it and Stores the layer (Client.store syncs the side
    stream, not the forward's). drain() waits until every queued layer was stored."""

    def __init__(self, worker: TuttiWorker):
        import torch
        self._torch = torch
        self._worker = worker
        self._queue = queue.Queue()
        self._stream = torch.cuda.Stream(device=worker.geometry.device)
        self._thread = threading.Thread(target=self._run, daemon=True, name="tutti-layer-save")
        self._thread.start()

    def layer_done(self, layer):
        ev = self._torch.cuda.Event()
        ev.record(self._torch.cuda.current_stream())
        self._queue.put((layer, ev))

    def _run(self):
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                layer, ev = item
                self._stream.wait_event(ev)
                self._worker._store(layer, layer + 1, stream=self._stream)
            finally:
                self._queue.task_done()

    def drain(self):
        self._queue.join()

    def close(self):
        self._queue.put(None)
        self._thread.join(timeout=5.0)

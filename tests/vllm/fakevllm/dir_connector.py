"""DirConnector: a reference KV connector, backed by a directory, written against vLLM's
KVConnectorBase_V1 exactly as an out-of-tree connector is (module fakevllm.dir_connector, class
DirConnector, built by vLLM's factory with the three-argument constructor). It exists to prove the
harness before TuttiConnector does, so it also fails on request.

Storage: <root>/rank<r>/<block hash hex>.pt holds one block of rank r, all layers: a tensor
[layers, heads, tokens, content]. A block is a hit only when every rank's file exists.

kv_connector_extra_config:
  root           the directory (required)
  fail_loads     {req_id: [block index in the request, ...]}: on that request's first load, those
                 blocks are not loaded (their slots get garbage) and are reported through
                 get_block_ids_with_load_errors, so vLLM recomputes them
  fail_ranks     the ranks whose workers fail them (default: every rank)
  corrupt_loads  like fail_loads, but the blocks get another block's bytes and nothing is
                 reported: the harness must catch it
  piecewise      requires_piecewise_for_cudagraph (default true: its loads and saves are per
                 layer); false lets the engine replay FULL graphs, without its layer hooks
"""

import os
from dataclasses import dataclass, field
from typing import Dict, List

import torch

from vllm.distributed.kv_events import BlockStored
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorHandshakeMetadata, KVConnectorMetadata, KVConnectorRole)
from vllm.distributed.parallel_state import (get_tensor_model_parallel_rank,
                                             get_tensor_model_parallel_world_size)

OK, FAIL, CORRUPT = "ok", "fail", "corrupt"


@dataclass
class DirHandshake(KVConnectorHandshakeMetadata):
    rank: int
    root: str


@dataclass
class LoadSpec:
    req_id: str
    hashes: List[bytes]
    block_ids: List[int]
    modes: List[str]           # OK, FAIL or CORRUPT per block
    fail_ranks: List[int]


@dataclass
class SaveSpec:
    req_id: str
    hashes: List[bytes]
    block_ids: List[int]


@dataclass
class DirConnectorMetadata(KVConnectorMetadata):
    loads: List[LoadSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)


@dataclass
class _Tracker:
    request: object
    block_ids: List[int]
    handled: int               # leading blocks loaded, present or already saved


def block_path(root: str, rank: int, block_hash: bytes) -> str:
    return os.path.join(root, "rank%d" % rank, block_hash.hex() + ".pt")


class DirConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.root = extra["root"]
        self.block_size = vllm_config.cache_config.block_size
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.fail_ranks = list(extra.get("fail_ranks", range(self.tp_size)))
        self.injected = {FAIL: dict(extra.get("fail_loads", {})),
                         CORRUPT: dict(extra.get("corrupt_loads", {}))}
        if role == KVConnectorRole.SCHEDULER:
            self.handshakes: Dict[int, DirHandshake] = {}
            self.trackers: Dict[str, _Tracker] = {}
            self.pending_loads: Dict[str, LoadSpec] = {}
            self.matched: Dict[str, tuple] = {}
            self.stored_in_flight: List[BlockStored] = []
            self.events: List[BlockStored] = []
        else:
            self.rank = get_tensor_model_parallel_rank()
            assert get_tensor_model_parallel_world_size() == self.tp_size
            os.makedirs(os.path.join(self.root, "rank%d" % self.rank), exist_ok=True)
            self.kv_caches = {}
            self.loaded_layers: Dict[int, list] = {}
            self.captured: Dict[bytes, list] = {}
            self.invalid = set()

    # ------------------------------------------------------------------ scheduler side
    def set_xfer_handshake_metadata(self, metadata):
        if sorted(metadata) != list(range(self.tp_size)):
            raise ValueError("handshake from ranks %s, want 0..%d" % (sorted(metadata),
                                                                       self.tp_size - 1))
        self.handshakes = dict(metadata)

    def _present(self, block_hash: bytes) -> bool:
        return all(os.path.exists(block_path(self.root, r, block_hash))
                   for r in range(self.tp_size))

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if len(self.handshakes) != self.tp_size:
            raise RuntimeError("get_num_new_matched_tokens before set_xfer_handshake_metadata")
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = 0
        while hits < max_blocks and self._present(request.block_hashes[hits]):
            hits += 1
        self.matched[request.request_id] = (hits, num_computed_tokens)
        return max(hits * self.block_size - num_computed_tokens, 0), False

    def _modes(self, req_id: str, indices) -> List[str]:
        modes = []
        for i in indices:
            mode = OK
            for kind in (FAIL, CORRUPT):
                if i in self.injected[kind].get(req_id, ()):
                    mode = kind
            modes.append(mode)
        return modes

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        req_id = request.request_id
        block_ids = list(blocks.get_block_ids()[0])
        hits, local_tokens = self.matched.pop(req_id, (0, 0))
        local_blocks = local_tokens // self.block_size
        self.trackers[req_id] = _Tracker(request, block_ids, max(hits, local_blocks))
        if num_external_tokens <= 0:
            return
        indices = list(range(local_blocks, hits))
        self.pending_loads[req_id] = LoadSpec(
            req_id, [request.block_hashes[i] for i in indices],
            [block_ids[i] for i in indices], self._modes(req_id, indices), self.fail_ranks)
        for kind in (FAIL, CORRUPT):  # injected once: the first load of the request
            self.injected[kind].pop(req_id, None)

    def build_connector_meta(self, scheduler_output):
        meta = DirConnectorMetadata(loads=list(self.pending_loads.values()))
        self.pending_loads.clear()
        computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            t = self.trackers[req_id]
            if req_id in cached.resumed_req_ids:
                t.block_ids = list(cached.new_block_ids[i][0])
            elif cached.new_block_ids[i] is not None:
                t.block_ids.extend(cached.new_block_ids[i][0])
            computed[req_id] = cached.num_computed_tokens[i]
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            t = self.trackers[req_id]
            full = min((computed[req_id] + n) // self.block_size, len(t.request.block_hashes))
            if full > t.handled:
                idx = range(t.handled, full)
                hashes = [t.request.block_hashes[j] for j in idx]
                meta.saves.append(SaveSpec(req_id, hashes, [t.block_ids[j] for j in idx]))
                self._stored_events(t.request, t.handled, full)
                t.handled = full
        return meta

    def _stored_events(self, request, first, end):
        for j in range(first, end):
            parent = request.block_hashes[j - 1] if j > 0 else None
            tokens = request.all_token_ids[j * self.block_size:(j + 1) * self.block_size]
            self.stored_in_flight.append(BlockStored([request.block_hashes[j]], parent,
                                                     list(tokens), self.block_size, None,
                                                     "DISK", None))

    def update_connector_output(self, connector_output):
        self.events.extend(self.stored_in_flight)  # the workers saved them in that step
        self.stored_in_flight = []

    def request_finished(self, request, block_ids):
        self.trackers.pop(request.request_id, None)
        self.matched.pop(request.request_id, None)
        return False, None

    def take_events(self):
        events, self.events = self.events, []
        return events

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return bool(extra_config.get("piecewise", True))

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches):
        for name, t in kv_caches.items():
            if t.dim() != 4:
                raise ValueError("%s: [blocks, heads, tokens, content] expected, got %s" %
                                 (name, tuple(t.shape)))
        self.kv_caches = dict(kv_caches)
        self.layer_index = {name: i for i, name in enumerate(kv_caches)}

    def get_handshake_metadata(self):
        return DirHandshake(self.rank, self.root)

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        self.loaded_layers = {}  # nothing of an earlier step's loads may land in this one

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        self.loaded_layers = {}
        for spec in meta.loads:
            for h, b, mode in zip(spec.hashes, spec.block_ids, spec.modes):
                if mode != OK and self.rank not in spec.fail_ranks:
                    mode = OK
                if mode == FAIL:
                    self.invalid.add(b)
                    data = None
                else:
                    data = torch.load(block_path(self.root, self.rank, h))
                    if mode == CORRUPT:
                        data = data + 1
                self.loaded_layers.setdefault(b, data)
        self.forward_layers = forward_context.no_compile_layers
        self.virtual_engine = forward_context.virtual_engine

    def wait_for_layer_load(self, layer_name):
        if not self.loaded_layers:  # no load this step (or it starts after the forward)
            return
        layer = self.layer_index[layer_name]
        dest = self.forward_layers[layer_name].kv_cache[self.virtual_engine]
        for b, data in self.loaded_layers.items():
            if data is None:
                dest[b].fill_(-1.0)  # a load that broke off: garbage in the slots
            else:
                dest[b].copy_(data[layer])

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        meta = self._get_connector_metadata()
        layer = self.layer_index[layer_name]
        for spec in meta.saves:
            for h, b in zip(spec.hashes, spec.block_ids):
                self.captured.setdefault(h, [None] * len(self.kv_caches))[layer] = \
                    kv_layer[b].clone()

    def wait_for_save(self):
        for h, layers in self.captured.items():
            path = block_path(self.root, self.rank, h)
            if os.path.exists(path):
                continue
            tmp = "%s.tmp%d" % (path, os.getpid())
            torch.save(torch.stack(layers), tmp)
            os.replace(tmp, path)
        self.captured = {}

    def get_block_ids_with_load_errors(self):
        invalid, self.invalid = self.invalid, set()
        return invalid


def evict(root: str, rank: int, block_hash: bytes) -> bool:
    """Removes one rank's copy of a block (a test's stand-in for an eviction)."""
    try:
        os.remove(block_path(root, rank, block_hash))
        return True
    except FileNotFoundError:
        return False

"""A fake vLLM engine (EngineCore) that drives any KV connector through vLLM's interface:

  Engine(EngineConfig(...)) starts the workers (fakevllm.executor: one process per TP rank, each
  building its WORKER connector, allocating and registering its KV cache), then the scheduler
  with its SCHEDULER connector (vLLM's factory: kv_connector_module_path), then the handshake:
  every worker's {tp_rank: connector.get_handshake_metadata()} merged into one dict and passed to
  the scheduler connector's set_xfer_handshake_metadata(), before the first request.
  step(): schedule -> execute on every worker -> update_from_output (see fakevllm.scheduler).
  generate(): add requests, step until all finished; per request a RequestResult.

What the harness checks on top of vLLM: every block a worker read with wrong KV must be among the
invalid_block_ids that worker's connector reported in that step (else the request is not
`verified`), and the output must equal the toy model's output computed without any cache
(`correct`).
"""

import hashlib
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        KVCacheTensor, MambaSpec, SlidingWindowSpec)
from vllm.v1.request import Request, RequestStatus
from vllm.utils.hashing import sha256_cbor

from fakevllm.executor import Executor
from fakevllm.kv_cache import DEFAULT_ORDER, CacheGeometry, layer_name
from fakevllm.scheduler import RequestStats, Scheduler, SchedulerConfig
from fakevllm.toy_model import sample
from fakevllm.worker import WorkerConfig, _Recorder


@dataclass
class EngineConfig:
    kv_transfer_config: Optional[KVTransferConfig] = None
    tp_size: int = 1
    num_layers: int = 4
    num_kv_heads: int = 4        # per rank
    head_size: int = 64
    block_size: int = 16
    num_gpu_blocks: int = 64     # including the null block 0
    order: str = DEFAULT_ORDER
    max_num_batched_tokens: int = 64
    max_num_seqs: int = 8
    max_model_len: int = 4096
    host: bool = True
    register_host_memory: bool = False
    device: Optional[str] = None  # "cuda:0": every worker's cache in device memory (host False)
    model: str = "fakevllm/toy-llama"
    hash_algo: str = "sha256_cbor"
    step_timeout: float = 60.0
    # vLLM's default: FULL graphs for uniform-decode batches, PIECEWISE for the rest; a
    # connector whose requires_piecewise_for_cudagraph(extra config) is True makes it PIECEWISE.
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    # EAGLE successor-aware prefix-cache hashing, told to the connectors
    # (set_eagle_prefix_cache_hashing): requests' num_publishable_block_hashes fence their blocks.
    eagle_prefix_cache_hashing: bool = False
    # A hybrid model (vLLM's hybrid KV cache manager): its KV cache groups, e.g.
    # (("sliding", 32), ("full",)) or (("full",), ("mamba",)); num_layers layers per group,
    # model layer l in group l % len(kv_groups), layer slot l // len(kv_groups) of the cache
    # shared by one layer of every group. None: one full-attention group.
    kv_groups: Optional[tuple] = None


@dataclass
class RequestResult:
    req_id: str
    output_token_ids: List[int]
    expected_token_ids: List[int]
    stats: RequestStats
    unreported_bad_blocks: Dict[int, List[int]] = field(default_factory=dict)  # rank -> blocks
    reported_bad_blocks: Dict[int, List[int]] = field(default_factory=dict)

    @property
    def verified(self) -> bool:
        """Every wrong block the model read was one the connector reported."""
        return not self.unreported_bad_blocks

    @property
    def correct(self) -> bool:
        return self.output_token_ids == self.expected_token_ids


def expected_output(prompt: List[int], max_tokens: int) -> List[int]:
    ctx, out = list(prompt), []
    for _ in range(max_tokens):
        out.append(sample(ctx))
        ctx.append(out[-1])
    return out


def _cudagraph_mode(config: EngineConfig) -> str:
    """vLLM's config: PIECEWISE where the connector's class requires it."""
    ktc = config.kv_transfer_config
    if ktc is None or config.cudagraph_mode in ("NONE", "PIECEWISE"):
        return config.cudagraph_mode
    cls = KVConnectorFactory.get_connector_class(ktc)
    if cls.requires_piecewise_for_cudagraph(dict(ktc.kv_connector_extra_config or {})):
        return "PIECEWISE"
    return config.cudagraph_mode


def _hybrid_config(config: EngineConfig, geometry):
    """vLLM's KVCacheConfig of a hybrid model, and each group's window (None: full attention;
    a Mamba group's is "mamba": the connector must refuse it before anything runs)."""
    n = len(config.kv_groups)
    ktc = config.kv_transfer_config
    if ktc is not None and not supports_hma(KVConnectorFactory.get_connector_class(ktc)):
        raise ValueError("vLLM turns its hybrid KV cache manager off for a connector without "
                         "SupportsHMA; the harness does not model that")
    groups, windows = [], []
    for g, kind in enumerate(config.kv_groups):
        names = [layer_name(j * n + g) for j in range(config.num_layers)]
        if kind[0] == "full":
            spec, w = FullAttentionSpec(config.block_size, config.num_kv_heads, config.head_size,
                                        torch.float32), None
        elif kind[0] == "sliding":
            spec = SlidingWindowSpec(config.block_size, config.num_kv_heads, config.head_size,
                                     torch.float32, sliding_window=int(kind[1]))
            w = int(kind[1])
        elif kind[0] == "mamba":
            spec = MambaSpec(config.block_size, shapes=((config.num_kv_heads, config.head_size),),
                             dtypes=(torch.float32,))
            w = "mamba"
        else:
            raise ValueError("kv_groups: %r is not full, sliding or mamba" % (kind,))
        groups.append(KVCacheGroupSpec(names, spec))
        windows.append(w)
    slot = geometry.nbytes // config.num_layers
    tensors = [KVCacheTensor(size=slot, shared_by=[layer_name(j * n + g) for g in range(n)])
               for j in range(config.num_layers)]
    return (KVCacheConfig(num_blocks=config.num_gpu_blocks, kv_cache_tensors=tensors,
                          kv_cache_groups=groups), tuple(windows))


def _sha256_pickle(x) -> bytes:
    return hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.vllm_config = VllmConfig(
            model_config=ModelConfig(model=config.model, dtype="float32"),
            cache_config=CacheConfig(block_size=config.block_size,
                                     prefix_caching_hash_algo=config.hash_algo),
            parallel_config=ParallelConfig(tensor_parallel_size=config.tp_size),
            kv_transfer_config=config.kv_transfer_config)
        self.geometry = CacheGeometry(config.num_layers, config.num_gpu_blocks,
                                      config.num_kv_heads, config.block_size, config.head_size,
                                      torch.float32, config.order)
        self.windows = None
        if config.kv_groups is None:
            names = [layer_name(i) for i in range(config.num_layers)]
            self.kv_cache_config = KVCacheConfig(
                num_blocks=config.num_gpu_blocks,
                kv_cache_tensors=[KVCacheTensor(size=self.geometry.nbytes, shared_by=names)],
                kv_cache_groups=[KVCacheGroupSpec(names, FullAttentionSpec(
                    config.block_size, config.num_kv_heads, config.head_size, torch.float32))])
        else:
            self.kv_cache_config, self.windows = _hybrid_config(config, self.geometry)
        self.cudagraph_mode = _cudagraph_mode(config)
        self._dist_dir = tempfile.mkdtemp(prefix="fakevllm-dist-",
                                          dir=os.environ.get("TEST_TMPDIR"))
        dist_init = "file://" + os.path.join(self._dist_dir, "init")
        self.executor = Executor([WorkerConfig(r, config.tp_size, self.geometry,
                                               self.vllm_config, self.kv_cache_config,
                                               config.host, config.register_host_memory,
                                               config.device, self.cudagraph_mode, dist_init,
                                               self.windows)
                                  for r in range(config.tp_size)], config.step_timeout)
        try:
            self._start_scheduler()
        except BaseException:
            self.executor.shutdown()
            raise
        hash_fn = sha256_cbor if config.hash_algo == "sha256_cbor" else _sha256_pickle
        # vLLM's engine core seeds its block hashes once per process (init_none_hash): random
        # unless PYTHONHASHSEED is set. Each Engine is a fresh engine process: its own seed.
        self.none_hash = init_none_hash(hash_fn) or kv_cache_utils.NONE_HASH
        hasher = get_request_block_hasher(config.block_size, hash_fn)

        def block_hasher(request):
            kv_cache_utils.NONE_HASH = self.none_hash
            return hasher(request)
        self.block_hasher = block_hasher
        self.step_reports = []   # per step: every rank's StepReport
        self.scheduler_calls = []  # per step: the scheduler connector's calls
        self._expected: Dict[str, List[int]] = {}
        self._bad: Dict[str, dict] = {}

    def _start_scheduler(self):
        connector = None
        self.connector = None
        if self.config.kv_transfer_config is not None:
            self.connector = KVConnectorFactory.create_connector(
                self.vllm_config, KVConnectorRole.SCHEDULER, self.kv_cache_config)
            connector = _Recorder(self.connector)
        self.scheduler = Scheduler(SchedulerConfig(self.config.max_num_batched_tokens,
                                                   self.config.max_num_seqs,
                                                   self.config.max_model_len),
                                   self.config.num_gpu_blocks, self.config.block_size,
                                   connector, self.config.eagle_prefix_cache_hashing,
                                   self.windows)
        if connector is not None and self.config.eagle_prefix_cache_hashing:
            self.connector.set_eagle_prefix_cache_hashing(True)
        if connector is not None:
            merged = {}
            for worker_dict in self.executor.get_kv_connector_handshake_metadata():
                if worker_dict is not None:
                    merged.update(worker_dict)
            if merged:
                connector.set_xfer_handshake_metadata(merged)
            connector.calls.clear()

    # --- requests ---
    def add_request(self, req_id: str, prompt: List[int], max_tokens: int = 4, **fields):
        """fields: more of Request's (lora_request, cache_salt, mm_features)."""
        request = Request(req_id, prompt, block_hasher=self.block_hasher, max_tokens=max_tokens,
                          **fields)
        self._expected[req_id] = expected_output(prompt, max_tokens)
        self._bad[req_id] = {"unreported": {}, "reported": {}}
        self.scheduler.add_request(request)
        return request

    def block_hashes(self, token_ids: List[int]) -> list:
        """vLLM's block hashes of a token sequence (what Request.block_hashes holds)."""
        return Request("block-hashes", token_ids, block_hasher=self.block_hasher).block_hashes

    def abort_request(self, req_id: str):
        self.scheduler.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)

    def step(self, before_execute: Optional[Callable] = None):
        """One engine step; before_execute(scheduler_output) runs between scheduling (the
        connector's lookups) and the workers' execution (its loads)."""
        output = self.scheduler.schedule()
        if before_execute is not None:
            before_execute(output)
        runner_output, reports = self.executor.execute_model(output)
        self.scheduler.update_from_output(output, runner_output)
        self.step_reports.append(reports)
        if self.scheduler.connector is not None:
            self.scheduler_calls.append(self.scheduler.connector.calls)
            self.scheduler.connector.calls = []
        self._record_bad_blocks(reports)
        return output

    def _record_bad_blocks(self, reports):
        for rep in reports:
            for req_id, blocks in rep.bad_blocks.items():
                unreported = sorted(set(blocks) - set(rep.invalid_block_ids))
                reported = sorted(set(blocks) & set(rep.invalid_block_ids))
                bad = self._bad[req_id]
                if unreported:
                    bad["unreported"].setdefault(rep.rank, []).extend(unreported)
                if reported:
                    bad["reported"].setdefault(rep.rank, []).extend(reported)

    def run_until_done(self, max_steps: int = 1000, before_execute=None):
        for _ in range(max_steps):
            if not self.scheduler.has_requests():
                return
            self.step(before_execute)
        raise AssertionError("requests unfinished after %d steps" % max_steps)

    def generate(self, requests, max_steps: int = 1000, before_execute=None
                 ) -> Dict[str, RequestResult]:
        """requests: (req_id, prompt token ids, max_tokens[, {Request field: value}]) tuples,
        all added before the first step. Returns each request's RequestResult."""
        handles = [self.add_request(*r[:3], **(r[3] if len(r) > 3 else {})) for r in requests]
        self.run_until_done(max_steps, before_execute)
        return {h.request_id: self.result(h) for h in handles}

    def result(self, request: Request) -> RequestResult:
        bad = self._bad[request.request_id]
        return RequestResult(request.request_id, list(request.output_token_ids),
                             self._expected[request.request_id],
                             self.scheduler.stats[request.request_id],
                             bad["unreported"], bad["reported"])

    # --- harness controls ---
    def reset_prefix_cache(self, poison: bool = True):
        """vLLM's reset_prefix_cache (no request may hold blocks); with `poison`, every worker
        also overwrites its blocks, so nothing computed before can be read again by mistake."""
        if not self.scheduler.reset_prefix_cache():
            raise RuntimeError("reset_prefix_cache: blocks still in use")
        if poison:
            self.executor.collective_rpc("poison")

    @property
    def events(self):
        return self.scheduler.events

    @property
    def gpu_events(self):
        """The GPU tier's BlockStored events (fakevllm.block_pool)."""
        return self.scheduler.kv_cache_manager.gpu_events

    def shutdown(self):
        """As EngineCore.shutdown: the executor (workers) first, then the scheduler's
        connector."""
        try:
            self.executor.shutdown()
        finally:
            shutil.rmtree(self._dist_dir, ignore_errors=True)
            if self.connector is not None:
                self.connector.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False

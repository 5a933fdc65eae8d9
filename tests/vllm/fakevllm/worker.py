"""A fake vLLM GPU worker (one per TP rank, in its own process): builds its connector through
vLLM's factory with role WORKER, allocates the KV cache (fakevllm.kv_cache), registers it, and runs
each SchedulerOutput through a model runner that drives the connector as vLLM's
KVConnectorModelRunnerMixin and attention layers do:

  handle_preemptions(preempted_req_ids)            (when any)
  bind_connector_metadata(meta)
  start_load_kv(forward_context)
  per layer: wait_for_layer_load(name) ... save_kv_layer(name, kv_layer, attn_metadata)
  wait_for_save()
  get_finished(finished_req_ids)
  get_block_ids_with_load_errors()
  get_kv_connector_stats(), get_kv_connector_kv_cache_events()
  clear_connector_metadata()

A step with no scheduled tokens runs the same calls without the forward pass (vLLM's
kv_connector_no_forward). A step replayed as a FULL CUDA graph (cudagraph_mode FULL, or
FULL_AND_PIECEWISE for a uniform-decode batch: one token per request) runs the forward without
the layer hooks (wait_for_layer_load, save_kv_layer): they are Python, not in the graph. The
runner keeps each request's tokens and block table as vLLM's persistent batch does (new
requests, running ones with new blocks, resumed ones replacing theirs, sampled tokens appended by
the runner itself, output tokens the scheduler dropped cut off). Under TP the workers form a
gloo group, vLLM's TP CPU group (vllm.distributed.parallel_state.get_tp_group).
"""

import pickle
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from vllm.distributed import parallel_state
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import ForwardContext
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

from fakevllm.kv_cache import CacheGeometry, KvCache
from fakevllm.toy_model import (ScheduledSeq, ToyAttention, ToyModel, attention_metadata)


@dataclass
class WorkerConfig:
    rank: int
    tp_size: int
    geometry: CacheGeometry
    vllm_config: object                  # vllm.config.VllmConfig
    kv_cache_config: object              # vllm.v1.kv_cache_interface.KVCacheConfig
    host: bool = True
    register_host_memory: bool = False   # call tutti.vllm.register_host_memory(shm) first
    device: Optional[str] = None         # "cuda:0": the cache in device memory (host False)
    cudagraph_mode: str = "NONE"         # as resolved by the engine (fakevllm.engine)
    dist_init: Optional[str] = None      # TP > 1: torch.distributed init_method (gloo)
    # Hybrid: each KV cache group's sliding window in tokens (None: full attention); model
    # layer l is in group l % len(windows) and uses cache slot l // len(windows).
    windows: Optional[tuple] = None


@dataclass
class StepReport:
    """The harness's view of one step on one rank (not part of vLLM's output)."""
    rank: int
    bad_blocks: Dict[str, List[int]] = field(default_factory=dict)  # read wrong, per request
    invalid_block_ids: List[int] = field(default_factory=list)      # what the connector said
    calls: List[str] = field(default_factory=list)                  # connector calls, in order


class _Recorder:
    """Wraps the worker's connector and records the name of each call made through it."""

    def __init__(self, connector):
        self._connector = connector
        self.calls = []

    def __getattr__(self, name):
        attr = getattr(self._connector, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)
        return call


@dataclass
class _RequestState:
    token_ids: List[int]
    num_prompt_tokens: int
    block_ids: List[List[int]]  # per KV cache group
    num_computed: int


class ModelRunner:
    def __init__(self, config: WorkerConfig):
        self.config = config
        parallel_state.set_tensor_model_parallel(config.rank, config.tp_size)
        if config.tp_size > 1:  # vLLM's TP group (its CPU side): the toy model's all-reduce
            import torch.distributed as dist
            dist.init_process_group("gloo", init_method=config.dist_init, rank=config.rank,
                                    world_size=config.tp_size)
            parallel_state.set_tp_cpu_group(dist.group.WORLD)
        self.connector = None
        if config.vllm_config.kv_transfer_config is not None:
            self.connector = KVConnectorFactory.create_connector(
                config.vllm_config, KVConnectorRole.WORKER, config.kv_cache_config)
        groups = len(config.windows) if config.windows else 1
        self.cache = KvCache(config.geometry, host=config.host, device=config.device,
                             groups=groups)
        if self.connector is not None:
            if config.register_host_memory:
                import tutti.vllm
                tutti.vllm.register_host_memory(self.cache.shm)
            self.connector.register_kv_caches(dict(self.cache.layers))
        self.recorder = _Recorder(self.connector) if self.connector is not None else None
        self.model = ToyModel(self.cache, config.rank, config.windows)
        self.layers = {name: ToyAttention(name, t) for name, t in self.cache.layers.items()}
        self.requests: Dict[str, _RequestState] = {}

    def handshake_metadata(self) -> Optional[dict]:
        """vLLM's Worker.get_kv_connector_handshake_metadata: {tp_rank: the connector's}."""
        if self.connector is None:
            return None
        meta = self.connector.get_handshake_metadata()
        return None if meta is None else {parallel_state.get_tensor_model_parallel_rank(): meta}

    def _update_states(self, so):
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
        for req_id in so.preempted_req_ids or ():
            self.requests.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            self.requests[new.req_id] = _RequestState(list(new.prompt_token_ids),
                                                      len(new.prompt_token_ids),
                                                      [list(g) for g in new.block_ids],
                                                      new.num_computed_tokens)
        c = so.scheduled_cached_reqs
        for i, req_id in enumerate(c.req_ids):
            if req_id in c.resumed_req_ids:
                tokens = c.all_token_ids[req_id]
                self.requests[req_id] = _RequestState(list(tokens), len(tokens) -
                                                      c.num_output_tokens[i],
                                                      [list(g) for g in c.new_block_ids[i]],
                                                      c.num_computed_tokens[i])
                continue
            state = self.requests[req_id]
            if c.new_block_ids[i] is not None:
                for ids, more in zip(state.block_ids, c.new_block_ids[i]):
                    ids.extend(more)
            state.num_computed = c.num_computed_tokens[i]
            # Output tokens the scheduler dropped (a failed load's step) are cut off.
            del state.token_ids[state.num_prompt_tokens + c.num_output_tokens[i]:]

    def execute_model(self, so) -> (ModelRunnerOutput, StepReport):
        report = StepReport(self.config.rank)
        kv = self.recorder
        if kv is not None and so.preempted_req_ids:
            kv.handle_preemptions(so.preempted_req_ids)
        self._update_states(so)
        seqs = self._scheduled_seqs(so)
        metas = [attention_metadata(seqs, self.config.geometry.block_size, g)
                 for g in range(len(self.config.windows or (None,)))]
        meta = {name: metas[i % len(metas)] for i, name in enumerate(self.layers)}
        ctx = ForwardContext(no_compile_layers=dict(self.layers), attn_metadata=meta)
        kv_output = None
        # vLLM's mixin at the commit docs/vllm.md names: every step's loads start before the
        # forward (its SchedulerOutput has no has_sync_kv_loads).
        if kv is not None:
            kv.bind_connector_metadata(so.kv_connector_metadata)
            kv.start_load_kv(ctx)
        sampled, check = {}, None
        if so.total_num_scheduled_tokens > 0:
            hooks = None if self._full_graph(so) else kv
            sampled, check = self.model.forward(seqs, hooks, meta)
        if kv is not None:
            kv.wait_for_save()
            kv_output = KVConnectorOutput()
            kv_output.finished_sending, kv_output.finished_recving = kv.get_finished(
                so.finished_req_ids)
            kv_output.invalid_block_ids = set(kv.get_block_ids_with_load_errors() or ())
            kv_output.kv_connector_stats = kv.get_kv_connector_stats()
            kv_output.kv_cache_events = kv.get_kv_connector_kv_cache_events()
            kv.clear_connector_metadata()
            report.invalid_block_ids = sorted(kv_output.invalid_block_ids)
            report.calls, kv.calls = kv.calls, []
        if check is not None:
            report.bad_blocks = {r: sorted(b) for r, b in check.bad_blocks.items()}
        for req_id, token in sampled.items():
            self.requests[req_id].token_ids.append(token)
        ids = [s.req_id for s in seqs]
        out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[sampled[r]] if r in sampled else []
                                                   for r in ids],
                                kv_connector_output=kv_output)
        return out, report

    def _full_graph(self, so) -> bool:
        """Whether vLLM would replay this batch as a FULL CUDA graph."""
        mode = self.config.cudagraph_mode
        if mode == "FULL":
            return True
        return (mode == "FULL_AND_PIECEWISE" and
                all(n == 1 for n in so.num_scheduled_tokens.values()))

    def _scheduled_seqs(self, so) -> List[ScheduledSeq]:
        seqs = []
        for req_id, n in so.num_scheduled_tokens.items():
            s = self.requests[req_id]
            seqs.append(ScheduledSeq(req_id, s.token_ids, s.block_ids, s.num_computed, n))
        return seqs

    def shutdown(self):
        if self.connector is not None:
            self.connector.shutdown()
        self.cache.close()


def worker_main(conn, config: WorkerConfig):
    """The worker process: answers the executor's messages (pickled (method, args)) until
    "shutdown". Any exception is sent back as ("error", text) and ends the process."""
    import traceback
    runner = None
    try:
        runner = ModelRunner(config)
        conn.send_bytes(pickle.dumps(("ready", None)))
        while True:
            method, arg = pickle.loads(conn.recv_bytes())
            if method == "shutdown":
                runner.shutdown()
                runner = None
                conn.send_bytes(pickle.dumps(("ok", None)))
                return
            if method == "execute_model":
                result = runner.execute_model(arg)
            elif method == "handshake":
                result = runner.handshake_metadata()
            elif method == "poison":
                runner.cache.poison()
                result = None
            else:
                raise ValueError("unknown method %r" % method)
            conn.send_bytes(pickle.dumps(("ok", result)))
    except BaseException:
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
    finally:
        if runner is not None:
            try:
                runner.shutdown()
            except Exception:
                pass

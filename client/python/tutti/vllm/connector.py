"""TuttiConnector: tutti as a vLLM KV connector (KVConnectorBase_V1), loaded out of tree with
--kv-transfer-config '{"kv_connector": "TuttiConnector", "kv_connector_module_path":
"tutti.vllm", "kv_role": "kv_both", "kv_connector_extra_config": {...}}' (docs/vllm.md).

It dispatches on its role: SCHEDULER -> tutti.vllm.scheduler.TuttiScheduler, WORKER ->
tutti.vllm.worker.TuttiWorker; a hook of the other role is a no-op. Extra config:
  "sockets": [path of TP rank 0's tuttid, ...]  (default /run/tutti/<rank>/tuttid.sock)
  "save": "end" (default) | "layer"
  "save_retry_deadline_ms": 10000   a block tuttid refused (staging full) is retried this long
  "max_pending_saves": 4096         refused blocks a worker holds for retries at most
  "lookup_timeout_ms": 500   the scheduler's Lookup deadline
  "events": true             watch tuttid's events for take_events()
  "events_medium": "STORAGE"  the medium of those events ("DISK" for consumers before vllm#48123)
  "events_locality": "LOCAL"  their locality ("" for none; only if vLLM's events have the field)
Per request, request.kv_transfer_params "max_load_tokens" and "max_offload_tokens" (a router's
caps; tutti.vllm.scheduler.request_caps, docs/vllm.md "Per-request caps from routers").

Hybrid models: it implements vLLM's SupportsHMA (request_finished_all_groups), so vLLM keeps its
hybrid KV cache manager on: full-attention and sliding-window groups are served, one namespace
per group (tutti.vllm.groups); state-space groups (MambaSpec, ...) are refused with a ValueError
when the connector is built and at register_kv_caches.
"""

from typing import Any

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole

try:  # vLLM's hybrid memory allocator interface (vllm#25363, 0.11)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
except ImportError:  # an older vLLM: it turns its hybrid manager off for every connector
    class SupportsHMA:  # noqa: D101
        pass

from tutti.vllm import groups as kvgroups
from tutti.vllm.events import LOCALITY, MEDIUM
from tutti.vllm.keys import check_cache_config
from tutti.vllm.metadata import TuttiConnectorMetadata
from tutti.vllm.scheduler import TuttiScheduler, lookup_only_connect
from tutti.vllm.worker import TuttiWorker

DEFAULT_SOCKET = "/run/tutti/%d/tuttid.sock"


def _tp_rank():
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
    return get_tensor_model_parallel_rank()


def socket_of(extra, rank):
    sockets = extra.get("sockets")
    if sockets is None:
        return DEFAULT_SOCKET % rank
    if not isinstance(sockets, (list, tuple)) or rank >= len(sockets):
        raise ValueError("kv_connector_extra_config sockets: %r has no entry for TP rank %d "
                         "(a list indexed by TP rank)" % (sockets, rank))
    return str(sockets[rank])


def _number(extra, name, default):
    v = extra.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ValueError("kv_connector_extra_config %s: %r; give a number >= 0" % (name, v))
    return v


def namespace_secret_of(extra):
    """kv_connector_extra_config namespace_secret: a string of 16 to 64 bytes (UTF-8) that
    engines of other users give too when they may share this model's blocks in tuttid
    (docs/security.md "Namespaces"); absent: the namespace is this user's own."""
    v = extra.get("namespace_secret", "")
    if not isinstance(v, str):
        raise ValueError("kv_connector_extra_config namespace_secret: a string, not %s"
                         % type(v).__name__)
    secret = v.encode()
    if secret and not 16 <= len(secret) <= 64:
        raise ValueError("kv_connector_extra_config namespace_secret: %d bytes; give 16 to 64 "
                         "(random) or none" % len(secret))
    return secret


class TuttiConnector(KVConnectorBase_V1, SupportsHMA):
    @property
    def requires_kv_delivery(self) -> bool:
        """False: tutti is a best-effort cache; a save lost to a preemption is a later miss,
        never a reason for vLLM to recompute the request."""
        return False

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        check_cache_config(vllm_config.cache_config)
        pc = vllm_config.parallel_config
        if getattr(pc, "pipeline_parallel_size", 1) != 1:
            raise ValueError("TuttiConnector supports tensor parallelism only "
                             "(pipeline_parallel_size is %d)" % pc.pipeline_parallel_size)
        tp_size = int(pc.tensor_parallel_size)
        block_size = int(vllm_config.cache_config.block_size)
        groups = kvgroups.groups_of(kv_cache_config, block_size)  # refuses what it cannot serve
        self._sched = None
        self._worker = None
        if role == KVConnectorRole.SCHEDULER:
            timeout = float(extra.get("lookup_timeout_ms", 500)) / 1000.0
            self._sched = TuttiScheduler(block_size, tp_size, lookup_only_connect(timeout),
                                         watch_events=bool(extra.get("events", True)),
                                         events_medium=extra.get("events_medium", MEDIUM),
                                         events_locality=extra.get("events_locality", LOCALITY),
                                         groups=groups)
        else:
            rank = _tp_rank()
            self._worker = TuttiWorker(
                vllm_config.model_config, kv_cache_config, rank, tp_size,
                socket_of(extra, rank), extra.get("save", "end"),
                getattr(vllm, "__version__", "unknown"),
                retry_deadline_s=_number(extra, "save_retry_deadline_ms", 10000) / 1000.0,
                max_pending_saves=int(_number(extra, "max_pending_saves", 4096)),
                namespace_secret=namespace_secret_of(extra))

    # --- worker side ---
    def register_kv_caches(self, kv_caches):
        self._worker.register_kv_caches(kv_caches)

    def get_handshake_metadata(self):
        return self._worker.handshake() if self._worker is not None else None

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None:
            self._worker.bind(connector_metadata)

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        if self._worker is not None:
            self._worker.clear()

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        if self._worker is not None:
            self._worker.start_load()

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._worker is not None:
            self._worker.wait_layer(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs: Any) -> None:
        if self._worker is not None:
            self._worker.save_layer(layer_name, kv_layer)

    def wait_for_save(self):
        if self._worker is not None:
            self._worker.wait_for_save()

    def get_block_ids_with_load_errors(self):
        return self._worker.load_errors() if self._worker is not None else set()

    def handle_preemptions(self, preempted_req_ids):
        """Stock vLLM passes the preempted requests' ids; a vLLM that passes the step's metadata
        instead gets its `preempted` handled (the worker also does so in bind)."""
        if self._worker is None or preempted_req_ids is None:
            return
        if isinstance(preempted_req_ids, TuttiConnectorMetadata):
            preempted_req_ids = preempted_req_ids.preempted
        self._worker.handle_preemptions(set(preempted_req_ids))

    def get_finished(self, finished_req_ids):
        if self._worker is None:
            return None, None
        return self._worker.get_finished(finished_req_ids)

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()
        if self._sched is not None:
            self._sched.shutdown()

    # --- scheduler side ---
    def set_eagle_prefix_cache_hashing(self, enabled: bool) -> None:
        """vLLM's engine-wide hash protocol: with EAGLE successor-aware hashes, a request's
        blocks are stored only up to its num_publishable_block_hashes."""
        super().set_eagle_prefix_cache_hashing(enabled)
        if self._sched is not None:
            self._sched.publish_fence = bool(enabled)

    def set_xfer_handshake_metadata(self, metadata) -> None:
        if self._sched is not None:
            self._sched.set_handshakes(metadata)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> TuttiConnectorMetadata:
        return self._sched.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output):
        self._sched.update_connector_output(connector_output)

    def request_finished(self, request, block_ids):
        return self._sched.request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids):
        """SupportsHMA: vLLM calls this instead of request_finished, with every KV cache group's
        block ids (a tuple of lists)."""
        return self._sched.request_finished_all_groups(request, block_ids)

    def take_events(self):
        return self._sched.take_events() if self._sched is not None else ()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config) -> bool:
        """True whatever the config: loads reach the forward through wait_for_layer_load
        (every save mode) and "layer" saves through save_kv_layer, which a FULL CUDA graph's
        replay skips (it would read KV not yet loaded, and never save what decode completes)."""
        return True

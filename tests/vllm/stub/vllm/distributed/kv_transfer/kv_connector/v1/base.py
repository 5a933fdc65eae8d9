"""KVConnectorBase_V1 as in vLLM (vllm/distributed/kv_transfer/kv_connector/v1/base.py): the same
methods, arguments and defaults; abstract methods raise NotImplementedError."""
import enum
from abc import ABC, abstractmethod
from typing import Any, Optional


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024
    pass


class KVConnectorHandshakeMetadata(ABC):  # noqa: B024
    pass


class SupportsHMA(ABC):
    """A connector that supports the hybrid memory allocator (several KV cache groups). vLLM's
    scheduler then calls request_finished_all_groups instead of request_finished; for other
    connectors vLLM turns its hybrid KV cache manager off."""

    @abstractmethod
    def request_finished_all_groups(self, request, block_ids):
        """Called once when a request finished, before its blocks of every group are freed;
        block_ids: a tuple of lists, one per KV cache group. Returns (delay_free, params)."""
        raise NotImplementedError


def supports_hma(connector) -> bool:
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)


class KVConnectorBase_V1(ABC):
    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return False

    @property
    def supports_eagle_prefix_cache_hashing(self) -> bool:
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        """True: a request preempted while its hand-off is pending is recomputed. Defaults to
        the producer role; best-effort caches return False (a dropped save is a later miss)."""
        return self._kv_transfer_config.is_kv_producer

    def __init__(self, vllm_config, role, kv_cache_config=None):
        self._connector_metadata: Optional[KVConnectorMetadata] = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is not None:
            self._kv_transfer_config = vllm_config.kv_transfer_config
        else:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_cache_config = kv_cache_config
        self._role = role
        self.use_eagle_prefix_cache_hashing = False

    def set_eagle_prefix_cache_hashing(self, enabled: bool) -> None:
        self.use_eagle_prefix_cache_hashing = enabled

    @property
    def role(self):
        return self._role

    # --- worker side ---
    def bind_connector_metadata(self, connector_metadata):
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self):
        self._connector_metadata = None

    def _get_connector_metadata(self):
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches):
        return

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        return

    def set_host_xfer_buffer_ops(self, copy_operation):
        return

    def handle_preemptions(self, preempted_req_ids):
        return

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        raise NotImplementedError

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        raise NotImplementedError

    @abstractmethod
    def wait_for_save(self):
        raise NotImplementedError

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self):
        return set()

    def shutdown(self):
        return None

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def get_handshake_metadata(self):
        return None

    # --- scheduler side ---
    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        raise NotImplementedError

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        raise NotImplementedError

    @abstractmethod
    def build_connector_meta(self, scheduler_output):
        raise NotImplementedError

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request, block_ids):
        return False, None

    def take_events(self):
        return ()

    def set_xfer_handshake_metadata(self, metadata):
        return None

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract "
                            "base class")
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config) -> bool:
        """True: vLLM runs PIECEWISE CUDA graphs only (its layer hooks run between the pieces);
        False: FULL graphs may be replayed, in which wait_for_layer_load and save_kv_layer do
        not run."""
        return False

    def get_finished_count(self):
        return None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return None

    def reset_cache(self):
        return None

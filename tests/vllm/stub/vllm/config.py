"""The fields of vLLM's config objects the connector reads (vllm/config/*.py)."""
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class ModelConfig:
    model: str = "meta-llama/Llama-3.1-8B"
    revision: Optional[str] = None
    dtype: Any = "bfloat16"
    use_mla: bool = False


@dataclass
class CacheConfig:
    block_size: int = 16
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256_cbor"
    cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_rank: int = 0
    data_parallel_size: int = 1


@dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    engine_id: Optional[str] = None
    kv_role: Optional[str] = None
    kv_rank: Optional[int] = None
    kv_parallel_size: int = 1
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_connector_module_path: Optional[str] = None

    def __post_init__(self):
        if self.engine_id is None:
            self.engine_id = str(uuid.uuid4())

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_producer", "kv_both")

    def get_from_extra_config(self, key, default) -> Any:
        return self.kv_connector_extra_config.get(key, default)


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None
    instance_id: str = ""

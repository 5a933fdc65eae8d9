"""tutti as a vLLM KV connector: `TuttiConnector` (load it with --kv-transfer-config
'{"kv_connector":"TuttiConnector","kv_connector_module_path":"tutti.vllm","kv_role":"kv_both"}')
and, for host-mode engines (tests, CI), `register_host_memory(shm)`. See docs/vllm.md."""

from tutti.vllm.connector import TuttiConnector
from tutti.vllm.metadata import LoadSpec, SaveSpec, TuttiConnectorMetadata, TuttiHandshake
from tutti.vllm.worker import register_host_memory

__all__ = ["TuttiConnector", "register_host_memory", "TuttiConnectorMetadata", "LoadSpec",
           "SaveSpec", "TuttiHandshake"]

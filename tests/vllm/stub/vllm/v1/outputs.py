from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KVConnectorOutput:
    finished_sending: Optional[set] = None
    finished_recving: Optional[set] = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    invalid_block_ids: set = field(default_factory=set)
    expected_finished_count: int = 0

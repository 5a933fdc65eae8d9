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


@dataclass
class ModelRunnerOutput:
    req_ids: list
    req_id_to_index: dict
    sampled_token_ids: list = field(default_factory=list)
    logprobs: Any = None
    prompt_logprobs_dict: dict = field(default_factory=dict)
    pooler_output: list = field(default_factory=list)
    kv_connector_output: Optional[KVConnectorOutput] = None
    num_nans_in_logits: Optional[dict] = None

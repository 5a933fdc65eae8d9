"""vLLM's SchedulerOutput and its parts (vllm/v1/core/sched/output.py), same fields."""
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: Optional[list]
    mm_features: list
    sampling_params: Any
    pooling_params: Any
    block_ids: tuple
    num_computed_tokens: int
    lora_request: Any
    prompt_embeds: Any = None
    prefill_token_ids: Optional[list] = None

    @classmethod
    def from_request(cls, request, block_ids, prefill_token_ids=None):
        return cls(req_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
                   mm_features=request.mm_features, sampling_params=request.sampling_params,
                   pooling_params=request.pooling_params, block_ids=block_ids,
                   num_computed_tokens=request.num_computed_tokens,
                   lora_request=request.lora_request, prefill_token_ids=prefill_token_ids)


@dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: list
    num_computed_tokens: list
    num_output_tokens: list

    @property
    def num_reqs(self):
        return len(self.req_ids)

    @classmethod
    def make_empty(cls):
        return cls([], set(), [], {}, [], [], [])


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    num_common_prefix_blocks: list
    finished_req_ids: set
    free_encoder_mm_hashes: list
    preempted_req_ids: Optional[set] = None
    pending_structured_output_tokens: bool = False
    kv_connector_metadata: Any = None
    ec_connector_metadata: Any = None

    @classmethod
    def make_empty(cls):
        return cls([], CachedRequestData.make_empty(), {}, 0, {}, {}, [], set(), [])

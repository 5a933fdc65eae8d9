"""The fields of vLLM's Request (vllm/v1/request.py) that the scheduler and connectors read."""
import enum


class RequestStatus(enum.IntEnum):
    WAITING = 1
    WAITING_FOR_REMOTE_KVS = 2
    RUNNING = 3
    PREEMPTED = 4
    FINISHED_STOPPED = 5
    FINISHED_LENGTH_CAPPED = 6
    FINISHED_ABORTED = 7


class Request:
    def __init__(self, request_id, prompt_token_ids, block_hasher=None, max_tokens=16,
                 lora_request=None, kv_transfer_params=None, cache_salt=None,
                 mm_features=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids = []
        self._all_token_ids = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.max_tokens = max_tokens
        self.lora_request = lora_request
        self.mm_features = list(mm_features or [])
        self.cache_salt = cache_salt
        self.prompt_embeds = None
        self.sampling_params = None
        self.pooling_params = None
        self.kv_transfer_params = kv_transfer_params
        self.num_preemptions = 0
        self.num_cached_tokens = -1
        self.num_external_computed_tokens = 0
        self.block_hashes = []
        # Leading (EAGLE successor-aware) hashes whose KV is ready for content-addressed
        # publication; advanced by mark_eagle_hashes_publishable.
        self.num_publishable_block_hashes = 0
        self._block_hasher = block_hasher
        if block_hasher is not None:
            self.block_hashes.extend(block_hasher(self))

    def mark_eagle_hashes_publishable(self, num_tokens, hash_block_size):
        n = min(len(self.block_hashes), min(self.num_tokens, num_tokens) // hash_block_size)
        self.num_publishable_block_hashes = max(self.num_publishable_block_hashes, n)

    def invalidate_eagle_hash_publication(self, num_hashes=0):
        self.num_publishable_block_hashes = min(self.num_publishable_block_hashes, num_hashes)

    @property
    def output_token_ids(self):
        return self._output_token_ids

    @property
    def all_token_ids(self):
        return self._all_token_ids

    @property
    def num_tokens(self):
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self):
        return len(self._output_token_ids)

    def append_output_token_ids(self, token_ids):
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def is_finished(self):
        return self.status > RequestStatus.PREEMPTED

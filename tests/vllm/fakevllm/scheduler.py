"""vLLM's v1 Scheduler (v1/core/sched/scheduler.py) reduced to what a KV connector sees, with
the same calls in the same order and with the same arguments:

schedule():
  running requests first (chunked prefill and decode within the token budget; when blocks run
  out, the newest running request is preempted: blocks freed, num_computed_tokens = 0, back to
  the head of the waiting queue); then, if nothing was preempted, waiting requests: local prefix
  hits (get_computed_blocks), connector.get_num_new_matched_tokens(request, local tokens),
  allocate_slots, connector.update_state_after_alloc(request, all its blocks, external tokens);
  the SchedulerOutput; connector.build_connector_meta(output) -> output.kv_connector_metadata;
  then num_computed_tokens advance and finished_req_ids is emptied.
update_from_output(output, model_runner_output):
  invalid_block_ids -> the "recompute" policy: a running request that loaded a failed block is
  cut back to that block (num_computed_tokens = idx * block_size) and its sample dropped; sampled
  tokens appended, stop checks, finished requests -> connector.request_finished(request,
  block_ids of group 0), or request_finished_all_groups(request, every group's block_ids) for a
  connector that implements SupportsHMA (and blocks freed unless it asks to delay); connector.update_connector_output(kv
  output) (finished_sending frees delayed blocks); connector.take_events().
Asynchronous loads (load_kv_async True) are not driven (NotImplementedError).
Not thread-safe.
"""

from collections import deque
from dataclasses import dataclass
from typing import Dict, List

from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.request import Request, RequestStatus

from fakevllm.block_pool import BlockPool


@dataclass
class RequestStats:
    """What the harness reports per request (beyond the outputs)."""
    local_hit_tokens: int = 0      # prefix tokens found in the GPU prefix cache, summed
    external_tokens: int = 0       # tokens the connector loaded (after failures), summed
    computed_tokens: int = 0       # tokens the model computed (recomputes and decodes included)
    failed_load_tokens: int = 0    # external tokens given back by invalid_block_ids
    preemptions: int = 0


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 64
    max_num_seqs: int = 8
    max_model_len: int = 4096


class Scheduler:
    def __init__(self, sched_config: SchedulerConfig, num_gpu_blocks: int, block_size: int,
                 connector=None, eagle_prefix_cache_hashing: bool = False, windows=None):
        """eagle_prefix_cache_hashing: requests' num_publishable_block_hashes lag their
        computed blocks by one step (vLLM publishes a block once the step after the one that
        computed it acknowledged its draft KV); preemption resets it."""
        self.eagle_hashing = eagle_prefix_cache_hashing
        self._acked: Dict[str, int] = {}  # tokens computed by the steps whose output came back
        self.config = sched_config
        self.block_size = block_size
        self.kv_cache_manager = BlockPool(num_gpu_blocks, block_size, windows)
        self.connector = connector
        self.requests: Dict[str, Request] = {}
        self.waiting: deque = deque()
        self.running: List[Request] = []
        self.finished_req_ids = set()
        self.prev_step_scheduled_req_ids = set()
        self.stats: Dict[str, RequestStats] = {}
        self.events: List = []  # every event connector.take_events() returned, in order
        self.delayed_frees = set()  # finished requests whose blocks wait for finished_sending

    # --- requests ---
    def add_request(self, request: Request):
        self.waiting.append(request)
        self.requests[request.request_id] = request
        self.stats[request.request_id] = RequestStats()

    def has_requests(self) -> bool:
        """vLLM keeps stepping while requests are unfinished, finished ones are still to be
        announced to the workers, or finished ones hold blocks the connector is still saving
        (delayed frees, until every worker reported them in finished_sending)."""
        return bool(self.waiting or self.running or self.finished_req_ids or self.delayed_frees)

    def finish_requests(self, req_ids, status: RequestStatus):
        for req_id in list(req_ids):
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    # --- schedule ---
    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        num_scheduled: Dict[str, int] = {}
        new_blocks: Dict[str, list] = {}
        new_reqs, resumed_reqs, running_reqs, preempted = [], [], [], []

        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = min(request.num_tokens - request.num_computed_tokens, budget,
                    self.config.max_model_len - 1 - request.num_computed_tokens)
            if n <= 0:
                i += 1
                continue
            while True:
                blocks = self.kv_cache_manager.allocate_slots(request, n)
                if blocks is not None:
                    break
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if blocks is None:
                break
            running_reqs.append(request)
            new_blocks[request.request_id] = blocks.get_block_ids()
            num_scheduled[request.request_id] = n
            budget -= n
            i += 1

        if not preempted:
            budget = self._schedule_waiting(budget, num_scheduled, new_blocks, new_reqs,
                                            resumed_reqs)

        output = SchedulerOutput(
            scheduled_new_reqs=[NewRequestData.from_request(r, new_blocks[r.request_id])
                                for r in new_reqs],
            scheduled_cached_reqs=self._cached_request_data(running_reqs, resumed_reqs,
                                                            new_blocks),
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0], finished_req_ids=self.finished_req_ids,
            free_encoder_mm_hashes=[],
            preempted_req_ids={r.request_id for r in preempted})
        self.prev_step_scheduled_req_ids = set(num_scheduled)
        if self.connector is not None:
            output.kv_connector_metadata = self.connector.build_connector_meta(output)
        for req_id, n in num_scheduled.items():
            self.requests[req_id].num_computed_tokens += n
            self.stats[req_id].computed_tokens += n
        self.finished_req_ids = set()
        return output

    def _schedule_waiting(self, budget, num_scheduled, new_blocks, new_reqs, resumed_reqs):
        skipped = []  # requests the connector cannot answer for yet: back at the head after
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            local_blocks, local_tokens = self.kv_cache_manager.get_computed_blocks(request)
            external = 0
            if self.connector is not None:
                external, load_async = self.connector.get_num_new_matched_tokens(request,
                                                                                 local_tokens)
                if external is None:
                    skipped.append(self.waiting.popleft())
                    continue
                if load_async:
                    raise NotImplementedError("the harness drives synchronous loads only")
                request.num_external_computed_tokens = external
            computed = local_tokens + external
            n = min(request.num_tokens - computed, budget)
            blocks = self.kv_cache_manager.allocate_slots(
                request, n, num_new_computed_tokens=local_tokens,
                new_computed_blocks=local_blocks, num_external_computed_tokens=external)
            if blocks is None:
                break
            if self.connector is not None:
                self.connector.update_state_after_alloc(
                    request, self.kv_cache_manager.get_blocks(request.request_id), external)
            self.waiting.popleft()
            self.running.append(request)
            (resumed_reqs if request.status == RequestStatus.PREEMPTED else new_reqs).append(
                request)
            new_blocks[request.request_id] = self.kv_cache_manager.get_block_ids(
                request.request_id)
            num_scheduled[request.request_id] = n
            budget -= n
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = computed
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = computed
            stats = self.stats[request.request_id]
            stats.local_hit_tokens += local_tokens
            stats.external_tokens += external
        self.waiting.extendleft(reversed(skipped))
        return budget

    def _cached_request_data(self, running_reqs, resumed_reqs, new_blocks) -> CachedRequestData:
        data = CachedRequestData.make_empty()
        for idx, r in enumerate(running_reqs + resumed_reqs):
            data.req_ids.append(r.request_id)
            if idx >= len(running_reqs):
                data.resumed_req_ids.add(r.request_id)
            if r.request_id not in self.prev_step_scheduled_req_ids:
                data.all_token_ids[r.request_id] = list(r.all_token_ids)
            data.new_block_ids.append(new_blocks[r.request_id])
            data.num_computed_tokens.append(r.num_computed_tokens)
            data.num_output_tokens.append(r.num_output_tokens)
        return data

    def _preempt(self, request: Request):
        self.kv_cache_manager.free(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.invalidate_eagle_hash_publication()
        self._acked.pop(request.request_id, None)
        request.num_preemptions += 1
        self.stats[request.request_id].preemptions += 1
        self.waiting.appendleft(request)

    # --- outputs ---
    def update_from_output(self, output: SchedulerOutput, runner_output):
        kv_out = runner_output.kv_connector_output
        failed = set()
        if kv_out is not None and kv_out.invalid_block_ids:
            failed = self._handle_invalid_blocks(kv_out.invalid_block_ids)
        stopped = []
        for req_id in output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if req_id in failed or request is None or request.is_finished():
                continue
            if self.eagle_hashing:  # what the step before this one computed is acknowledged
                request.mark_eagle_hashes_publishable(self._acked.get(req_id, 0),
                                                      self.block_size)
                self._acked[req_id] = request.num_computed_tokens
            index = runner_output.req_id_to_index[req_id]
            for token in runner_output.sampled_token_ids[index]:
                request.append_output_token_ids(token)
                if (request.num_output_tokens >= request.max_tokens or
                        request.num_tokens >= self.config.max_model_len):
                    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    stopped.append(request)
                    break
        for request in stopped:
            self.running.remove(request)
            self._free_request(request)
        if kv_out is not None:
            self._update_from_kv_xfer_finished(kv_out)
        if self.connector is not None:
            events = self.connector.take_events()
            if events:
                self.events.extend(events)

    def _handle_invalid_blocks(self, invalid_block_ids) -> set:
        """The recompute policy for synchronous loads: cut each running request back to its
        first invalid block (counted among its num_cached_tokens); a block shared with an earlier
        request in the batch is recomputed by that one."""
        affected, marked = set(), set()
        for request in self.running:
            groups = self.kv_cache_manager.get_block_ids(request.request_id)
            n_blocks = -(-request.num_cached_tokens // self.block_size)
            is_affected = marked_one = False
            for idx in range(n_blocks):  # a position is invalid when any group's block is
                b = next((ids[idx] for ids in groups if idx < len(ids) and ids[idx] != 0 and
                          ids[idx] in invalid_block_ids), None)
                if b is None:
                    continue
                is_affected = True
                if b in marked:
                    continue
                marked.add(b)
                if marked_one:
                    continue
                marked_one = True
                lost = request.num_cached_tokens - idx * self.block_size
                request.num_computed_tokens = idx * self.block_size
                request.num_external_computed_tokens -= lost
                self.stats[request.request_id].external_tokens -= lost
                self.stats[request.request_id].failed_load_tokens += lost
            if is_affected:
                if not marked_one:
                    request.num_computed_tokens = request.num_cached_tokens
                affected.add(request.request_id)
        return affected

    def _update_from_kv_xfer_finished(self, kv_out):
        if self.connector is not None:
            self.connector.update_connector_output(kv_out)
        for req_id in kv_out.finished_sending or ():
            self.delayed_frees.discard(req_id)
            self.kv_cache_manager.free(req_id)
            self.requests.pop(req_id, None)

    def _free_request(self, request: Request):
        delay = False
        if self.connector is not None:
            block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
            if supports_hma(getattr(self.connector, "_connector", self.connector)):
                delay, _params = self.connector.request_finished_all_groups(request, block_ids)
            else:
                assert len(block_ids) == 1, "a connector without SupportsHMA, several groups"
                delay, _params = self.connector.request_finished(request, block_ids[0])
        self.finished_req_ids.add(request.request_id)
        if delay:
            self.delayed_frees.add(request.request_id)
        else:
            self.kv_cache_manager.free(request.request_id)
            self.requests.pop(request.request_id, None)

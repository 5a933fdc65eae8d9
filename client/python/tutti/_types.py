"""The values the engine client's calls take and answer (tutti.Client): leases, store outcomes,
compute samples and reports, a Retrieve's outcome, and how a request names its session."""

from dataclasses import dataclass, field
from typing import List, Optional

# "declined": tuttid's admission policy (pool.admission) did not write the block; not an error,
# not worth retrying now (a later Store of the key may be admitted). "in_dram" (pool.admission
# "dram_front"): copied into tuttid's DRAM only, found by lookups while it stays there, NOT
# durable (lost at a restart, even with wait_durable); its next sight writes it to the SSD; not
# an error, not worth retrying.
STORE_OUTCOMES = {0: "unspecified", 1: "captured", 2: "durable", 3: "already_present",
                  4: "rejected_full", 5: "failed", 6: "declined", 7: "in_dram"}


@dataclass(frozen=True)
class _Name:
    """How a request names the session: its id and the token Attach gave (tuttid answers any
    other token as an unknown session; docs/security.md "Sessions")."""
    id: int
    token: bytes

    def fields(self):
        return dict(session_id=self.id, session_token=self.token)


class StoreOutcomes(list):
    """Client.store's answer: one outcome per key, and `rejected_why` (tuttid's words for the
    limit that refused the "rejected_full" blocks; "" when none was)."""
    rejected_why = ""


@dataclass(frozen=True)
class Lease:
    """Blocks [0, hits) of the looked-up chain are present and pinned until the Retrieve ends,
    release(), or ttl_ms passes. hits == 0 holds nothing (id 0).

    Load or recompute (docs/decision.md): retrieve keys[:load_blocks] (load_blocks <= hits) and
    compute the rest of the prompt; that Retrieve ends the lease's other pins too. load_blocks ==
    hits unless lookup() was given prompt_tokens and tuttid could predict; then decision_id != 0
    and the predicted times to first token (ms) are set: for load_blocks, for loading nothing,
    for loading every hit. Otherwise they are None."""
    id: int
    hits: int
    ttl_ms: int
    generation: int
    load_blocks: int = 0
    predicted_ttft_ms: Optional[float] = None
    predicted_recompute_ms: Optional[float] = None
    predicted_load_all_ms: Optional[float] = None
    decision_id: Optional[int] = None


@dataclass(frozen=True)
class ComputeSample:
    """One prefill's measured compute, for report_compute(): new_tokens computed (>= 1) in a
    context of context_tokens (the new ones included), layer_ms the mean time of one layer's
    forward (> 0), overhead_ms the prefill's time outside the layers (embedding, head, calls)."""
    new_tokens: int
    context_tokens: int
    layer_ms: float
    overhead_ms: float = 0.0


@dataclass(frozen=True)
class ComputeReport:
    """report_compute()'s answer: whether tuttid knew the decision_id, and then its prediction's
    error |predicted - measured| / measured."""
    decision_found: bool
    prediction_error: Optional[float] = None


@dataclass
class RetrieveOutcome:
    code: str = "OK"             # "OK", or why the transfer broke (then every block failed)
    message: str = ""
    failed: List[int] = field(default_factory=list)  # indices into the blocks to recompute
    layers_done: int = 0

    @property
    def ok(self):
        return self.code == "OK"

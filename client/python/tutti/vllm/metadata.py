"""What the connector's scheduler side hands its workers each step, and what each worker tells
the scheduler at start-up. All picklable (vLLM sends them between processes).
"""

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorHandshakeMetadata,
                                                                KVConnectorMetadata)

from tutti.layout import Namespace


@dataclass
class TuttiHandshake(KVConnectorHandshakeMetadata):
    """One worker (TP rank): the tuttid it attached to, its namespace and its engine_group. vLLM
    gathers them as {tp_rank: TuttiHandshake} for the scheduler's set_xfer_handshake_metadata."""
    tp_rank: int
    socket: str
    namespace: Namespace
    engine_group: bytes
    namespace_secret: bytes = b""  # the workers' and the scheduler's sessions share it
    # A hybrid model: the namespace of each KV cache group (its index in kv_cache_groups), one
    # session each; empty: one group, `namespace`.
    group_namespaces: Tuple[Namespace, ...] = ()

    def namespaces(self) -> Tuple[Namespace, ...]:
        return tuple(self.group_namespaces) or (self.namespace,)


@dataclass
class LoadSpec:
    """Load keys[i] into vLLM block block_ids[i] (the request's blocks after its local prefix
    hits). lease_ids: TP rank -> the scheduler's lease on that rank's tuttid that pins them.
    group: the KV cache group (its namespace and block table) of a hybrid model, else 0."""
    req_id: str
    keys: List[bytes]
    block_ids: List[int]
    lease_ids: Dict[int, int]
    group: int = 0


@dataclass
class SaveSpec:
    """Store vLLM block block_ids[i] as keys[i]: full blocks computed by the end of this step,
    of KV cache group `group` (a hybrid model's; 0 otherwise)."""
    req_id: str
    keys: List[bytes]
    block_ids: List[int]
    group: int = 0


@dataclass
class TuttiConnectorMetadata(KVConnectorMetadata):
    """A step's loads and saves, and the requests preempted before it (the workers drop their
    pending saves before vLLM reuses the blocks, even where vLLM does not call
    handle_preemptions with their ids)."""
    loads: List[LoadSpec] = field(default_factory=list)
    saves: List[SaveSpec] = field(default_factory=list)
    preempted: List[str] = field(default_factory=list)

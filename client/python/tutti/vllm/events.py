"""tuttid's events (KvCache.WatchEvents, one stream per TP rank) as vLLM KV cache events, for
the scheduler's take_events(). Pure logic: the scheduler feeds it; nothing here does I/O.

Rules:
- A key becomes BlockStored (medium "STORAGE" and locality "LOCAL" by default, as vLLM's own
  storage tiers publish them since v0.26/v0.27 and Dynamo's router maps them; both configurable
  for older consumers, which read "DISK" and no locality; locality only where the installed
  vLLM's events have the field; vLLM's block hash and its parent's as vLLM's own
  events give them: maybe_convert_block_hash, a 64-bit integer while
  VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is on, as by default; its token ids, LoRA and extra_keys,
  as remembered when this engine scheduled its save) once every TP rank stored it: an indexer
  joins it with the GPU tier's BlockStored of the same block by hash.
  Keys this engine did not save (another engine of the same namespace) are not announced: their
  tokens are unknown here.
- BlockRemoved (the same hash, medium and locality) as soon as any rank removed an announced key.
- A rank's new stream that did not resume: a changed pool_id (a new, empty pool), a new boot_id
  with blocks_lost_at_start > 0, or the same boot_id (events were dropped) -> AllBlocksCleared,
  and nothing stays announced; a new boot_id that lost nothing -> no event (the blocks are kept).
  A rank's first stream sets its baseline and emits nothing.

Thread-safety: none; the scheduler serialises calls (one lock).
"""

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

MEDIUM = "STORAGE"  # vLLM's storage tiers (vllm#48123); "DISK" for consumers older than that
LOCALITY = "LOCAL"  # the SSDs are this host's (vllm#48281); "" publishes no locality
LOCALITIES = ("LOCAL", "REMOTE", "")


def has_field(event_type, name: str) -> bool:
    """Whether vLLM's event type (a msgspec Struct in vLLM, a dataclass in its stand-in) has
    field `name`: older vLLMs have no `locality`."""
    fields = getattr(event_type, "__struct_fields__", None)
    if fields is not None:
        return name in fields
    if dataclasses.is_dataclass(event_type):
        return any(f.name == name for f in dataclasses.fields(event_type))
    return False


def external_hash(block_hash):
    """vLLM's block hash as vLLM's KV events carry it."""
    return maybe_convert_block_hash(block_hash)


@dataclass(frozen=True)
class BlockInfo:
    block_hash: Any               # external_hash() of vLLM's hash: int or bytes
    parent_hash: Optional[Any]
    token_ids: Tuple[int, ...]
    lora_id: Optional[int] = None
    lora_name: Optional[str] = None
    extra_keys: Optional[tuple] = None  # vLLM's extra keys of the block (LoRA, mm, salt)


class EventTranslator:
    def __init__(self, tp_size: int, block_size: int, max_keys: int = 1 << 20,
                 medium: str = MEDIUM, locality: str = LOCALITY, stored_type=BlockStored,
                 removed_type=BlockRemoved):
        """Remembers at most `max_keys` keys (the oldest saved go first; a forgotten key is
        announced no more, and its removal is not reported). Events carry `medium`, and
        `locality` unless it is "" or vLLM's event types have no such field
        (`locality_published` says which)."""
        if not isinstance(medium, str) or not medium:
            raise ValueError("events medium: %r; give a non-empty string such as \"STORAGE\" "
                             "or \"DISK\"" % (medium,))
        if locality not in LOCALITIES:
            raise ValueError("events locality: %r; give one of %s" % (locality, LOCALITIES))
        self._stored_type, self._removed_type = stored_type, removed_type
        self.medium = medium
        self._tagged = {}
        if locality and has_field(stored_type, "locality") and has_field(removed_type, "locality"):
            self._tagged = {"locality": locality}
        self.locality_published = self._tagged.get("locality", "")
        self._tp_size = tp_size
        self._block_size = block_size
        self._max_keys = max_keys
        self._info: "OrderedDict[bytes, BlockInfo]" = OrderedDict()
        self._holders: Dict[bytes, set] = {}
        self._announced = set()
        self._runs: Dict[int, Tuple[int, int]] = {}
        self.unknown_keys = 0  # events of keys this engine did not save

    def remember(self, key: bytes, info: BlockInfo):
        """Records what BlockStored will carry for `key` (call when scheduling its save)."""
        self._info[key] = info
        self._info.move_to_end(key)
        while len(self._info) > self._max_keys:
            old, _ = self._info.popitem(last=False)
            self._holders.pop(old, None)
            self._announced.discard(old)

    def on_stream_start(self, rank: int, pool_id: int, boot_id: int, blocks_lost_at_start: int,
                        resumed: bool) -> List:
        previous = self._runs.get(rank)
        self._runs[rank] = (pool_id, boot_id)
        if previous is None or resumed:
            return []
        old_pool, old_boot = previous
        wiped = pool_id != old_pool
        lost = boot_id != old_boot and blocks_lost_at_start > 0
        missed = boot_id == old_boot
        if not (wiped or lost or missed):
            return []
        for holders in self._holders.values():
            holders.discard(rank)
        self._announced.clear()
        return [AllBlocksCleared()]

    def on_events(self, rank: int, events: Sequence[Tuple[str, bytes]]) -> List:
        """`events`: (kind "stored" | "removed", key) in the rank's stream order."""
        out = []
        for kind, key in events:
            info = self._info.get(key)
            if info is None:
                self.unknown_keys += 1
                continue
            holders = self._holders.setdefault(key, set())
            if kind == "stored":
                holders.add(rank)
                if len(holders) == self._tp_size and key not in self._announced:
                    self._announced.add(key)
                    out.append(self._stored(info))
            elif kind == "removed":
                holders.discard(rank)
                if key in self._announced:
                    self._announced.discard(key)
                    out.append(self._removed_type(block_hashes=[info.block_hash],
                                                  medium=self.medium, **self._tagged))
        return out

    def _stored(self, info: BlockInfo):
        return self._stored_type(block_hashes=[info.block_hash],
                                 parent_block_hash=info.parent_hash,
                                 token_ids=list(info.token_ids), block_size=self._block_size,
                                 lora_id=info.lora_id, medium=self.medium,
                                 lora_name=info.lora_name, extra_keys=[info.extra_keys],
                                 **self._tagged)

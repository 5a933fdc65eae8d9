"""The stores and evictions of a session's namespace (KvCache.WatchEvents), as typed values.

An EventStream iterates over EventBatch values, one per message of the server stream: the first
carries pool_id, boot_id, blocks_lost_at_start and resumed, later ones only events. It ends
(StopIteration) when cancel() was called or its Client detached, and raises Unavailable when the
session ended (tuttid restarted, expired the session, went away): resubscribe with the last
seen (seq, boot_id) once the Client re-attached (Client.watch_events(after_seq, boot_id)); the
new stream's first batch says whether it resumed.

Thread-safety: one thread iterates; cancel() may be called from any thread.
"""

from dataclasses import dataclass, field
from typing import List

KINDS = {1: "stored", 2: "removed"}


@dataclass(frozen=True)
class BlockEvent:
    seq: int    # per namespace and tuttid run, from 1, one more per event
    kind: str   # "stored" (durable, a Lookup finds it) or "removed" (left the pool)
    key: bytes


@dataclass(frozen=True)
class EventBatch:
    """One WatchEventsResponse. pool_id, boot_id, blocks_lost_at_start and resumed are set on a
    stream's first batch (first is True) and 0/False on later ones."""
    first: bool
    pool_id: int = 0
    boot_id: int = 0
    blocks_lost_at_start: int = 0
    resumed: bool = False
    events: List[BlockEvent] = field(default_factory=list)


def batch_from_proto(msg, first):
    """An EventBatch from a WatchEventsResponse; events of an unknown kind are dropped."""
    events = [BlockEvent(e.seq, KINDS[e.kind], bytes(e.key)) for e in msg.events
              if e.kind in KINDS]
    if not first:
        return EventBatch(False, events=events)
    return EventBatch(True, msg.pool_id, msg.boot_id, msg.blocks_lost_at_start, msg.resumed,
                      events)


class EventStream:
    """An iterator of EventBatch over one WatchEvents call (see the module's docstring).
    Created by Client.watch_events; `on_error(rpc_error)` maps a failed call to a TuttiError
    (None: the stream was cancelled, iteration just ends); `on_close()` runs once at the end."""

    def __init__(self, call, on_error, on_close):
        self._call = call
        self._on_error = on_error
        self._on_close = on_close
        self._first = True
        self._closed = False

    def __iter__(self):
        return self

    def __next__(self) -> EventBatch:
        if self._closed:
            raise StopIteration
        try:
            msg = next(self._call)
        except StopIteration:
            self._close()
            raise
        except Exception as e:  # grpc.RpcError: the call ended
            self._close()
            err = self._on_error(e)
            if err is None:
                raise StopIteration from None
            raise err from None
        batch = batch_from_proto(msg, self._first)
        self._first = False
        return batch

    def cancel(self):
        """Ends the stream; a thread blocked in next() gets StopIteration. Idempotent."""
        self._call.cancel()

    def _close(self):
        if not self._closed:
            self._closed = True
            self._on_close()

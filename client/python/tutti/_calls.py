"""Deadlines sized to each call, and the calls in flight that end with their session.

A stopped or wedged tuttid must not hold an engine longer than the call could take: a Lookup is
answered from memory and gets seconds, a Store or Retrieve gets a base plus the time to move its
bytes at a floor bandwidth. And once the client knows its session is over (KeepAlive answered
NOT_FOUND or timed out, tuttid went away) the calls still waiting on it are cancelled at once
and raise Unavailable saying why, instead of waiting out their deadlines.
"""

import math
import threading
from dataclasses import dataclass, fields

from tutti import errors


@dataclass(frozen=True)
class Timeouts:
    """Deadlines of the client's calls, in seconds. A call tuttid does not answer in time raises
    DeadlineExceeded (an Unavailable: a miss, a dropped save). Store and Retrieve get their base
    plus their bytes over min_bandwidth (bytes per second)."""
    short: float = 5.0      # KeepAlive, Lookup, Release, Detach: tuttid answers from memory
    attach: float = 15.0    # the handoff plus Attach (tuttid checks and maps the memory)
    store: float = 10.0     # a Store, answered once its blocks are captured
    durable: float = 30.0   # a Store with wait_durable: SSD writes and the journal's fsync
    retrieve: float = 10.0  # a Retrieve stream, until its last layer
    min_bandwidth: float = float(64 << 20)

    @classmethod
    def uniform(cls, seconds):
        """One deadline for every call, whatever its size (Client's call_timeout)."""
        return cls(short=seconds, attach=seconds, store=seconds, durable=seconds,
                   retrieve=seconds, min_bandwidth=math.inf)

    def check(self):
        """Raises InvalidArgument naming the first field that is not a positive number."""
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or not v > 0:
                raise errors.InvalidArgument("Timeouts.%s = %r: must be a positive number of %s"
                                             % (f.name, v, "bytes per second"
                                                if f.name == "min_bandwidth" else "seconds"))

    def for_store(self, nbytes, wait_durable):
        """(deadline in seconds, the field it comes from) of a Store moving `nbytes`."""
        base, name = (self.durable, "durable") if wait_durable else (self.store, "store")
        return base + nbytes / self.min_bandwidth, name

    def for_retrieve(self, nbytes):
        return self.retrieve + nbytes / self.min_bandwidth, "retrieve"


class InFlight:
    """The calls of one Client in flight (grpc futures and response streams), by the session
    generation they belong to. end(generation, why) cancels that generation's calls and any it
    is given later. Thread-safe; cancel() of a gRPC call does not block."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls = {}  # generation -> set of calls
        self._ended = {}  # generation -> why it ended

    def add(self, generation, call):
        """Tracks `call`; cancels it at once if `generation` already ended."""
        with self._lock:
            ended = generation in self._ended
            if not ended:
                self._calls.setdefault(generation, set()).add(call)
        if ended:
            call.cancel()

    def discard(self, generation, call):
        with self._lock:
            calls = self._calls.get(generation)
            if calls is not None:
                calls.discard(call)
                if not calls:
                    del self._calls[generation]

    def end(self, generation, why):
        """Marks `generation` over (the first reason stays) and cancels its calls."""
        with self._lock:
            self._ended.setdefault(generation, why)
            calls = self._calls.pop(generation, set())
        for call in calls:
            call.cancel()

    def why(self, generation):
        """Why `generation` ended, or None while it lives."""
        with self._lock:
            return self._ended.get(generation)

"""The tutti engine client: attach an engine's paged KV cache to tuttid, look up cached prefixes,
load them layer by layer into the engine's own blocks, store new blocks.

Same operations and failure model as the C++ library (client/cpp/include/tutti/client.h):
- host mode: the KV cache is in shared memory (tutti.SharedMemory: a memfd by default) whose
  descriptors the client hands to tuttid before every Attach (tutti._handoff); Retrieval.wait_layer
  blocks until tuttid reports the layer copied.
- cuda mode: the KV cache is device memory; the client exports IPC handles of the allocations that
  hold it and allocates ready words; wait_layer enqueues a GPU-side wait on the engine's stream and
  returns at once.
A broken transfer (a failed block, tuttid dying, a refused call) never leaves the engine waiting:
every layer wait is released (in cuda mode the client writes the ready words itself) and
Retrieval.wait() names the blocks to recompute. When tuttid goes away the client re-attaches by
itself once it is back; meanwhile calls raise tutti.Unavailable (treat as a miss / dropped save).
Every call has a deadline sized to it (tutti.Timeouts), and the calls in flight when the session
ends (tuttid expired it, stopped answering or went away) are cancelled at once with Unavailable.

Thread-safety: a Client may be used from several threads; its Retrieves run one at a time
(retrieve() waits until the previous transfer ended). A Retrieval is used by one thread.
"""

import os
import threading
from typing import Optional, Sequence, Tuple

import grpc

# Also imported for those who read them from tutti.client (the vLLM connector, tests, tools), as
# before the session, the lookups and the transfers moved out: InFlight, hand_off,
# RetrieveOutcome, STORE_OUTCOMES, with_credential, _Name.
from tutti import _lookups, errors
from tutti._attach import (build_cuda_attach, build_host_attach, build_lookup_only_attach,
                           check_namespace_secret, region_fds, with_credential)
from tutti._calls import InFlight, Timeouts
from tutti._events import EventStream
from tutti._handoff import hand_off
from tutti._lookups import Lookups, PendingLookup
from tutti._retrieval import Retrieval, _stream_handle
from tutti._session import Session, _pick_timeouts
from tutti._transfers import Transfers
from tutti._types import (STORE_OUTCOMES, ComputeReport, ComputeSample, Lease, RetrieveOutcome,
                          StoreOutcomes, _Name)
from tutti.layout import Namespace, ObjectTensor
from tutti.v1 import kvcache_pb2 as pb

DEFAULT_SOCKET = "/run/tutti/tuttid.sock"


class Client(Session, Lookups, Transfers):
    """One engine attached to tuttid. Use Client.attach(...)."""

    def __init__(self, socket_path, request, words=None, device=None, reattach=True,
                 connect_timeout=5.0, call_timeout=None, timeouts=None, fds=()):
        """`fds`: the host regions' descriptors, in region order, owned by the Client from here
        on (closed at detach, or here on failure); the handoff sends them before every Attach."""
        self._fds = list(fds)
        self._retrieve_lock = threading.Lock()
        self._store_lock = threading.Lock()  # cuda mode: tuttid takes one Store at a time
        self._inflight = None
        self._native = None  # tutti._lookup's channel to tuttid (lookup_many), made on first use
        self._lookup_framing = None  # _lookup_request_bytes' session fields, of one session
        self._native_lock = threading.Lock()
        try:
            self._timeouts = _pick_timeouts(call_timeout, timeouts)
            self._open(socket_path, request, words, device, reattach, connect_timeout)
        except BaseException:
            self._close_fds()
            raise

    @classmethod
    def attach(cls, namespace: Namespace, num_blocks: int, objects: Sequence[ObjectTensor],
               host_regions: Optional[Sequence[Tuple[str, int, int]]] = None,
               cuda_device: Optional[int] = None, socket_path: str = DEFAULT_SOCKET,
               engine_id: str = "python-engine", reattach: bool = True,
               connect_timeout: float = 5.0, call_timeout: Optional[float] = None,
               timeouts: Optional[Timeouts] = None, engine_group: bytes = b"",
               namespace_secret: bytes = b"") -> "Client":
        """Connects, hands the memory over and attaches. Host mode: pass host_regions
        [(name, address, size)] that hold every object: SharedMemory.region() (which carries its
        descriptor), or the name of a POSIX shm object this process can open read-write (opened
        now, kept open). Cuda mode: pass cuda_device; every object is device memory there.
        Deadlines: `timeouts` (default Timeouts()), or `call_timeout` seconds for every call.
        Raises InvalidArgument for inconsistent arguments, Unavailable when tuttid cannot be
        reached, and tuttid's error otherwise (e.g. FailedPrecondition when its pool cannot hold
        this layout). The memory must outlive the Client. `engine_group` (16 to 64 random bytes,
        or empty: no sharing): this session may retrieve under leases of other sessions of the
        same group, namespace and user, e.g. a memory-less one (attach_lookup_only).
        `namespace_secret` (16 to 64 random bytes, or empty): tuttid scopes namespaces to the
        engine's user; engines of any user that give the same secret share one namespace
        (docs/security.md "Namespaces")."""
        secret = check_namespace_secret(namespace_secret)
        if cuda_device is not None:
            from tutti import _cuda
            words = _cuda.ReadyWords(cuda_device, namespace.layout.num_layers + 1)
            try:
                req = build_cuda_attach(engine_id, namespace, num_blocks, objects, cuda_device,
                                        words, engine_group=engine_group)
                req.namespace_secret = secret
                return cls(socket_path, req, words, cuda_device, reattach, connect_timeout,
                           call_timeout, timeouts)
            except BaseException:
                words.close()
                raise
        req = build_host_attach(engine_id, namespace, num_blocks, objects, host_regions,
                                engine_group)
        req.namespace_secret = secret
        return cls(socket_path, req, None, None, reattach, connect_timeout, call_timeout, timeouts,
                   fds=region_fds(host_regions))

    @classmethod
    def attach_lookup_only(cls, namespace: Namespace, engine_group: bytes,
                           socket_path: str = DEFAULT_SOCKET, engine_id: str = "python-lookup",
                           reattach: bool = True, connect_timeout: float = 5.0,
                           call_timeout: Optional[float] = None,
                           timeouts: Optional[Timeouts] = None,
                           namespace_secret: bytes = b"") -> "Client":
        """A memory-less session (no KV memory is handed over): it may lookup(), release(),
        report_compute() and watch_events(); retrieve() and store() raise FailedPrecondition
        (tuttid's answer). Sessions attached with the same `engine_group` (16 to 64 bytes,
        required), namespace and user retrieve under its leases (retrieve(..., more_leases=)).
        A vLLM scheduler uses one per TP rank. `namespace_secret` as for attach(). Raises as
        attach()."""
        req = build_lookup_only_attach(engine_id, namespace, engine_group)
        req.namespace_secret = check_namespace_secret(namespace_secret)
        return cls(socket_path, req, None, None, reattach, connect_timeout, call_timeout,
                   timeouts)

    # --- the engine API ---
    def lookup(self, keys, prompt_tokens: Optional[int] = None) -> Lease:
        """How many leading keys of one chain are cached; they are pinned under the lease.
        `keys`: a sequence of 16-byte keys, or one bytes object of them concatenated (the
        cheaper form for long chains). With prompt_tokens (the whole prompt's length, cached or
        not) tuttid also advises how many of the hits to load (Lease.load_blocks). Raises
        Unavailable while tuttid is unreachable or does not answer within Timeouts.short (treat
        as a miss); InvalidArgument for a key that is not 16 bytes or prompt_tokens outside
        [0, 16777216]."""
        return self.start_lookup(keys, prompt_tokens).result()

    def start_lookup(self, keys, prompt_tokens: Optional[int] = None) -> "PendingLookup":
        """lookup() without waiting for the answer: PendingLookup.result() gives the Lease (or
        raises as lookup() does). Lets one thread look up on several tuttids (TP ranks) at
        once. Argument errors are raised here."""
        req, gen = self._lookup_request(keys, prompt_tokens)
        return PendingLookup(self, self._start_call("Lookup", req, gen, self._timeouts.short),
                             gen)

    def lookup_inline(self, keys, prompt_tokens: Optional[int] = None) -> Lease:
        """lookup() on the calling thread (gRPC's blocking call): no hand-off to and from gRPC's
        polling thread, which on a busy host is much of a Lookup's time and most of its tail
        (bench/results/vllm_lookup_latency.jsonl). Raises as lookup(), but a Lookup in flight
        when its session ends is not cancelled: it ends with tuttid's answer or at its
        deadline (Timeouts.short). A session already over raises Unavailable at once, as
        lookup() does."""
        req, gen = self._lookup_request(keys, prompt_tokens)
        timeout = self._timeouts.short
        try:
            if self._calls.why(gen) is not None:  # lookup() would cancel it at once
                raise grpc.FutureCancelledError()
            resp = self._stub.Lookup(req, timeout=timeout)
        except (grpc.RpcError, grpc.FutureCancelledError) as e:
            err = self._error("Lookup", e, timeout, "short", gen)
            self._observe(err, gen)
            raise err from None
        return self._lease_of(resp, gen)

    @staticmethod
    def lookup_many(lookups) -> list:
        """Lookups on several clients at once (a vLLM scheduler's TP ranks, each its own
        tuttid): `lookups` is [(client, keys, prompt_tokens)]; the answer, in the same order,
        a Lease or the TuttiError that client's lookup() would raise, for each. Every Lookup is
        in flight together: the wait is the slowest one's.

        With tutti._lookup (native_lookup(): a C extension) the calls go out and complete on
        this thread without the GIL, through a second connection of each client to its tuttid:
        its lookup socket (<socket>.lookup, no gRPC on either end) where tuttid serves one and
        TUTTI_LOOKUP_SOCKET is not 0, else Debian's libgrpc++ at about the C++ client's cost per
        call; grpcio's hand-off to its polling thread was most of a Lookup's time and tail on a
        busy host, and gRPC's round trip most of what was left
        (bench/results/vllm_lookup_latency.jsonl). Without it (another platform, or
        TUTTI_NATIVE_LOOKUP=0): start_lookup() on every client but the last, lookup_inline()
        on the last. As with lookup_inline, a Lookup in flight when its session ends is not
        cancelled: it ends with tuttid's answer or at its deadline (Timeouts.short)."""
        return _lookups.lookup_many(lookups, native_lookup())

    @staticmethod
    def release_many(releases) -> list:
        """release() of several leases of several clients at once (a request's leases on every
        TP rank): `releases` is [(client, lease)]; the answer, in order, None or the TuttiError
        that client's release() would raise. Through tutti._lookup where it loads (one call,
        in flight together, as lookup_many), else release() one after the other."""
        return _lookups.release_many(releases, native_lookup())

    def warm_lookup_many(self):
        """Opens lookup_many's own connection to tuttid now (it connects in the background),
        so that the first lookup_many does not wait for it. Nothing without tutti._lookup."""
        native = native_lookup()
        if native is not None:
            self._native_channel(native)

    def _native_channel(self, native):
        with self._native_lock:
            if self._native is None:
                self._native = native.open(self._socket_path, lookup_socket_wanted())
            return self._native

    def report_compute(self, samples: Sequence[ComputeSample], decision_id: Optional[int] = None,
                       measured_ttft_ms: Optional[float] = None) -> ComputeReport:
        """Reports measured compute of this engine's prefills (at most 1024 ComputeSamples) for
        tuttid's load-or-recompute model and, with decision_id (Lease.decision_id) and
        measured_ttft_ms, the time to first token of the prefill that followed that decision.
        Raises InvalidArgument naming the field for a bad value (nothing is recorded then),
        Unavailable while tuttid is unreachable."""
        if (decision_id is None) != (measured_ttft_ms is None):
            raise errors.InvalidArgument("report_compute: give decision_id and measured_ttft_ms "
                                         "together, or neither")
        sid, gen = self._current()
        req = pb.ReportComputeRequest(**sid.fields(), decision_id=int(decision_id or 0),
                                      measured_ttft_ms=float(measured_ttft_ms or 0.0))
        for s in samples:
            req.samples.add(new_tokens=int(s.new_tokens), context_tokens=int(s.context_tokens),
                            layer_ms=float(s.layer_ms), overhead_ms=float(s.overhead_ms))
        resp = self._call("ReportCompute", req, gen, self._timeouts.short)
        return ComputeReport(resp.decision_found,
                             resp.prediction_error if resp.decision_found else None)

    def retrieve(self, lease: Optional[Lease], keys: Sequence[bytes],
                 engine_blocks: Sequence[int], layer_begin: int = 0, layer_end: int = 0,
                 more_leases: Sequence[int] = ()) -> Retrieval:
        """Starts copying layers [layer_begin, layer_end) (0: all) of keys[i] into engine block
        engine_blocks[i]; the keys must be under `lease` or one of `more_leases` (lease ids of
        this session, or of a session of the same engine_group, e.g. a scheduler's memory-less
        one: RetrieveRequest.lease_ids, at most 1024); all of them end with the transfer.
        `lease` may be None when more_leases is not empty. Returns once the request is sent (the
        call starts on this thread; a thread of its own reads the progress); wait per layer with
        Retrieval.wait_layer. Waits first for the previous Retrieve of this Client to end.
        Raises Unavailable for a lease from before a re-attach (a foreign lease tuttid no longer
        has breaks the transfer: every block failed). The transfer breaks (code
        DEADLINE_EXCEEDED) past Timeouts.for_retrieve, and at once (UNAVAILABLE) when the
        session ends."""
        if len(keys) != len(engine_blocks) or not keys:
            raise errors.InvalidArgument("%d keys but %d engine blocks" % (len(keys),
                                                                          len(engine_blocks)))
        more_leases = [int(i) for i in more_leases]
        if lease is None and not more_leases:
            raise errors.InvalidArgument("retrieve: no lease (give lease or more_leases)")
        if len(more_leases) > 1024:
            raise errors.InvalidArgument("more_leases: %d ids; at most 1024" % len(more_leases))
        layer_end = layer_end or self._num_layers
        if not 0 <= layer_begin < layer_end <= self._num_layers:
            raise errors.InvalidArgument("layers [%d, %d) of %d" % (layer_begin, layer_end,
                                                                     self._num_layers))
        with self._retrieve_lock:
            return self._start_retrieve(lease, keys, engine_blocks, layer_begin, layer_end,
                                        more_leases)

    def store(self, keys: Sequence[bytes], engine_blocks: Sequence[int], wait_durable=False,
              layer_begin=0, layer_end=0, stream=None, staging_wait_ms=0) -> "StoreOutcomes":
        """Copies engine block engine_blocks[i] as keys[i]; one outcome per key ("captured",
        "durable", "already_present", "rejected_full", "failed", "declined": tuttid's admission
        policy did not write it, not an error; "in_dram": kept in tuttid's DRAM only, not
        durable even with wait_durable, not an error; a StoreOutcomes, with
        rejected_why) once captured (durable with wait_durable): from then on the engine may
        overwrite the blocks. cuda mode: `stream` (the one that computed the blocks; None: torch's
        current stream) is synchronized first, and Stores run one at a time (tuttid's per-session
        rule). staging_wait_ms (0 .. 10000): when tuttid's store staging has no room, it waits up
        to this long for some before answering rejected_full. Deadline: Timeouts.for_store, plus
        the wait."""
        if (isinstance(staging_wait_ms, bool) or not isinstance(staging_wait_ms, int)
                or not 0 <= staging_wait_ms <= 10000):
            raise errors.InvalidArgument("staging_wait_ms must be an int in [0, 10000], got %r"
                                         % (staging_wait_ms,))
        if len(keys) != len(engine_blocks) or not keys:
            raise errors.InvalidArgument("%d keys but %d engine blocks" % (len(keys),
                                                                          len(engine_blocks)))
        if self._words is None:
            return self._store(keys, engine_blocks, wait_durable, layer_begin, layer_end,
                               staging_wait_ms)
        from tutti import _cuda
        _cuda.synchronize_stream(self._device, _stream_handle(stream))
        with self._store_lock:
            return self._store(keys, engine_blocks, wait_durable, layer_begin, layer_end,
                               staging_wait_ms)

    def watch_events(self, after_seq: int = 0, boot_id: int = 0) -> EventStream:
        """Streams the stores and evictions of this session's namespace (tutti._events): an
        iterator of EventBatch, resuming after event `after_seq` of tuttid run `boot_id` (both
        from an earlier stream; 0, 0: from this session's attach on). The stream is cancelled when this session
        ends (next() raises Unavailable) or the Client detaches (iteration ends); cancel() ends
        it too. A subscriber too far behind is cut off (ResourceExhausted): resume with its last
        seq. Raises Unavailable while not attached."""
        sid, gen = self._current()
        call = self._stub.WatchEvents(pb.WatchEventsRequest(**sid.fields(),
                                                            after_seq=int(after_seq),
                                                            boot_id=int(boot_id)))
        self._calls.add(gen, call)

        def on_error(e):
            if isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.CANCELLED and (
                    self._calls.why(gen) is None or self._stopped()):
                return None
            err = self._error("WatchEvents", e, 0, "short", gen)
            self._observe(err, gen)
            return err

        return EventStream(call, on_error, lambda: self._calls.discard(gen, call))

    def release(self, lease: Lease):
        """Ends a lease that will not be retrieved (one from before a re-attach is already gone)."""
        if lease.id == 0:
            return
        sid, gen = self._current()
        if lease.generation != gen:
            return
        self._call("Release", pb.ReleaseRequest(**sid.fields(), lease_id=lease.id), gen,
                   self._timeouts.short)

    def detach(self):
        """Waits for a Retrieve in flight, stops the keep-alive thread, detaches, closes the
        host regions' descriptors (the memory itself stays the caller's). Idempotent."""
        with self._retrieve_lock:
            self._finish_inflight()
        self._end_session()
        with self._native_lock:
            self._native = None  # the capsule closes its channel
        self._close_fds()
        if self._words is not None:
            self._words.close()
            self._words = None

    close = detach

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()
        return False

    @property
    def timeouts(self) -> Timeouts:
        """The deadlines this Client's calls get."""
        return self._timeouts

    @property
    def info(self):
        """A dict: session_id, namespace_id, generation, object_bytes, max_blocks_per_call,
        session_ttl_ms, attached, mode."""
        with self._cv:
            a = self._attach_response
            return dict(session_id=self._session_id, namespace_id=a.namespace_id,
                        generation=self._generation, object_bytes=a.object_bytes,
                        max_blocks_per_call=a.max_blocks_per_call,
                        session_ttl_ms=a.session_ttl_ms, attached=self._state == "attached",
                        mode="cuda" if self._words is not None else "host")


_NATIVE = None  # tutti._lookup once tried; False where it did not load


def native_lookup():
    """The tutti._lookup module that Client.lookup_many uses, or None: not built for this
    platform, its libraries (libgrpc++ 1.51) missing, or turned off by TUTTI_NATIVE_LOOKUP=0.
    Loaded on first use (it starts a gRPC core of its own)."""
    global _NATIVE
    if _NATIVE is None:
        if os.environ.get("TUTTI_NATIVE_LOOKUP", "1") == "0":
            _NATIVE = False
        else:
            try:
                from tutti import _lookup
                _NATIVE = _lookup
            except ImportError:
                _NATIVE = False
    return _NATIVE or None


def lookup_socket_wanted() -> bool:
    """Whether tutti._lookup sends Lookups to tuttid's lookup socket (<socket>.lookup, where
    tuttid serves one): yes unless TUTTI_LOOKUP_SOCKET=0 (then libgrpc++ only)."""
    return os.environ.get("TUTTI_LOOKUP_SOCKET", "1") != "0"

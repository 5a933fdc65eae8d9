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
import socket as _socket
import threading
from typing import Optional, Sequence, Tuple

import grpc

from tutti import errors
from tutti._attach import (build_cuda_attach, build_host_attach, build_lookup_only_attach,
                           check_namespace_secret, region_fds, with_credential)
from tutti._calls import InFlight, Timeouts
from tutti._events import EventStream
from tutti._handoff import hand_off
from tutti._retrieval import Retrieval, _stream_handle
from tutti._types import (STORE_OUTCOMES, ComputeReport, ComputeSample, Lease, RetrieveOutcome,
                          StoreOutcomes, _Name)
from tutti.layout import Namespace, ObjectTensor
from tutti.v1 import kvcache_pb2 as pb
from tutti.v1 import kvcache_pb2_grpc as pb_grpc

DEFAULT_SOCKET = "/run/tutti/tuttid.sock"
_MIN_BACKOFF = 0.05
_MAX_BACKOFF = 1.0


def _probe(path):
    """Raises Unavailable saying why `path` does not accept connections."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        raise errors.Unavailable("cannot reach tuttid at %s: %s; is it running? (systemctl status "
                                 "tuttid)" % (path, e.strerror or e)) from None
    finally:
        s.close()


class Client:
    """One engine attached to tuttid. Use Client.attach(...)."""

    def __init__(self, socket_path, request, words=None, device=None, reattach=True,
                 connect_timeout=5.0, call_timeout=None, timeouts=None, fds=()):
        """`fds`: the host regions' descriptors, in region order, owned by the Client from here
        on (closed at detach, or here on failure); the handoff sends them before every Attach."""
        self._fds = list(fds)
        try:
            self._timeouts = _pick_timeouts(call_timeout, timeouts)
            self._open(socket_path, request, words, device, reattach, connect_timeout)
        except BaseException:
            self._close_fds()
            raise

    def _open(self, socket_path, request, words, device, reattach, connect_timeout):
        self._socket_path = socket_path
        self._request = request
        self._words = words
        self._device = device
        self._reattach = reattach
        self._connect_timeout = connect_timeout
        self._num_layers = request.namespace.layout.num_layers
        self._parts = max(len(request.placements) // max(self._num_layers, 1), 1)
        _probe(socket_path)
        self._channel = grpc.insecure_channel(
            "unix:" + socket_path,
            options=[("grpc.initial_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 1000),
                     ("grpc.max_receive_message_length", 64 << 20)])
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise errors.Unavailable("cannot reach tuttid at %s: no gRPC connection within %.1f s"
                                     % (socket_path, connect_timeout)) from None
        self._stub = pb_grpc.KvCacheStub(self._channel)
        self._cv = threading.Condition()
        self._state = "lost"
        self._lost_why = "not attached yet"
        self._session_id = 0
        self._session_token = b""
        self._generation = 0
        self._attach_response = pb.AttachResponse()
        self._stop = False
        self._wake = False
        self._ticket = 0
        self._ticket_lock = threading.Lock()
        self._retrieve_lock = threading.Lock()
        self._store_lock = threading.Lock()  # cuda mode: tuttid takes one Store at a time
        self._inflight = None
        self._calls = InFlight()
        self._native = None  # tutti._lookup's channel to tuttid (lookup_many), made on first use
        self._lookup_framing = None  # _lookup_request_bytes' session fields, of one session
        self._native_lock = threading.Lock()
        try:
            self._attach_now(self._timeouts.attach)
        except BaseException:
            self._channel.close()
            raise
        self._thread = threading.Thread(target=self._loop, name="tutti-keepalive", daemon=True)
        self._thread.start()
        # The connection dropping (tuttid stopped or died) wakes the keep-alive thread at once, so
        # an idle engine re-attaches about a second after a restart, not at its next KeepAlive.
        self._connectivity = None
        self._channel.subscribe(self._on_connectivity, try_to_connect=False)

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

    # --- session ---
    def _attach_now(self, timeout):
        """Hands over the memory (a new credential each time: single use) and attaches."""
        credential = hand_off(self._socket_path, self._fds, timeout)
        try:
            resp = self._stub.Attach(with_credential(self._request, credential), timeout=timeout)
        except grpc.RpcError as e:
            raise self._error("Attach", e, timeout, "attach") from None
        with self._cv:
            if self._state == "detached":
                return
            self._state = "attached"
            self._session_id = resp.session_id
            self._session_token = resp.session_token
            self._attach_response = resp
            self._generation += 1

    def _current(self):
        with self._cv:
            if self._state == "attached":
                return _Name(self._session_id, self._session_token), self._generation
            if self._state == "lost":
                raise errors.Unavailable("lost the session with tuttid at %s (%s); %s" % (
                    self._socket_path, self._lost_why, "re-attaching in the background"
                    if self._reattach else "reattach is off"))
            raise errors.FailedPrecondition("detached from tuttid")

    def _observe(self, err, generation):
        if isinstance(err, errors.DeadlineExceeded) or isinstance(err, errors.NotFound):
            self._wake_loop()  # its KeepAlive finds out whether the session is gone
        elif isinstance(err, errors.Unavailable):
            self._mark_lost(generation, err.message)

    def _wake_loop(self):
        with self._cv:
            self._wake = True
            self._cv.notify_all()

    def _on_connectivity(self, state):
        with self._cv:
            was_ready = self._connectivity == grpc.ChannelConnectivity.READY
            self._connectivity = state
        if was_ready and state != grpc.ChannelConnectivity.READY:
            self._wake_loop()

    def _mark_lost(self, generation, why):
        """Ends session `generation`: its calls in flight are cancelled, re-attach starts."""
        self._calls.end(generation, why)
        with self._cv:
            if self._state == "attached" and generation == self._generation:
                self._state = "lost"
                self._lost_why = why
                self._session_id = 0
                self._session_token = b""
                self._wake = True
                self._cv.notify_all()

    def _loop(self):
        sleep = _MIN_BACKOFF
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._stop or self._wake, sleep)
                if self._stop:
                    return
                self._wake = False
            sleep = self._tick(sleep)

    def _tick(self, backoff):
        with self._cv:
            state, gen = self._state, self._generation
            sid = _Name(self._session_id, self._session_token)
            period = max(self._attach_response.session_ttl_ms / 4000.0, 0.01)
        if state == "attached":
            self._keep_alive(sid, gen, min(max(period, 1.0), self._timeouts.short))
            return period if self._calls.why(gen) is None else _MIN_BACKOFF
        if state == "lost" and self._reattach:
            try:
                self._attach_now(min(self._timeouts.attach, max(self._connect_timeout, 1.0)))
                return period
            except errors.TuttiError:
                return min(backoff * 2, _MAX_BACKOFF)
        return _MAX_BACKOFF

    def _keep_alive(self, sid, gen, timeout):
        try:
            self._stub.KeepAlive(pb.KeepAliveRequest(**sid.fields()), timeout=timeout)
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.NOT_FOUND:
                self._mark_lost(gen, "tuttid no longer knows session %d: it expired or tuttid "
                                     "restarted" % sid.id)
            elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._mark_lost(gen, "tuttid did not answer a KeepAlive within %.1f s" % timeout)
            elif code == grpc.StatusCode.UNAVAILABLE:
                self._mark_lost(gen, "tuttid went away: %s" % (e.details() or "unavailable"))

    def _next_ticket(self):
        with self._ticket_lock:
            self._ticket = (self._ticket + 1) & 0xFFFFFFFF
            if self._ticket == 0:
                self._ticket = 1
            return self._ticket

    def _error(self, name, rpc_error, timeout, field_name, generation=None):
        """The TuttiError for a failed call `name` whose deadline was `timeout` s (Timeouts.
        `field_name`): its session's end when it was cancelled for that, else tuttid's answer."""
        why = self._calls.why(generation) if generation is not None else None
        code = rpc_error.code() if isinstance(rpc_error, grpc.RpcError) else None
        if why is not None and (code in (None, grpc.StatusCode.CANCELLED)):
            return errors.Unavailable("%s cancelled: the session with tuttid at %s ended (%s)" %
                                      (name, self._socket_path, why))
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return errors.DeadlineExceeded(
                "tuttid at %s did not answer %s within %.1f s (Timeouts.%s); is it stopped or "
                "overloaded?" % (self._socket_path, name, timeout, field_name))
        return errors.from_rpc(rpc_error)

    def _call(self, name, request, generation, timeout, field_name="short"):
        """Unary call `name` under session `generation`, cancelled if the session ends."""
        return self._finish_call(self._start_call(name, request, generation, timeout,
                                                  field_name))

    def _start_call(self, name, request, generation, timeout, field_name="short"):
        call = getattr(self._stub, name).future(request, timeout=timeout)
        self._calls.add(generation, call)
        return (name, call, generation, timeout, field_name)

    def _finish_call(self, started):
        name, call, generation, timeout, field_name = started
        try:
            return call.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as e:
            err = self._error(name, e, timeout, field_name, generation)
            self._observe(err, generation)
            raise err from None
        finally:
            self._calls.discard(generation, call)

    def _transfer_bytes(self, blocks, layer_begin, layer_end):
        layers = (layer_end or self._num_layers) - layer_begin
        with self._cv:
            object_bytes = self._attach_response.object_bytes
        return blocks * max(layers, 0) * self._parts * object_bytes

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
        lookups = list(lookups)
        out = [None] * len(lookups)
        native = native_lookup()
        started = []  # (index, client, request, generation): argument errors already answered
        for i, (client, keys, prompt_tokens) in enumerate(lookups):
            try:
                # tutti._lookup takes the serialized request: built as bytes, no message object
                if native is None:
                    req, gen = client._lookup_request(keys, prompt_tokens)
                else:
                    req, gen = client._lookup_request_bytes(keys, prompt_tokens)
                if client._calls.why(gen) is not None:  # the session is over: no call
                    raise client._failed_lookup(grpc.FutureCancelledError(), gen)
                started.append((i, client, req, gen))
            except errors.TuttiError as e:
                out[i] = e
        if native is None:
            pending = []
            for k, (i, client, req, gen) in enumerate(started):
                if k == len(started) - 1:
                    out[i] = client._inline_call(req, gen)
                else:
                    try:
                        pending.append((i, PendingLookup(client, client._start_call(
                            "Lookup", req, gen, client._timeouts.short), gen)))
                    except errors.TuttiError as e:
                        out[i] = e
            for i, p in pending:
                try:
                    out[i] = p.result()
                except errors.TuttiError as e:
                    out[i] = e
            return out
        calls = [(client._native_channel(native), req, client._timeouts.short)
                 for i, client, req, gen in started]
        answers = native.lookup(calls)
        for (i, client, req, gen), (code, details, body) in zip(started, answers):
            if code == 0:
                out[i] = client._lease_of(pb.LookupResponse.FromString(body), gen)
            elif code == _UNAVAILABLE:
                # The second connection may still be in its reconnect back-off after tuttid
                # came back (the session is new, grpcio's connection is up): ask through grpcio
                # this once, so that a good session is not taken for lost; connect again now.
                native.reconnect(client._native_channel(native))
                out[i] = client._inline_call(pb.LookupRequest.FromString(req), gen)
            else:
                out[i] = client._failed_lookup(_NativeRpcError(code, details), gen)
        return out

    @staticmethod
    def release_many(releases) -> list:
        """release() of several leases of several clients at once (a request's leases on every
        TP rank): `releases` is [(client, lease)]; the answer, in order, None or the TuttiError
        that client's release() would raise. Through tutti._lookup where it loads (one call,
        in flight together, as lookup_many), else release() one after the other."""
        releases = list(releases)
        out = [None] * len(releases)
        native = native_lookup()
        started = []
        for i, (client, lease) in enumerate(releases):
            if lease.id == 0:
                continue
            try:
                sid, gen = client._current()
            except errors.TuttiError as e:
                out[i] = e
                continue
            if lease.generation != gen:
                continue  # gone with its session
            if native is None:
                try:
                    client._call("Release", pb.ReleaseRequest(**sid.fields(), lease_id=lease.id),
                                 gen, client._timeouts.short)
                except errors.TuttiError as e:
                    out[i] = e
                continue
            started.append((i, client, pb.ReleaseRequest(**sid.fields(), lease_id=lease.id), gen))
        if not started:
            return out
        answers = native.release([(client._native_channel(native), req.SerializeToString(),
                                   client._timeouts.short) for i, client, req, gen in started])
        for (i, client, req, gen), (code, details, _) in zip(started, answers):
            if code == 0:
                continue
            if code == _UNAVAILABLE:  # as lookup_many: the second connection's back-off
                native.reconnect(client._native_channel(native))
                try:
                    client._call("Release", req, gen, client._timeouts.short)
                except errors.TuttiError as e:
                    out[i] = e
                continue
            err = client._error("Release", _NativeRpcError(code, details),
                                client._timeouts.short, "short", gen)
            client._observe(err, gen)
            out[i] = err
        return out

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

    def _inline_call(self, req, gen):
        """The Lookup `req` of session `gen` on this thread: a Lease or the TuttiError."""
        try:
            return self._lease_of(self._stub.Lookup(req, timeout=self._timeouts.short), gen)
        except grpc.RpcError as e:
            return self._failed_lookup(e, gen)

    def _failed_lookup(self, rpc_error, gen):
        """The TuttiError of a failed Lookup of session `gen` (observed: a session found gone
        starts the re-attach)."""
        err = self._error("Lookup", rpc_error, self._timeouts.short, "short", gen)
        self._observe(err, gen)
        return err

    def _lookup_request(self, keys, prompt_tokens):
        """(LookupRequest, session generation); argument errors raised."""
        _check_prompt_tokens(prompt_tokens)
        packed = _packed_keys(keys)
        sid, gen = self._current()
        # One string for the whole chain (LookupRequest.packed_keys): far cheaper to build and
        # parse than one bytes field per key.
        req = pb.LookupRequest(**sid.fields(), packed_keys=packed,
                               prompt_tokens=int(prompt_tokens or 0))
        return req, gen

    def _lookup_request_bytes(self, keys, prompt_tokens):
        """(serialized LookupRequest, session generation): _lookup_request's message as
        SerializeToString writes it (fields in number order, zeros left out), built as bytes:
        the session's fields are encoded once per session, the chain goes in with one join and
        no message object holds a copy of it (calls_test checks the bytes against the
        protobuf library's). Argument errors raised."""
        prompt = _check_prompt_tokens(prompt_tokens)
        packed = _packed_keys(keys)
        sid, gen = self._current()
        framing = self._lookup_framing
        if framing is None or framing[0] != (gen, sid.id, sid.token):
            # session_id (1, varint) before the rest, session_token (5, bytes) after it
            head = b"\x08" + _varint(sid.id) if sid.id else b""
            tail = b"\x2a" + _varint(len(sid.token)) + sid.token if sid.token else b""
            framing = self._lookup_framing = ((gen, sid.id, sid.token), head, tail)
        _, head, tail = framing
        # prompt_tokens (3, varint), packed_keys (4, bytes)
        return b"".join((head, b"\x18" + _varint(prompt) if prompt else b"",
                         b"\x22" + _varint(len(packed)) if packed else b"", packed, tail)), gen

    def _lease_of(self, resp, gen) -> Lease:
        predicted = resp.decision_id != 0
        return Lease(resp.lease_id, resp.hits, resp.lease_ttl_ms, gen,
                     load_blocks=resp.load_blocks,
                     predicted_ttft_ms=resp.predicted_ttft_ms if predicted else None,
                     predicted_recompute_ms=resp.predicted_recompute_ms if predicted else None,
                     predicted_load_all_ms=resp.predicted_load_all_ms if predicted else None,
                     decision_id=resp.decision_id if predicted else None)

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
        `lease` may be None when more_leases is not empty. Returns at once; wait per layer with
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
            self._finish_inflight()
            sid, gen = self._current()
            if lease is not None and lease.generation != gen:
                raise errors.Unavailable("the lease is from before tuttid restarted (the client "
                                         "re-attached); look up again")
            ticket = self._next_ticket()
            req = pb.RetrieveRequest(**sid.fields(), lease_id=lease.id if lease else 0,
                                     layer_begin=layer_begin, layer_end=layer_end, ticket=ticket,
                                     lease_ids=more_leases)
            for k, b in zip(keys, engine_blocks):
                req.blocks.add(key=k, engine_block=int(b))
            r = Retrieval(len(keys), layer_begin, layer_end, ticket, self._words)
            r._thread = threading.Thread(target=self._read_stream, args=(r, req, gen),
                                         name="tutti-retrieve", daemon=True)
            self._inflight = r
            r._thread.start()
            return r

    def _read_stream(self, r, req, generation):
        code, message = "OK", ""
        timeout, field_name = self._timeouts.for_retrieve(
            self._transfer_bytes(len(req.blocks), req.layer_begin, req.layer_end))
        stream = None
        try:
            stream = self._stub.Retrieve(req, timeout=timeout)
            self._calls.add(generation, stream)
            for progress in stream:
                r._on_progress(progress.layer, progress.failed)
        except grpc.RpcError as e:
            err = self._error("Retrieve", e, timeout, field_name, generation)
            self._observe(err, generation)
            code, message = err.code, err.message
        except Exception as e:  # never leave the engine waiting
            code, message = "INTERNAL", repr(e)
        finally:
            if stream is not None:
                self._calls.discard(generation, stream)
        r._on_end(code, message)

    def _finish_inflight(self):
        if self._inflight is not None:
            self._inflight.wait()
            self._inflight._thread.join()
            self._inflight = None

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

    def _store(self, keys, engine_blocks, wait_durable, layer_begin, layer_end, staging_wait_ms):
        sid, gen = self._current()
        req = pb.StoreRequest(**sid.fields(), layer_begin=layer_begin, layer_end=layer_end,
                              wait_durable=wait_durable, ticket=self._next_ticket(),
                              staging_wait_ms=staging_wait_ms)
        for k, b in zip(keys, engine_blocks):
            req.blocks.add(key=k, engine_block=int(b))
        timeout, field_name = self._timeouts.for_store(
            self._transfer_bytes(len(keys), layer_begin, layer_end), wait_durable)
        timeout += staging_wait_ms / 1000.0
        resp = self._call("Store", req, gen, timeout, field_name)
        if len(resp.outcomes) != len(keys):
            raise errors.TuttiError("tuttid answered Store with a wrong number of outcomes",
                                    "INTERNAL")
        out = StoreOutcomes(STORE_OUTCOMES.get(o, "unspecified") for o in resp.outcomes)
        out.rejected_why = resp.rejected_why
        return out

    def watch_events(self, after_seq: int = 0, boot_id: int = 0) -> EventStream:
        """Streams the stores and evictions of this session's namespace (tutti._events): an
        iterator of EventBatch, resuming after event `after_seq` of tuttid run `boot_id` (both
        from an earlier stream; 0, 0: from now on). The stream is cancelled when this session
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

    def _stopped(self):
        with self._cv:
            return self._stop

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
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            sid = (_Name(self._session_id, self._session_token) if self._state == "attached"
                   else None)
            gen = self._generation
            self._state = "detached"
            self._session_id = 0
            self._session_token = b""
        self._calls.end(gen, "the client detached")  # event streams, calls of other threads
        self._channel.unsubscribe(self._on_connectivity)
        if threading.current_thread() is not self._thread:
            self._thread.join()
        if sid is not None:
            try:
                self._stub.Detach(pb.DetachRequest(**sid.fields()), timeout=self._timeouts.short)
            except grpc.RpcError:
                pass
        self._channel.close()
        with self._native_lock:
            self._native = None  # the capsule closes its channel
        self._close_fds()
        if self._words is not None:
            self._words.close()
            self._words = None

    close = detach

    def _close_fds(self):
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

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


class PendingLookup:
    """A Lookup in flight (Client.start_lookup). result() waits for it, once."""

    def __init__(self, client, started, generation):
        self._client, self._started, self._generation = client, started, generation

    def result(self) -> Lease:
        resp = self._client._finish_call(self._started)
        return self._client._lease_of(resp, self._generation)


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


_STATUS_CODES = {c.value[0]: c for c in grpc.StatusCode}
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


class _NativeRpcError(grpc.RpcError):
    """tutti._lookup's failed call, as grpcio's errors read (code(), details())."""

    def __init__(self, code, details):
        super().__init__(details)
        self._code = _STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN)
        self._details = details

    def code(self):
        return self._code

    def details(self):
        return self._details


def _check_prompt_tokens(prompt_tokens) -> int:
    """prompt_tokens as the request's int (None: 0); InvalidArgument outside [0, 2^24]."""
    if prompt_tokens is not None and not 0 <= int(prompt_tokens) <= 1 << 24:
        raise errors.InvalidArgument("prompt_tokens = %r: must be in [0, 16777216]" %
                                     (prompt_tokens,))
    return int(prompt_tokens or 0)


def _varint(v: int) -> bytes:
    """v >= 0 as a protobuf varint."""
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _packed_keys(keys) -> bytes:
    """The chain as one string of 16-byte keys; InvalidArgument naming a key of another size."""
    if isinstance(keys, (bytes, bytearray, memoryview)):
        packed = bytes(keys)
        if len(packed) % 16:
            raise errors.InvalidArgument("packed keys: %d bytes, not a multiple of 16" %
                                         len(packed))
        return packed
    keys = list(keys)
    packed = b"".join(keys)
    if len(packed) != 16 * len(keys):
        bad = next(i for i, k in enumerate(keys) if len(k) != 16)
        raise errors.InvalidArgument("keys[%d]: a key must be exactly 16 bytes, got %d" %
                                     (bad, len(keys[bad])))
    return packed


def _pick_timeouts(call_timeout, timeouts):
    if call_timeout is not None and timeouts is not None:
        raise errors.InvalidArgument("give call_timeout or timeouts, not both")
    if call_timeout is not None:
        t = Timeouts.uniform(call_timeout)
    else:
        t = timeouts if timeouts is not None else Timeouts()
    t.check()
    return t

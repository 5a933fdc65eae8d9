"""tutti.Client's Lookups and Releases: the LookupRequest (as a message for grpcio, or built as
bytes for tutti._lookup), the Lease of an answer, a Lookup in flight (PendingLookup), and
Client.lookup_many / release_many over the clients of several tuttids at once (a vLLM
scheduler's TP ranks), through tutti._lookup where it loads, else through grpcio.

Lookups is mixed into Client over tutti._session.Session (its _current, _call, _start_call,
_finish_call, _error and _observe) and uses Client's _native_channel and _lookup_framing.
"""

import grpc

from tutti import errors
from tutti._types import Lease
from tutti.v1 import kvcache_pb2 as pb

_STATUS_CODES = {c.value[0]: c for c in grpc.StatusCode}
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


class PendingLookup:
    """A Lookup in flight (Client.start_lookup). result() waits for it, once."""

    def __init__(self, client, started, generation):
        self._client, self._started, self._generation = client, started, generation

    def result(self) -> Lease:
        resp = self._client._finish_call(self._started)
        return self._client._lease_of(resp, self._generation)


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


class Lookups:
    """The Lookup helpers of one Client (see the module docstring)."""

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


def lookup_many(lookups, native) -> list:
    """Client.lookup_many, through `native` (tutti._lookup) or, where it is None, grpcio."""
    lookups = list(lookups)
    out = [None] * len(lookups)
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


def release_many(releases, native) -> list:
    """Client.release_many, through `native` (tutti._lookup) or, where it is None, grpcio."""
    releases = list(releases)
    out = [None] * len(releases)
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

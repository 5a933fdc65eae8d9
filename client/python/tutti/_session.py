"""The life of a tutti.Client's session with tuttid, and the calls made under it.

Session is Client's base: it connects (a unix socket, gRPC), hands the memory over and attaches
(tutti._handoff: a new credential before every Attach), keeps the session alive from a thread
(KeepAlive every quarter of the session's TTL), notices its end (KeepAlive answered NOT_FOUND,
UNAVAILABLE or not in time, a call answered UNAVAILABLE; a dropped connection wakes the thread
at once) and then cancels the calls still in flight on it (tutti._calls.InFlight) and
re-attaches in the background with back-off.
_call / _start_call / _finish_call make a unary call under one session generation and turn a
failure into the TuttiError the engine sees (_error), telling the session what it learned
(_observe). _end_session detaches: the keep-alive thread stopped, the channel closed.

Thread-safety: _cv guards the session's state (_state, _session_id, _session_token,
_generation, _attach_response, _stop, _wake); the keep-alive thread and the engine's threads
share it.
"""

import os
import socket as _socket
import threading

import grpc

from tutti import errors
from tutti._attach import with_credential
from tutti._calls import InFlight, Timeouts
from tutti._handoff import hand_off
from tutti._types import _Name
from tutti.v1 import kvcache_pb2 as pb
from tutti.v1 import kvcache_pb2_grpc as pb_grpc

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


def _pick_timeouts(call_timeout, timeouts):
    if call_timeout is not None and timeouts is not None:
        raise errors.InvalidArgument("give call_timeout or timeouts, not both")
    if call_timeout is not None:
        t = Timeouts.uniform(call_timeout)
    else:
        t = timeouts if timeouts is not None else Timeouts()
    t.check()
    return t


class Session:
    """One engine's session with tuttid (see the module docstring); tutti.Client is one."""

    def _open(self, socket_path, request, words, device, reattach, connect_timeout):
        """Connects and attaches (raises as Client.attach), then starts the keep-alive thread.
        Needs self._fds and self._timeouts."""
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
        # Retrieve and Store with their requests already serialized (tutti._transfers encodes
        # the blocks as bytes).
        self._retrieve_encoded = self._channel.unary_stream(
            "/tutti.v1.KvCache/Retrieve", request_serializer=None,
            response_deserializer=pb.RetrieveProgress.FromString)
        self._store_encoded = self._channel.unary_unary(
            "/tutti.v1.KvCache/Store", request_serializer=None,
            response_deserializer=pb.StoreResponse.FromString)
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
        self._calls = InFlight()
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

    def _stopped(self):
        with self._cv:
            return self._stop

    def _next_ticket(self):
        with self._ticket_lock:
            self._ticket = (self._ticket + 1) & 0xFFFFFFFF
            if self._ticket == 0:
                self._ticket = 1
            return self._ticket

    # --- calls under the session ---
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

    def _call(self, name, request, generation, timeout, field_name="short", method=None):
        """Unary call `name` under session `generation`, cancelled if the session ends; through
        `method` (a multicallable taking `request` as it is) where given, else the stub's."""
        return self._finish_call(self._start_call(name, request, generation, timeout,
                                                  field_name, method))

    def _start_call(self, name, request, generation, timeout, field_name="short", method=None):
        call = (method or getattr(self._stub, name)).future(request, timeout=timeout)
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

    # --- the end ---
    def _end_session(self):
        """Stops the keep-alive thread, cancels the calls in flight, detaches (if attached) and
        closes the channel. The caller waits for its Retrieve in flight first and closes the
        host regions' descriptors (_close_fds) after."""
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

    def _close_fds(self):
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

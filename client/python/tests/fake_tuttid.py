"""A fake tuttid for the client's tests: a handoff socket that issues credentials (and keeps the
descriptors it was handed), and a KvCache gRPC server whose Attach redeems them, whose
KeepAlive can be told to answer NOT_FOUND (the session expired), and whose Lookup, Store,
Retrieve and Release can be told to hang (a wedged or stopped daemon) until the test ends.
With lookup_socket, it serves tuttid's lookup socket too (common/lookup_wire.h), its
Lookups answered by the same Lookup as gRPC's.
"""

import os
import secrets
import socket
import struct
import tempfile
import threading
from concurrent import futures

import grpc

from tutti.v1 import kvcache_pb2 as pb
from tutti.v1 import kvcache_pb2_grpc as pb_grpc


def _token(session_id):
    """The fake's session token: derived from the id (tuttid's are random)."""
    return session_id.to_bytes(8, "little") + b"fake-tok"


class FakeTuttid(pb_grpc.KvCacheServicer):
    def __init__(self, session_ttl_ms=60000, lookup_socket=False):
        self._dir = tempfile.mkdtemp(prefix="tutti-fake-", dir="/tmp")
        self.socket = os.path.join(self._dir, "tuttid.sock")
        self.session_ttl_ms = session_ttl_ms
        self.lock = threading.Lock()
        self.credentials = {}         # credential -> the descriptors handed over
        self.handoffs = []            # (payload, number of descriptors) per handoff
        self.attaches = []            # AttachRequests, credential included
        self.expired = False          # KeepAlive answers NOT_FOUND
        self.hang = threading.Event()  # set: Lookup, Store, Retrieve, Release never answer
        self.ended = threading.Event()  # set by close(): hanging calls return
        self.calls = []               # names of the calls that reached the server
        self.released = []            # lease ids of the Releases that reached it
        self.retrieves = []           # RetrieveRequests
        self.events = []              # WatchEventsResponses each WatchEvents stream sends
        self.watches = []             # WatchEventsRequests
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pb_grpc.add_KvCacheServicer_to_server(self, self._server)
        self._server.add_insecure_port("unix:" + self.socket)
        self._handoff = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._handoff.bind(self.socket + ".handoff")
        self._handoff.listen(8)
        self._handoff_thread = threading.Thread(target=self._serve_handoffs, daemon=True)
        self.socket_lookups = 0       # Lookups that came through the lookup socket
        self._lookup = None
        if lookup_socket:
            self._lookup = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._lookup.bind(self.socket + ".lookup")
            self._lookup.listen(8)

    def start(self):
        self._server.start()
        self._handoff_thread.start()
        if self._lookup is not None:
            threading.Thread(target=self._serve_lookups, daemon=True).start()
        return self

    def close(self):
        self.ended.set()
        self._server.stop(0).wait()
        self._handoff.close()
        if self._lookup is not None:
            self._lookup.close()
        with self.lock:
            for fds in self.credentials.values():
                for fd in fds:
                    os.close(fd)
            self.credentials.clear()
        for name in os.listdir(self._dir):
            os.unlink(os.path.join(self._dir, name))
        os.rmdir(self._dir)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
        return False

    # --- the handoff socket ---
    def _serve_handoffs(self):
        while True:
            try:
                conn, _ = self._handoff.accept()
            except OSError:
                return  # closed
            with conn:
                msg, fds, _, _ = socket.recv_fds(conn, 512, 16)
                credential = secrets.token_bytes(16)
                with self.lock:
                    self.handoffs.append((msg, len(fds)))
                    self.credentials[credential] = fds
                conn.send(b"OK" + credential)

    # --- the lookup socket ---
    def _serve_lookups(self):
        while True:
            try:
                conn, _ = self._lookup.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve_lookup_connection, args=(conn,),
                             daemon=True).start()

    def _serve_lookup_connection(self, conn):
        with conn:
            try:
                conn.sendall(struct.pack("<II", 0, 0))  # admitted
                while True:
                    header = _read_exactly(conn, 8)
                    if header is None:
                        return
                    length, _ = struct.unpack("<II", header)
                    body = _read_exactly(conn, length)
                    if body is None:
                        return
                    with self.lock:
                        self.socket_lookups += 1
                    context = _SocketContext()
                    try:
                        answer = self.Lookup(pb.LookupRequest.FromString(body), context)
                        code, out = 0, answer.SerializeToString()
                    except _Aborted as e:
                        code, out = e.code.value[0], e.details.encode()
                    conn.sendall(struct.pack("<II", len(out), code) + out)
            except OSError:
                return  # the client went away

    # --- KvCache ---
    def _hang(self, context):
        self.ended.wait()
        context.abort(grpc.StatusCode.UNAVAILABLE, "the fake tuttid stopped")

    def Attach(self, request, context):
        with self.lock:
            self.calls.append("Attach")
            self.attaches.append(request)
            if request.credential not in self.credentials:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "credential: unknown")
            for fd in self.credentials.pop(request.credential):
                os.close(fd)
            self.expired = False
            n = len(self.attaches)
        return pb.AttachResponse(session_id=n, session_token=_token(n), namespace_id=1,
                                 session_ttl_ms=self.session_ttl_ms, max_blocks_per_call=512,
                                 object_bytes=4096)

    def _check_session(self, request, context):
        """As tuttid: a request whose token is not its session's names no session."""
        if request.session_token != _token(request.session_id):
            context.abort(grpc.StatusCode.NOT_FOUND,
                          "session %d is unknown or expired" % request.session_id)

    def KeepAlive(self, request, context):
        self._check_session(request, context)
        with self.lock:
            expired = self.expired
        if expired:
            context.abort(grpc.StatusCode.NOT_FOUND, "session %d: unknown" % request.session_id)
        return pb.KeepAliveResponse(session_ttl_ms=self.session_ttl_ms)

    def Lookup(self, request, context):
        self._check_session(request, context)
        with self.lock:
            self.calls.append("Lookup")
        if self.hang.is_set():
            self._hang(context)
        hits = len(request.keys) or len(request.packed_keys) // 16
        return pb.LookupResponse(hits=hits, lease_id=7, lease_ttl_ms=30000)

    def Store(self, request, context):
        self._check_session(request, context)
        with self.lock:
            self.calls.append("Store")
        if self.hang.is_set():
            self._hang(context)
        return pb.StoreResponse(outcomes=[2] * len(request.blocks))

    def Retrieve(self, request, context):
        self._check_session(request, context)
        with self.lock:
            self.calls.append("Retrieve")
            self.retrieves.append(request)
        yield pb.RetrieveProgress(layer=request.layer_begin)
        if self.hang.is_set():
            self._hang(context)
        for layer in range(request.layer_begin + 1, request.layer_end):
            yield pb.RetrieveProgress(layer=layer)

    def WatchEvents(self, request, context):
        self._check_session(request, context)
        with self.lock:
            self.calls.append("WatchEvents")
            self.watches.append(request)
            events = list(self.events)
        for msg in events:
            yield msg
        self.ended.wait()  # open until the client cancels or the test ends
        context.abort(grpc.StatusCode.UNAVAILABLE, "the fake tuttid stopped")

    def Release(self, request, context):
        self._check_session(request, context)
        with self.lock:
            self.calls.append("Release")
            self.released.append(request.lease_id)
        if self.hang.is_set():
            self._hang(context)
        return pb.ReleaseResponse()

    def Detach(self, request, context):
        self._check_session(request, context)
        return pb.DetachResponse()


class _Aborted(Exception):
    def __init__(self, code, details):
        super().__init__(details)
        self.code, self.details = code, details


class _SocketContext:
    """What the KvCache handlers use of grpc's context, for the lookup socket."""

    def abort(self, code, details):
        raise _Aborted(code, details)


def _read_exactly(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def handoff_count(payload):
    """n of a handoff message b"TUTTIHO1" + uint32 n."""
    return struct.unpack("<I", payload[8:12])[0]

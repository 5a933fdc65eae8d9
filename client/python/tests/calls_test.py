"""The client's handoff and call deadlines against a fake tuttid (tests/fake_tuttid.py): every
Attach, re-attaches included, is preceded by a handoff carrying the regions' descriptors (none in
cuda mode) and carries its credential; a call tuttid never answers returns within its deadline,
sized to the call; a session that ends cancels the calls waiting on it at once.
"""

import os
import socket
import tempfile
import threading
import time
import unittest
import unittest.mock

import torch

import tutti
from tutti import _handoff
from tutti import client as tc

from fake_tuttid import FakeTuttid, handoff_count

LAYOUT = tutti.KvLayout(num_layers=2, kv_heads=2, head_dim=64, dtype_bytes=2, block_tokens=16)
NS = tutti.Namespace(model_id="m", layout=LAYOUT)
KEYS = tutti.chain_keys(range(64), 16)


def timed(fn):
    """(the exception fn raised or None, seconds it took)."""
    start = time.monotonic()
    try:
        fn()
        return None, time.monotonic() - start
    except Exception as e:  # the test inspects it
        return e, time.monotonic() - start


class Engine:
    def __init__(self, num_blocks=8, **shm_args):
        self.shm = tutti.SharedMemory(tutti.cache_bytes(LAYOUT, num_blocks), "tutti-calls",
                                      **shm_args)
        _, per_layer = tutti.host_cache_tensor(LAYOUT, num_blocks, torch.float16, self.shm)
        self.objects = tutti.objects_from_tensors(LAYOUT, per_layer)
        self.num_blocks = num_blocks

    def attach(self, daemon, **kw):
        return tutti.Client.attach(NS, self.num_blocks, self.objects,
                                   host_regions=[self.shm.region()], socket_path=daemon.socket,
                                   **kw)


class FakeDaemonTest(unittest.TestCase):
    """An engine and a fake tuttid, for each test."""

    def setUp(self):
        self.daemon = FakeTuttid().start()
        self.engine = Engine()

    def tearDown(self):
        self.daemon.close()
        self.engine.shm.close()


class HandoffTest(FakeDaemonTest):

    def test_attach_hands_over_the_region_and_redeems_the_credential(self):
        with self.engine.attach(self.daemon) as c:
            self.assertTrue(c.info["attached"])
        (payload, nfds), = self.daemon.handoffs
        self.assertEqual((payload[:8], handoff_count(payload), nfds), (b"TUTTIHO1", 1, 1))
        req = self.daemon.attaches[0]
        self.assertEqual(len(req.credential), 16)
        self.assertEqual(req.regions[0].host_shm.fd_index, 0)
        self.assertEqual(req.regions[0].host_shm.size_bytes, self.engine.shm.size)

    def test_the_descriptor_is_the_memory(self):
        sent = []
        real = _handoff.socket.send_fds

        def spy(sock, buffers, fds):
            sent.extend(os.fstat(fd).st_ino for fd in fds)
            return real(sock, buffers, fds)

        _handoff.socket.send_fds = spy
        try:
            with self.engine.attach(self.daemon):
                pass
        finally:
            _handoff.socket.send_fds = real
        self.assertEqual(sent, [os.fstat(self.engine.shm.fd).st_ino])

    def test_reattach_hands_over_again(self):
        self.daemon.session_ttl_ms = 400  # KeepAlive every 0.1 s
        with self.engine.attach(self.daemon) as c:
            with self.daemon.lock:
                self.daemon.expired = True
            deadline = time.monotonic() + 10
            while c.info["generation"] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(c.info["generation"], 2)
        self.assertEqual([n for _, n in self.daemon.handoffs], [1, 1])
        self.assertNotEqual(self.daemon.attaches[0].credential, self.daemon.attaches[1].credential)

    def test_cuda_mode_hands_over_no_descriptor(self):
        req = tc.build_cuda_attach("e", NS, 8, [tutti.ObjectTensor(0x1000 + i * 8 * 4096, 4096)
                                               for i in range(4)], 0, _Words(), _Cuda())
        c = tc.Client(self.daemon.socket, req)  # what attach(cuda_device=...) builds, less the GPU
        c.detach()
        (payload, nfds), = self.daemon.handoffs
        self.assertEqual((handoff_count(payload), nfds), (0, 0))
        self.assertEqual(len(self.daemon.attaches[0].credential), 16)

    def test_refusal_and_silence_of_the_handoff_socket(self):
        with self.assertRaisesRegex(tutti.PermissionDenied, "refused the handoff: nope"):
            _handoff._parse_reply("p", b"ER" + bytes([7]) + b"nope")
        with self.assertRaisesRegex(tutti.ResourceExhausted, "limit"):
            _handoff._parse_reply("p", b"ER" + bytes([8]) + b"limit")
        with self.assertRaisesRegex(tutti.Unavailable, "not a handoff"):
            _handoff._parse_reply("p", b"OK")
        with self.assertRaisesRegex(tutti.InvalidArgument, "at most 16"):
            _handoff.hand_off(self.daemon.socket, [0] * 17, 1.0)
        with self.assertRaisesRegex(tutti.Unavailable, "handoff.*is tuttid running"):
            _handoff.hand_off("/tmp/tutti-no-such-dir/s", [], 1.0)

    def test_a_connection_refused_at_once_reports_the_reason(self):
        # What tuttid does past limits.max_handoff_connections_per_user: it answers before reading
        # the request and closes, so the send may fail; the reason is still reported.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s")
            server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            server.bind(_handoff.handoff_path(path))
            server.listen(16)
            reason = (b"user 1001 has 16 handoff connections open "
                      b"(limits.max_handoff_connections_per_user)")

            def refuse_twice():
                for _ in range(2):
                    conn, _ = server.accept()
                    conn.send(b"ER" + bytes([8]) + reason)
                    conn.close()

            t = threading.Thread(target=refuse_twice)
            t.start()
            for fds in ([], [self.engine.shm.fd]):
                with self.assertRaisesRegex(tutti.ResourceExhausted,
                                            "refused the handoff: user 1001 has 16"):
                    _handoff.hand_off(path, fds, 5.0)
            t.join()
            server.close()


class _Cuda:
    def gpu_uuid(self, device):
        return "GPU-fake"

    def allocation_of(self, device, ptr):
        return 0x1000, 4 * 8 * 4096

    def ipc_handle(self, device, base):
        return b"h" * 64


class _Words:
    count = 3

    def export(self):
        return b"w" * 64, 12, "GPU-fake"

    def close(self):
        pass


class DeadlineTest(FakeDaemonTest):

    def test_a_lookup_tuttid_never_answers_returns_within_the_default_deadline(self):
        with self.engine.attach(self.daemon) as c:
            self.assertEqual(c.timeouts.short, 5.0)
            self.daemon.hang.set()
            err, took = timed(lambda: c.lookup(KEYS))
            self.assertIsInstance(err, tutti.DeadlineExceeded)  # an Unavailable: a miss
            self.assertIsInstance(err, tutti.Unavailable)
            self.assertIn("did not answer Lookup within 5.0 s", str(err))
            self.assertLess(took, 7.0)
            self.assertGreater(took, 4.0)
            self.assertTrue(c.info["attached"])  # KeepAlive still answers: the session lives

    def test_user_deadlines(self):
        with self.engine.attach(self.daemon, timeouts=tutti.Timeouts(short=0.3)) as c:
            self.daemon.hang.set()
            err, took = timed(lambda: c.release(tc.Lease(7, 1, 1000, c.info["generation"])))
            self.assertIsInstance(err, tutti.DeadlineExceeded)
            self.assertLess(took, 2.0)
        self.daemon.hang.clear()
        with self.engine.attach(self.daemon, call_timeout=0.3) as c:
            self.assertEqual(c.timeouts.durable, 0.3)
            self.daemon.hang.set()
            err, took = timed(lambda: c.store(KEYS, [0, 1, 2, 3], wait_durable=True))
            self.assertIn("Timeouts.durable", str(err))
            self.assertLess(took, 2.0)
        with self.assertRaisesRegex(tutti.InvalidArgument, "Timeouts.short"):
            self.engine.attach(self.daemon, timeouts=tutti.Timeouts(short=0))

    def test_lookup_inline(self):
        """The blocking Lookup (the vLLM scheduler's): the same lease as lookup(), the same
        deadline and error."""
        with self.engine.attach(self.daemon, timeouts=tutti.Timeouts(short=0.3)) as c:
            a, b = c.lookup(KEYS, prompt_tokens=70), c.lookup_inline(KEYS, prompt_tokens=70)
            self.assertEqual((a.id, a.hits, a.load_blocks, a.ttl_ms, a.generation),
                             (b.id, b.hits, b.load_blocks, b.ttl_ms, b.generation))
            with self.assertRaisesRegex(tutti.InvalidArgument, "prompt_tokens"):
                c.lookup_inline(KEYS, prompt_tokens=-1)
            with self.assertRaisesRegex(tutti.InvalidArgument, "keys\\[0\\]"):
                c.lookup_inline([b"short"])
            self.daemon.hang.set()
            err, took = timed(lambda: c.lookup_inline(KEYS))
            self.assertIsInstance(err, tutti.DeadlineExceeded)
            self.assertIn("did not answer Lookup within 0.3 s (Timeouts.short)", str(err))
            self.assertLess(took, 2.0)

    def test_transfer_deadlines_grow_with_their_bytes(self):
        t = tutti.Timeouts()
        small, field = t.for_store(4 << 20, wait_durable=False)
        self.assertEqual(field, "store")
        self.assertAlmostEqual(small, 10.0 + 1 / 16)
        big, field = t.for_store(4 << 30, wait_durable=True)
        self.assertEqual((big, field), (30.0 + 64.0, "durable"))
        self.assertEqual(t.for_retrieve(64 << 20), (11.0, "retrieve"))
        self.assertEqual(tutti.Timeouts.uniform(120).for_store(4 << 30, True), (120, "durable"))


class LookupManyTest(unittest.TestCase):
    """Client.lookup_many (the vLLM scheduler's Lookups on every TP rank): through tutti._lookup
    (built with the package: it must load here) on tuttid's lookup socket and through libgrpc++,
    and through grpcio (the fallback), the same leases as lookup(), one error per client that
    fails, all in flight at once."""

    def setUp(self):
        self.daemons = [FakeTuttid(lookup_socket=True).start() for _ in range(2)]
        self.engine = Engine()
        self.clients = [self.engine.attach(d, timeouts=tutti.Timeouts(short=0.4))
                        for d in self.daemons]
        self.saved = tc._NATIVE

    def tearDown(self):
        tc._NATIVE = self.saved
        for d in self.daemons:
            d.ended.set()
        for c in self.clients:
            c.detach()
        for d in self.daemons:
            d.close()
        self.engine.shm.close()

    def paths(self):
        """Each way lookup_many can go: its name, after setting it up; checks after each that
        it went that way."""
        saved = os.environ.get("TUTTI_LOOKUP_SOCKET")
        tc._NATIVE = None
        if os.environ.get("TUTTI_NATIVE_LOOKUP", "1") != "0":
            self.assertIsNotNone(tc.native_lookup(), "tutti._lookup did not load")
            for path in ("socket", "libgrpc++"):
                os.environ["TUTTI_LOOKUP_SOCKET"] = "1" if path == "socket" else "0"
                for c in self.clients:
                    c._native = None  # opened again, as TUTTI_LOOKUP_SOCKET says
                before = sum(d.socket_lookups for d in self.daemons)
                yield path
                through_socket = sum(d.socket_lookups for d in self.daemons) - before
                if path == "socket":
                    self.assertGreater(through_socket, 0)
                else:
                    self.assertEqual(through_socket, 0)
        if saved is None:
            os.environ.pop("TUTTI_LOOKUP_SOCKET", None)
        else:
            os.environ["TUTTI_LOOKUP_SOCKET"] = saved
        tc._NATIVE = False  # as where it does not load
        self.assertIsNone(tc.native_lookup())
        yield "grpcio"

    def test_the_same_leases_as_lookup(self):
        for path in self.paths():
            with self.subTest(path=path):
                a = [c.lookup(KEYS, prompt_tokens=70) for c in self.clients]
                b = tutti.Client.lookup_many([(c, KEYS, 70) for c in self.clients])
                self.assertEqual([(x.id, x.hits, x.load_blocks, x.ttl_ms, x.generation)
                                  for x in a],
                                 [(x.id, x.hits, x.load_blocks, x.ttl_ms, x.generation)
                                  for x in b])
                packed = b"".join(KEYS)  # the scheduler's form
                self.assertEqual([x.hits for x in tutti.Client.lookup_many(
                    [(c, packed, None) for c in self.clients])], [4, 4])
                self.assertEqual(tutti.Client.lookup_many([]), [])

    def test_the_hand_built_request_is_the_librarys(self):
        """lookup_many's LookupRequest, built as bytes for tutti._lookup, is the protobuf
        library's serialization of _lookup_request's message (the same bytes, the same message
        parsed), for every session field and chain size; and the same after a new session."""
        from tutti.v1 import kvcache_pb2 as pb
        c = self.clients[0]
        sid, gen = c._current()
        cases = [(KEYS, None), (KEYS, 70), ([], None), ([], 1 << 24), (b"".join(KEYS), 1),
                 (b"k" * 16 * 2048, 32769), (b"x" * 16 * 9, 127), (b"x" * 16 * 8, 128)]
        names = [sid, tc._Name(0, b""), tc._Name(1, b"t" * 16), tc._Name((1 << 64) - 1, b"\x00"),
                 tc._Name(300, b"")]
        for name in names:
            with unittest.mock.patch.object(c, "_current", lambda name=name: (name, gen + 1)):
                for keys, prompt in cases:
                    req, g1 = c._lookup_request(keys, prompt)
                    raw, g2 = c._lookup_request_bytes(keys, prompt)
                    self.assertEqual(g1, g2)
                    self.assertEqual(raw, req.SerializeToString(), (name, prompt))
                    self.assertEqual(pb.LookupRequest.FromString(raw), req)
        for bad in (-1, (1 << 24) + 1):
            with self.assertRaisesRegex(tutti.InvalidArgument, "prompt_tokens"):
                c._lookup_request_bytes(KEYS, bad)
        with self.assertRaisesRegex(tutti.InvalidArgument, "keys\\[1\\]"):
            c._lookup_request_bytes([KEYS[0], b"short"], None)

    def test_one_error_per_failed_client(self):
        for path in self.paths():
            with self.subTest(path=path):
                out = tutti.Client.lookup_many([(self.clients[0], KEYS, -1),
                                                (self.clients[1], KEYS, None),
                                                (self.clients[0], [b"short"], None)])
                self.assertIsInstance(out[0], tutti.InvalidArgument)
                self.assertIn("prompt_tokens", str(out[0]))
                self.assertEqual(out[1].hits, 4)
                self.assertIsInstance(out[2], tutti.InvalidArgument)
                self.assertIn("keys[0]", str(out[2]))

    def test_a_wrong_session_is_tuttids_answer(self):
        """NOT_FOUND from tuttid (here: a token it does not know) comes back as NotFound with
        tuttid's message."""
        for path in self.paths():
            with self.subTest(path=path):
                c = self.clients[1]
                with c._cv:
                    c._session_token = b"x" * 16
                out = tutti.Client.lookup_many([(self.clients[0], KEYS, None), (c, KEYS, None)])
                self.assertEqual(out[0].hits, 4)
                self.assertIsInstance(out[1], tutti.NotFound)
                self.assertIn("is unknown or expired", str(out[1]))
                with c._cv:
                    c._session_token = tc_token(c._session_id)
                # NOT_FOUND started a re-attach: the next path begins once it is done.
                deadline = time.monotonic() + 10
                while not c.info["attached"] and time.monotonic() < deadline:
                    time.sleep(0.01)

    def test_hung_tuttids_answer_at_the_deadline_together(self):
        for path in self.paths():
            with self.subTest(path=path):
                for d in self.daemons:
                    d.hang.set()
                err, took = timed(lambda: self.raise_first(tutti.Client.lookup_many(
                    [(c, KEYS, None) for c in self.clients])))
                for d in self.daemons:
                    d.hang.clear()
                self.assertIsInstance(err, tutti.DeadlineExceeded)
                self.assertIn("did not answer Lookup within 0.4 s (Timeouts.short)", str(err))
                self.assertLess(took, 0.75)  # in flight together: not 2 x 0.4 s
                self.assertEqual([x.hits for x in tutti.Client.lookup_many(
                    [(c, KEYS, None) for c in self.clients])], [4, 4])

    def test_release_many(self):
        """Every client's lease released from one call (both paths); a lease of 0 hits or of an
        older session is not sent; a hung tuttid's Release is its DeadlineExceeded."""
        for path in self.paths():
            with self.subTest(path=path):
                for d in self.daemons:
                    d.released.clear()
                leases = tutti.Client.lookup_many([(c, KEYS, None) for c in self.clients])
                stale = tutti.Lease(9, 4, 1000, leases[0].generation + 1)
                nothing = tutti.Lease(0, 0, 1000, leases[0].generation)
                out = tutti.Client.release_many(list(zip(self.clients, leases)) +
                                                [(self.clients[0], stale),
                                                 (self.clients[1], nothing)])
                self.assertEqual(out, [None] * 4)
                self.assertEqual([d.released for d in self.daemons], [[7], [7]])
                self.daemons[1].hang.set()
                err, took = timed(lambda: self.raise_first(tutti.Client.release_many(
                    list(zip(self.clients, leases)))))
                self.daemons[1].hang.clear()
                self.assertIsInstance(err, tutti.DeadlineExceeded)
                self.assertIn("Release", str(err))
                self.assertLess(took, 0.75)
                self.assertEqual(tutti.Client.release_many([]), [])

    def test_socket_where_served_libgrpc_where_not(self):
        """One rank's tuttid serves no lookup socket (listen.lookup_socket false, or older): its
        Lookup goes through libgrpc++ in the same call; the other rank's on the socket."""
        tc._NATIVE = None
        native = tc.native_lookup()
        if native is None:
            self.skipTest("TUTTI_NATIVE_LOOKUP=0")
        plain = FakeTuttid().start()
        try:
            c = self.engine.attach(plain, timeouts=tutti.Timeouts(short=0.4))
            try:
                out = tutti.Client.lookup_many([(self.clients[0], KEYS, None), (c, KEYS, None)])
                self.assertEqual([x.hits for x in out], [4, 4])
                self.assertTrue(native.on_socket(self.clients[0]._native_channel(native)))
                self.assertFalse(native.on_socket(c._native_channel(native)))
                self.assertEqual(self.daemons[0].socket_lookups, 1)
                self.assertEqual(plain.calls.count("Lookup"), 1)
            finally:
                plain.ended.set()
                c.detach()
        finally:
            plain.close()

    def test_a_lookup_socket_that_closes_is_asked_again_through_grpc(self):
        """tuttid closes the connection before answering (it stopped, or restarted): UNAVAILABLE
        on the socket, so lookup_many asks grpcio at once; the next call connects again."""
        tc._NATIVE = None
        native = tc.native_lookup()
        if native is None:
            self.skipTest("TUTTI_NATIVE_LOOKUP=0")
        c = self.clients[0]
        self.assertEqual(tutti.Client.lookup_many([(c, KEYS, None)])[0].hits, 4)
        real = self.daemons[0].Lookup
        calls = []

        def close_first(request, context):
            calls.append(type(context).__name__)
            if len(calls) == 1:
                raise OSError("as if tuttid went away")  # ends the socket's connection
            return real(request, context)
        self.daemons[0].Lookup = close_first
        try:
            self.assertEqual(tutti.Client.lookup_many([(c, KEYS, None)])[0].hits, 4)  # grpcio's
            self.assertEqual(len(calls), 1)
            self.assertEqual(tutti.Client.lookup_many([(c, KEYS, None)])[0].hits, 4)
            self.assertEqual(len(calls), 2)  # the socket's again, on a new connection
            self.assertTrue(native.on_socket(c._native_channel(native)))
        finally:
            self.daemons[0].Lookup = real

    @staticmethod
    def raise_first(out):
        for x in out:
            if isinstance(x, Exception):
                raise x
        return out

    def test_native_releases_the_gil_while_waiting(self):
        """Another Python thread runs while lookup_many waits on a hung tuttid."""
        tc._NATIVE = None
        if tc.native_lookup() is None:
            self.skipTest("TUTTI_NATIVE_LOOKUP=0")
        self.daemons[0].hang.set()
        ticks = []
        stop = threading.Event()

        def tick():
            while not stop.is_set():
                ticks.append(1)
                time.sleep(0.01)
        t = threading.Thread(target=tick)
        t.start()
        out = tutti.Client.lookup_many([(self.clients[0], KEYS, None)])
        stop.set()
        t.join()
        self.daemons[0].hang.clear()
        self.assertIsInstance(out[0], tutti.DeadlineExceeded)
        self.assertGreater(len(ticks), 10)


def tc_token(session_id):
    from fake_tuttid import _token
    return _token(session_id)


class SessionEndTest(unittest.TestCase):
    """A session that ends cancels its calls at once, long deadlines notwithstanding."""

    def setUp(self):
        self.daemon = FakeTuttid(session_ttl_ms=400).start()  # KeepAlive every 0.1 s
        self.engine = Engine()
        self.client = self.engine.attach(self.daemon, timeouts=tutti.Timeouts(
            short=60, store=60, durable=60, retrieve=60), reattach=False)

    def tearDown(self):
        self.daemon.ended.set()  # calls still hanging return
        self.client.detach()
        self.daemon.close()
        self.engine.shm.close()

    def expire_soon(self, after=0.3):
        def expire():
            time.sleep(after)
            with self.daemon.lock:
                self.daemon.expired = True
        threading.Thread(target=expire, daemon=True).start()

    def test_lookup_cancelled_when_keepalive_finds_the_session_gone(self):
        self.daemon.hang.set()
        self.expire_soon()
        err, took = timed(lambda: self.client.lookup(KEYS))
        self.assertIsInstance(err, tutti.Unavailable)
        self.assertNotIsInstance(err, tutti.DeadlineExceeded)
        self.assertRegex(str(err), "Lookup cancelled: .*no longer knows session 1")
        self.assertLess(took, 3.0)
        with self.assertRaisesRegex(tutti.Unavailable, "no longer knows session 1"):
            self.client.lookup(KEYS)  # at once, without reaching tuttid

    def test_store_cancelled_too(self):
        self.daemon.hang.set()
        self.expire_soon()
        err, took = timed(lambda: self.client.store(KEYS, [0, 1, 2, 3], wait_durable=True))
        self.assertRegex(str(err), "UNAVAILABLE: Store cancelled")
        self.assertLess(took, 3.0)

    def test_retrieve_breaks_and_releases_its_waits(self):
        lease = self.client.lookup(KEYS)
        self.daemon.hang.set()
        r = self.client.retrieve(lease, KEYS, [4, 5, 6, 7])
        r.wait_layer(0)
        self.expire_soon(0.0)
        start = time.monotonic()
        with self.assertRaises(tutti.TuttiError) as cm:
            r.wait_layer(1)
        self.assertEqual(cm.exception.code, "ABORTED")
        out = r.wait(timeout=5)
        self.assertLess(time.monotonic() - start, 3.0)
        self.assertEqual((out.code, out.failed, out.layers_done), ("UNAVAILABLE", [0, 1, 2, 3], 1))
        self.assertIn("Retrieve cancelled", out.message)

    def test_a_call_after_the_end_never_waits(self):
        self.expire_soon(0.0)
        deadline = time.monotonic() + 5
        while self.client.info["attached"] and time.monotonic() < deadline:
            time.sleep(0.01)
        self.daemon.hang.set()
        err, took = timed(lambda: self.client.lookup(KEYS))
        self.assertIsInstance(err, tutti.Unavailable)
        self.assertLess(took, 0.5)
        err2, took = timed(lambda: self.client.lookup_inline(KEYS))
        self.assertEqual(str(err2), str(err))
        self.assertLess(took, 0.5)
        start = time.monotonic()
        err3, = tutti.Client.lookup_many([(self.client, KEYS, None)])
        self.assertEqual(str(err3), str(err))
        self.assertLess(time.monotonic() - start, 0.5)


if __name__ == "__main__":
    unittest.main(verbosity=2)

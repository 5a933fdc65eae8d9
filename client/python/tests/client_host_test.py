"""The Python client against the real tuttid in host mode: store, lookup, layer-by-layer retrieve
into other blocks (each layer checked as soon as its wait returns), release; a tuttid restart
(the client re-attaches by itself, the cache is still there, old leases are void); tuttid killed
in the middle of a retrieve (every wait returns, the blocks are reported failed); attach errors;
the handoff (tuttid maps the descriptor, not a name; no credential, no session); a stopped
(SIGSTOP) tuttid costs a lookup seconds, not the old 120 s call deadline.
"""

import os
import signal
import threading
import time
import unittest

import torch

import tutti
from tutti.testing import Tuttid
from tutti.v1 import kvcache_pb2

# 8 layers x 8 KV heads x 128 dims x float32 x 16 tokens: 64 KiB objects, 1 MiB blocks.
LAYOUT = tutti.KvLayout(num_layers=8, kv_heads=8, head_dim=128, dtype_bytes=4, block_tokens=16)
NS = tutti.Namespace(model_id="python-host-test", layout=LAYOUT)


class Engine:
    """A host-mode engine: a vLLM-style fused cache [layers, 2, blocks, 16, 8, 128] in shm."""

    def __init__(self, num_blocks, named=False):
        self.num_blocks = num_blocks
        self.shm = tutti.SharedMemory(tutti.cache_bytes(LAYOUT, num_blocks), prefix="tutti-pytest",
                                      named=named)
        self.cache, self.per_layer = tutti.host_cache_tensor(LAYOUT, num_blocks, torch.float32,
                                                             self.shm)
        self.objects = tutti.objects_from_tensors(LAYOUT, self.per_layer)

    def attach(self, daemon, **kw):
        return tutti.Client.attach(NS, self.num_blocks, self.objects,
                                   host_regions=[self.shm.region()], socket_path=daemon.socket,
                                   engine_id="client_host_test", **kw)

    @staticmethod
    def content(key):
        """Deterministic block content from its key: [layers, 2, 16, 8, 128]."""
        g = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") & ((1 << 63) - 1))
        return torch.randn(LAYOUT.num_layers, 2, 16, 8, 128, generator=g)

    def fill(self, block, key):
        self.cache[:, :, block] = self.content(key)

    def zero(self, block):
        self.cache[:, :, block] = 0

    def layer_ok(self, block, key, layer):
        return torch.equal(self.cache[layer, :, block], self.content(key)[layer])

    def close(self):
        del self.cache, self.per_layer
        self.shm.close()


def keys_of(seed, blocks):
    return tutti.chain_keys(range(seed * 100000, seed * 100000 + 16 * blocks), 16)


class HostModeTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Tuttid(session_ttl_ms=2000).start()
        self.engines = []

    def tearDown(self):
        for e in self.engines:
            e.close()
        self.daemon.cleanup()

    def engine(self, blocks, named=False):
        e = Engine(blocks, named)
        self.engines.append(e)
        return e

    def store_all(self, client, engine, keys):
        for begin in range(0, len(keys), 32):
            batch = keys[begin:begin + 32]
            for i, k in enumerate(batch):
                engine.fill(i, k)
            out = client.store(batch, list(range(len(batch))), wait_durable=True)
            self.assertEqual(out, ["durable"] * len(batch))

    def retrieve_and_verify(self, client, engine, keys, first):
        lease = client.lookup(keys)
        self.assertEqual(lease.hits, len(keys))
        blocks = list(range(first, first + len(keys)))
        for b in blocks:
            engine.zero(b)
        r = client.retrieve(lease, keys, blocks)
        for layer in range(LAYOUT.num_layers):
            r.wait_layer(layer)
            for b, k in zip(blocks, keys):
                self.assertTrue(engine.layer_ok(b, k, layer), "block %d layer %d" % (b, layer))
        out = r.wait()
        self.assertTrue(out.ok, out)
        self.assertEqual(out.failed, [])
        self.assertEqual(out.layers_done, LAYOUT.num_layers)

    def await_generation(self, client, gen, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = client.info
            if info["attached"] and info["generation"] >= gen:
                return True
            time.sleep(0.02)
        return False

    def test_retrieve_leaves_before_it_returns(self):
        """The Retrieve call starts on the caller's thread: its layers land in the engine's
        blocks while the thread that reads its progress is held back (here until they have), as
        an engine's thread that holds the GIL to enqueue its forward pass would hold it."""
        e = self.engine(32)
        with e.attach(self.daemon) as c:
            keys = keys_of(9, 8)
            self.store_all(c, e, keys)
            lease = c.lookup(keys)
            blocks = list(range(16, 24))
            for b in blocks:
                e.zero(b)
            held = threading.Event()
            read_stream = c._read_stream

            def held_back(*args):
                held.wait(30)
                read_stream(*args)

            c._read_stream = held_back
            try:
                r = c.retrieve(lease, keys, blocks)
                deadline = time.monotonic() + 20
                last = LAYOUT.num_layers - 1
                while not all(e.layer_ok(b, k, last) for b, k in zip(blocks, keys)):
                    self.assertLess(time.monotonic(), deadline,
                                    "no layer landed while the progress reader was held")
                    time.sleep(0.01)
            finally:
                held.set()
            out = r.wait(30)
            self.assertIsNotNone(out)
            self.assertTrue(out.ok, out)
            for layer in range(LAYOUT.num_layers):
                self.assertTrue(all(e.layer_ok(b, k, layer) for b, k in zip(blocks, keys)))

    def test_store_lookup_retrieve_layer_by_layer(self):
        e = self.engine(96)
        with e.attach(self.daemon) as c:
            self.assertEqual(c.info["generation"], 1)
            self.assertEqual(c.info["object_bytes"], 64 << 10)
            self.assertEqual(c.info["mode"], "host")
            keys = keys_of(1, 40)
            self.store_all(c, e, keys)
            self.retrieve_and_verify(c, e, keys, 48)
            self.assertEqual(c.store(keys[:1], [0]), ["already_present"])
            lease = c.lookup(keys_of(1, 50))
            self.assertEqual(lease.hits, 40)
            c.release(lease)
            miss = c.lookup(keys_of(2, 3))
            self.assertEqual((miss.hits, miss.id), (0, 0))

    def test_load_or_recompute_advice_and_compute_reports(self):
        e = self.engine(16)
        with e.attach(self.daemon) as c:
            keys = keys_of(4, 8)
            self.store_all(c, e, keys)
            prompt = 8 * 16 + 5
            plain = c.lookup(keys)
            self.assertEqual((plain.load_blocks, plain.decision_id), (8, None))
            c.release(plain)
            early = c.lookup(keys, prompt_tokens=prompt)
            self.assertEqual(early.load_blocks, 8, "no compute reported yet: load every hit")
            self.assertIsNone(early.predicted_ttft_ms)
            c.release(early)
            with self.assertRaises(tutti.InvalidArgument) as cm:
                c.report_compute([tutti.ComputeSample(17, 16, 1.0)])
            self.assertIn("samples[0].new_tokens", cm.exception.message)
            with self.assertRaises(tutti.InvalidArgument):
                c.report_compute([tutti.ComputeSample(16, 16, float("nan"))])
            report = c.report_compute([tutti.ComputeSample(128, 128, 1.0, 0.5),
                                       tutti.ComputeSample(64, 64, 0.5, 0.5),
                                       tutti.ComputeSample(32, 32, 0.25, 0.5)])
            self.assertFalse(report.decision_found)
            lease = c.lookup(keys, prompt_tokens=prompt)
            self.assertIsNotNone(lease.decision_id)
            self.assertLessEqual(lease.load_blocks, lease.hits)
            self.assertLessEqual(lease.predicted_ttft_ms, lease.predicted_recompute_ms)
            self.assertLessEqual(lease.predicted_ttft_ms, lease.predicted_load_all_ms)
            if lease.load_blocks:
                head = keys[:lease.load_blocks]
                r = c.retrieve(lease, head, list(range(8, 8 + len(head))))
                self.assertTrue(r.wait().ok)
            else:
                c.release(lease)
            measured = c.report_compute([], decision_id=lease.decision_id,
                                        measured_ttft_ms=lease.predicted_ttft_ms * 1.25)
            self.assertTrue(measured.decision_found)
            self.assertAlmostEqual(measured.prediction_error, 0.2)

    def test_partial_layers_and_refused_calls(self):
        e = self.engine(16)
        with e.attach(self.daemon) as c:
            keys = keys_of(3, 4)
            self.store_all(c, e, keys)
            lease = c.lookup(keys)
            for b in range(8, 12):
                e.zero(b)
            r = c.retrieve(lease, keys, [8, 9, 10, 11], 2, 5)
            with self.assertRaises(tutti.InvalidArgument):
                r.wait_layer(1)
            r.wait_layer(4)
            self.assertTrue(r.wait().ok)
            for layer in range(8):
                self.assertEqual(e.layer_ok(8, keys[0], layer), 2 <= layer < 5, layer)
            with self.assertRaises(tutti.InvalidArgument):
                c.retrieve(lease, keys, [1, 2])
            # The lease ended with the first transfer: tuttid refuses; waits still return.
            stale = c.retrieve(lease, keys, [1, 2, 3, 4])
            with self.assertRaises(tutti.TuttiError) as cm:
                stale.wait_layer(7)
            self.assertEqual(cm.exception.code, "ABORTED")
            self.assertEqual(stale.wait().code, "NOT_FOUND")
            self.assertEqual(stale.wait().failed, [0, 1, 2, 3])

    def test_store_staging_wait_is_checked_and_passed_on(self):
        e = self.engine(8)
        with e.attach(self.daemon) as c:
            keys = keys_of(4, 2)
            for i, k in enumerate(keys):
                e.fill(i, k)
            for bad in (-1, 10001, 1.5, True, "5"):
                with self.assertRaises(tutti.InvalidArgument, msg=repr(bad)):
                    c.store(keys, [0, 1], staging_wait_ms=bad)
            # With room, the wait costs nothing: captured at once.
            t0 = time.monotonic()
            self.assertEqual(c.store(keys, [0, 1], staging_wait_ms=5000), ["captured"] * 2)
            self.assertLess(time.monotonic() - t0, 4.0)
            # tuttid checks the bound itself too.
            sid, gen = c._current()
            req = kvcache_pb2.StoreRequest(**sid.fields(), staging_wait_ms=10001)
            req.blocks.add(key=keys_of(5, 1)[0], engine_block=2)
            with self.assertRaises(tutti.InvalidArgument) as cm:
                c._call("Store", req, gen, 10.0, "store")
            self.assertIn("staging_wait_ms", str(cm.exception))

    def test_reattaches_after_restart_and_the_cache_is_still_there(self):
        e = self.engine(64)
        with e.attach(self.daemon) as c:
            keys = keys_of(4, 20)
            self.store_all(c, e, keys)
            old = c.lookup(keys)
            # Client.lookup_many (the vLLM scheduler's; through tutti._lookup, its own
            # connection) hits, misses while tuttid is away and hits again once it is back.
            self.assertEqual(tutti.Client.lookup_many([(c, keys, None)])[0].hits, len(keys))
            self.assertEqual(self.daemon.stop(), 0)
            with self.assertRaises(tutti.Unavailable):
                c.lookup(keys)  # a miss for the engine, at once
            start = time.monotonic()
            self.assertIsInstance(tutti.Client.lookup_many([(c, keys, None)])[0],
                                  tutti.Unavailable)
            self.assertLess(time.monotonic() - start, 0.5)
            self.daemon.start()
            self.assertTrue(self.await_generation(c, 2), self.daemon.log_tail())
            again = tutti.Client.lookup_many([(c, keys, None)])[0]
            self.assertEqual(again.hits, len(keys))
            self.assertEqual(again.generation, 2)
            c.release(again)
            with self.assertRaises(tutti.Unavailable):
                c.retrieve(old, keys, list(range(20)))  # a lease of the old session
            c.release(old)
            self.retrieve_and_verify(c, e, keys, 32)

    def test_lookup_many_on_the_lookup_socket(self):
        """tuttid serves <socket>.lookup by default: lookup_many's Lookups go there (0660-like
        mode as the engine socket's), with lookup()'s answers; with listen.lookup_socket false
        there is no such socket and they go through libgrpc++, the same answers."""
        from tutti import client as tc
        native = tc.native_lookup()
        if native is None:
            self.skipTest("TUTTI_NATIVE_LOOKUP=0")
        self.assertEqual(os.stat(self.daemon.socket + ".lookup").st_mode & 0o777, 0o600)
        e = self.engine(8)
        keys = keys_of(11, 4)
        for served in (True, False):
            with self.subTest(lookup_socket=served):
                with e.attach(self.daemon) as c:
                    if served:
                        self.store_all(c, e, keys)  # kept across the restart
                    one = c.lookup(keys + keys_of(12, 2), prompt_tokens=96)
                    many = tutti.Client.lookup_many([(c, keys + keys_of(12, 2), 96),
                                                     (c, [b"short"], None)])
                    self.assertEqual(native.on_socket(c._native_channel(native)), served)
                    self.assertEqual((many[0].hits, many[0].load_blocks, many[0].ttl_ms),
                                     (one.hits, one.load_blocks, one.ttl_ms))
                    self.assertNotEqual(many[0].id, one.id)
                    self.assertIsInstance(many[1], tutti.InvalidArgument)
                    self.assertEqual(tutti.Client.release_many([(c, one), (c, many[0])]),
                                     [None, None])
                self.daemon.stop()
                self.daemon.write_config(listen_extra="lookup_socket: false")
                self.daemon.start()
        self.assertFalse(os.path.exists(self.daemon.socket + ".lookup"))

    def test_idle_client_reattaches_soon_after_a_restart(self):
        # tuttid's default session TTL: a KeepAlive every 7.5 s. The client watches the connection,
        # so an engine that makes no call is attached again about a second after tuttid is back.
        self.daemon.cleanup()
        self.daemon = Tuttid(session_ttl_ms=30000).start()
        e = self.engine(8)
        with e.attach(self.daemon) as c:
            attached = time.monotonic()
            self.assertEqual(self.daemon.stop(), 0)
            self.daemon.start()
            restarted = time.monotonic()
            self.assertLess(restarted - attached, 3.5, "restart too slow to tell")
            self.assertTrue(self.await_generation(c, 2), self.daemon.log_tail())
            self.assertLess(time.monotonic() - restarted, 3.5)  # >= 7.5 - 3.5 s without the watch
            c.lookup(keys_of(9, 2))  # the new session answers

    def test_tuttid_killed_mid_retrieve(self):
        e = self.engine(224)
        with e.attach(self.daemon) as c:
            keys = keys_of(5, 96)
            self.store_all(c, e, keys)
            lease = c.lookup(keys)
            self.assertEqual(lease.hits, 96)
            blocks = list(range(128, 224))
            r = c.retrieve(lease, keys, blocks)
            r.wait_layer(0)
            self.daemon.kill()
            landed = 0
            for layer in range(LAYOUT.num_layers):
                try:
                    r.wait_layer(layer)
                    landed += 1
                except tutti.TuttiError as err:
                    self.assertEqual(err.code, "ABORTED")
            out = r.wait()
            self.assertEqual(out.layers_done, landed)
            if out.ok:
                self.assertEqual((landed, out.failed), (8, []))
            else:
                self.assertLess(landed, 8)
                self.assertEqual(out.failed, list(range(96)))
            for layer in range(landed):
                self.assertTrue(e.layer_ok(blocks[0], keys[0], layer))
            print("killed after %d of 8 layers: %s %s" % (landed, out.code, out.message))
            self.daemon.start()
            self.assertTrue(self.await_generation(c, 2), self.daemon.log_tail())
            self.retrieve_and_verify(c, e, keys[:32], 160)

    def test_attach_errors(self):
        e = self.engine(4)
        with self.assertRaisesRegex(tutti.Unavailable, "cannot reach tuttid"):
            tutti.Client.attach(NS, 4, e.objects, host_regions=[e.shm.region()],
                                socket_path="/tmp/tutti-no-such-dir/tuttid.sock")
        name, addr, size = e.shm.region()
        with self.assertRaises(tutti.InvalidArgument):
            tutti.Client.attach(NS, 4, e.objects, host_regions=[(name, addr, size // 2)],
                                socket_path=self.daemon.socket)
        big = tutti.KvLayout(num_layers=8, kv_heads=8, head_dim=128, dtype_bytes=4,
                             block_tokens=32)
        objs = [tutti.ObjectTensor(o.base, 2 * o.block_stride) for o in e.objects]
        with self.assertRaises(tutti.FailedPrecondition):
            tutti.Client.attach(tutti.Namespace("big", big), 2, objs,
                                host_regions=[e.shm.region()], socket_path=self.daemon.socket)

    def test_detach_is_idempotent(self):
        e = self.engine(4)
        c = e.attach(self.daemon)
        c.detach()
        c.detach()
        self.assertFalse(c.info["attached"])
        with self.assertRaises(tutti.FailedPrecondition):
            c.lookup(keys_of(6, 1))

    def test_tuttid_maps_the_descriptor_not_the_name(self):
        e = self.engine(16, named=True)
        e.shm.unlink()  # no name left that tuttid could open
        self.assertFalse(os.path.exists("/dev/shm" + e.shm.name))
        with e.attach(self.daemon) as c:
            keys = keys_of(7, 4)
            self.store_all(c, e, keys)  # tuttid read the blocks through the descriptor
            self.retrieve_and_verify(c, e, keys, 8)  # and wrote them back through it
            self.assertEqual(self.daemon.stop(), 0)
            self.daemon.start()
            self.assertTrue(self.await_generation(c, 2), self.daemon.log_tail())  # the fd again
            self.retrieve_and_verify(c, e, keys, 4)

    def test_attach_without_a_credential_is_refused(self):
        import grpc
        from tutti import client as tc
        from tutti.v1 import kvcache_pb2_grpc as pb_grpc
        e = self.engine(4)
        req = tc.build_host_attach("no-handoff", NS, 4, e.objects, [e.shm.region()])
        with grpc.insecure_channel("unix:" + self.daemon.socket) as channel:
            stub = pb_grpc.KvCacheStub(channel)
            for credential in (b"", b"x" * 16):
                req.credential = credential
                with self.assertRaises(grpc.RpcError) as cm:
                    stub.Attach(req, timeout=10)
                self.assertEqual(cm.exception.code(), grpc.StatusCode.PERMISSION_DENIED,
                                 cm.exception.details())
        with e.attach(self.daemon) as c:  # the same request after a handoff
            self.assertTrue(c.info["attached"])

    def test_a_stopped_tuttid_costs_a_lookup_seconds(self):
        # session_ttl_ms 2000: the KeepAlive (every 0.5 s) times out first and the lookup is
        # cancelled; 30000: the lookup's own deadline (Timeouts.short, 5 s) ends it.
        for ttl in (2000, 30000):
            with self.subTest(session_ttl_ms=ttl):
                self.daemon.cleanup()
                self.daemon = Tuttid(session_ttl_ms=ttl).start()
                self.lookup_while_stopped(self.engine(4))

    def lookup_while_stopped(self, e):
        with e.attach(self.daemon) as c:
            os.kill(self.daemon.proc.pid, signal.SIGSTOP)
            self.await_stopped(self.daemon.proc.pid)
            try:
                outcome = []
                t = threading.Thread(target=lambda: outcome.append(self.try_lookup(c)),
                                     daemon=True)
                start = time.monotonic()
                t.start()
                t.join(10.0)  # the old client waited out its 120 s call deadline here
                self.assertFalse(t.is_alive(), "a lookup against a stopped tuttid still waits")
                took = time.monotonic() - start
                err, = outcome
                self.assertIsInstance(err, tutti.Unavailable)
                print("stopped tuttid: lookup returned after %.1f s: %s" % (took, err))
            finally:
                os.kill(self.daemon.proc.pid, signal.SIGCONT)
            # Attached again: a new session where the old one was given up (2000), else the old.
            self.assertTrue(self.await_generation(c, 1), self.daemon.log_tail())
            self.assertEqual(c.lookup(keys_of(8, 2)).hits, 0)

    @staticmethod
    def await_stopped(pid):
        # kill() only queues SIGSTOP: on a loaded machine tuttid's threads may still answer a
        # moment after it returns. Wait until the kernel reports the process stopped.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
            time.sleep(0.01)
        raise AssertionError("tuttid did not stop")

    @staticmethod
    def try_lookup(c):
        try:
            c.lookup(keys_of(8, 2))
            return None
        except tutti.TuttiError as e:
            return e


if __name__ == "__main__":
    unittest.main(verbosity=2)

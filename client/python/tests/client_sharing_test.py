"""The client's additions for engines split into processes (vLLM's scheduler and workers),
against the fake tuttid: a memory-less attach (no descriptors, no regions, num_blocks 0, the
engine_group), engine_group on a normal attach (and its length checked), a Retrieve under several
leases (RetrieveRequest.lease_ids), WatchEvents as typed batches, ended by detach."""

import threading
import unittest

import torch

import tutti
from tutti.v1 import kvcache_pb2 as pb

from fake_tuttid import FakeTuttid, handoff_count

LAYOUT = tutti.KvLayout(num_layers=2, kv_heads=2, head_dim=64, dtype_bytes=2, block_tokens=16)
NS = tutti.Namespace(model_id="m", layout=LAYOUT)
KEYS = tutti.chain_keys(range(64), 16)
GROUP = b"G" * 16


class SharingTest(unittest.TestCase):
    def setUp(self):
        self.daemon = FakeTuttid().start()
        self.shm = tutti.SharedMemory(tutti.cache_bytes(LAYOUT, 8), "tutti-sharing")
        _, per_layer = tutti.host_cache_tensor(LAYOUT, 8, torch.float16, self.shm)
        self.objects = tutti.objects_from_tensors(LAYOUT, per_layer)

    def tearDown(self):
        self.daemon.close()
        self.shm.close()

    def worker(self, **kw):
        return tutti.Client.attach(NS, 8, self.objects, host_regions=[self.shm.region()],
                                   socket_path=self.daemon.socket, **kw)

    def test_lookup_only_attach(self):
        with tutti.Client.attach_lookup_only(NS, GROUP, socket_path=self.daemon.socket) as c:
            lease = c.lookup(KEYS, prompt_tokens=64)
            self.assertEqual(lease.hits, 4)
        req = self.daemon.attaches[0]
        self.assertEqual((req.num_blocks, len(req.regions), len(req.placements)), (0, 0, 0))
        self.assertEqual(req.engine_group, GROUP)
        self.assertEqual(handoff_count(self.daemon.handoffs[0][0]), 0)
        self.assertEqual(req.namespace.layout.num_layers, 2)
        with self.assertRaisesRegex(tutti.InvalidArgument, "needs one"):
            tutti.Client.attach_lookup_only(NS, b"", socket_path=self.daemon.socket)

    def test_engine_group_on_attach(self):
        with self.worker(engine_group=GROUP):
            pass
        self.assertEqual(self.daemon.attaches[0].engine_group, GROUP)
        with self.worker():
            pass
        self.assertEqual(self.daemon.attaches[1].engine_group, b"")
        for bad in (b"x" * 15, b"x" * 65):
            with self.assertRaisesRegex(tutti.InvalidArgument, "16 to 64"):
                self.worker(engine_group=bad)

    def test_namespace_secret_on_attach(self):
        secret = b"s" * 16
        with self.worker(namespace_secret=secret):
            pass
        with tutti.Client.attach_lookup_only(NS, GROUP, socket_path=self.daemon.socket,
                                             namespace_secret=secret):
            pass
        with self.worker():
            pass
        self.assertEqual([a.namespace_secret for a in self.daemon.attaches], [secret, secret, b""])
        for bad in (b"x" * 15, b"x" * 65, "not bytes"):
            with self.assertRaisesRegex(tutti.InvalidArgument, "namespace_secret"):
                self.worker(namespace_secret=bad)

    def test_every_call_carries_the_session_token(self):
        """tuttid answers a call without its session's token as an unknown session (the fake
        does too); the client sends the token Attach gave on every call of the session."""
        with self.worker(engine_group=GROUP) as c:
            lease = c.lookup(KEYS)
            self.assertTrue(c.retrieve(lease, KEYS[:1], [5]).wait(10).ok)
            self.assertEqual(list(c.store(KEYS[:1], [1])), ["durable"])

    def test_retrieve_under_several_leases(self):
        with self.worker(engine_group=GROUP) as c:
            r = c.retrieve(None, KEYS[:2], [3, 4], more_leases=[11, 12])
            self.assertTrue(r.wait(10).ok)
            own = c.lookup(KEYS)
            self.assertTrue(c.retrieve(own, KEYS[:1], [5], more_leases=[13]).wait(10).ok)
            with self.assertRaisesRegex(tutti.InvalidArgument, "no lease"):
                c.retrieve(None, KEYS[:1], [1])
            with self.assertRaisesRegex(tutti.InvalidArgument, "at most 1024"):
                c.retrieve(None, KEYS[:1], [1], more_leases=range(1, 1026))
        first, second = self.daemon.retrieves
        self.assertEqual((first.lease_id, list(first.lease_ids)), (0, [11, 12]))
        self.assertEqual((second.lease_id, list(second.lease_ids)), (7, [13]))
        self.assertEqual([b.engine_block for b in first.blocks], [3, 4])

    def test_watch_events(self):
        first = pb.WatchEventsResponse(pool_id=5, boot_id=6, blocks_lost_at_start=2, resumed=True)
        first.events.add(seq=1, kind=pb.BLOCK_STORED, key=KEYS[0])
        later = pb.WatchEventsResponse()
        later.events.add(seq=2, kind=pb.BLOCK_REMOVED, key=KEYS[0])
        later.events.add(seq=3, kind=0, key=KEYS[1])  # unknown kinds are dropped
        self.daemon.events = [first, later]
        c = tutti.Client.attach_lookup_only(NS, GROUP, socket_path=self.daemon.socket)
        stream = c.watch_events(after_seq=9, boot_id=6)
        b1, b2 = next(stream), next(stream)
        self.assertEqual(b1, tutti.EventBatch(True, 5, 6, 2, True,
                                              [tutti.BlockEvent(1, "stored", KEYS[0])]))
        self.assertEqual(b2, tutti.EventBatch(False, events=[tutti.BlockEvent(2, "removed",
                                                                              KEYS[0])]))
        w = self.daemon.watches[0]
        self.assertEqual((w.after_seq, w.boot_id), (9, 6))
        ended = []
        t = threading.Thread(target=lambda: ended.append(list(stream)))
        t.start()
        c.detach()  # cancels the stream: iteration ends
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertEqual(ended, [[]])

    def test_watch_events_cancel(self):
        c = tutti.Client.attach_lookup_only(NS, GROUP, socket_path=self.daemon.socket)
        stream = c.watch_events()
        stream.cancel()
        self.assertEqual(list(stream), [])
        c.detach()


if __name__ == "__main__":
    unittest.main()

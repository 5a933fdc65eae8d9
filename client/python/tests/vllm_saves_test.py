"""The connector worker's pending saves (tutti.vllm.saves): blocks tuttid refused (store staging
full) are retried and all end up stored; a request that had saves is reported finished_sending
only once its retries are done (and by every TP rank's worker, once); a preemption drops the
request's pending saves and waits for its retry in flight; the deadline, tuttid away and the cap
give up (counted, logged with tuttid's reason); "layer" saves retry a refused block whole. Fake
clients for the logic, and the real tuttid (host mode, tiny store staging) for the end-to-end
retry. Needs tests/vllm/stub first on sys.path (the BUILD does it)."""

import logging
import os
import sys
import threading
import types
import unittest

sys.path.insert(0, os.path.join(os.environ.get("TEST_SRCDIR", ""), "tutti/tests/vllm/stub")
                if os.environ.get("TEST_SRCDIR") else
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../tests/vllm/stub"))

import torch  # noqa: E402

import tutti  # noqa: E402
from tutti.client import StoreOutcomes  # noqa: E402
from tutti.vllm import register_host_memory  # noqa: E402
from tutti.vllm.metadata import SaveSpec, TuttiConnectorMetadata  # noqa: E402
from tutti.vllm.worker import TuttiWorker  # noqa: E402

LAYERS = 3
WHY = "store staging full (fake: 0 bytes free)"


class FakeStore:
    """One rank's tuttid as Store sees it: `room` new blocks are accepted per call (None: any),
    the rest are rejected_full; a block is complete once all its layers were captured; a block
    partly captured takes no more room. `gate`: Store waits on it (after setting `entered`)."""

    def __init__(self, room=None):
        self.room = room
        self.layers = {}   # key -> set of captured layers
        self.blocks = {}   # key -> engine block
        self.calls = []    # (keys, blocks, layer_begin, layer_end)
        self.fail = None   # an exception Store raises
        self.decline = set()  # keys tuttid's admission policy declines (STORE_DECLINED)
        self.gate = None
        self.entered = threading.Event()
        self.info = {"attached": True, "max_blocks_per_call": 512}

    def detach(self):
        pass

    def complete(self):
        return {k for k, ls in self.layers.items() if len(ls) == LAYERS}

    def store(self, keys, blocks, layer_begin=0, layer_end=0, stream=None, wait_durable=False):
        self.calls.append((list(keys), list(blocks), layer_begin, layer_end))
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        if self.fail is not None:
            raise self.fail
        end = layer_end or LAYERS
        out = StoreOutcomes()
        for k, b in zip(keys, blocks):
            if len(self.layers.get(k, ())) == LAYERS:
                out.append("already_present")
                continue
            if k in self.decline:
                out.append("declined")
                continue
            if k not in self.layers:
                if self.room is not None and self.room <= 0:
                    out.append("rejected_full")
                    out.rejected_why = WHY
                    continue
                if self.room is not None:
                    self.room -= 1
                self.layers[k] = set()
            self.layers[k].update(range(layer_begin, end))
            self.blocks[k] = b
            out.append("captured")
        return out


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def worker(fake, rank=0, tp=1, save="end", clock=None, **kw):
    w = TuttiWorker(None, None, rank, tp, "sock%d" % rank, save_mode=save,
                    clock=clock or Clock(), **kw)
    w.client = fake
    names = ["layer.%d" % i for i in range(LAYERS)]
    w.geometry = types.SimpleNamespace(device=None, layout=types.SimpleNamespace(
        num_layers=LAYERS), layer_index=names.index)
    return w, names


def keys(tag, n):
    return [(tag * 16)[:15] + bytes([i]) for i in range(n)]


def step(w, saves=(), preempted=(), names=None):
    """One vLLM step of the worker: bind, (layer saves), wait_for_save, clear."""
    w.bind(TuttiConnectorMetadata(saves=list(saves), preempted=list(preempted)))
    w.start_load()
    if w.save_mode == "layer":
        for n in names:
            w.save_layer(n, None)
    w.wait_for_save()
    w.clear()


class PendingSavesTest(unittest.TestCase):
    def test_refused_blocks_are_retried_and_reported_after(self):
        fake = FakeStore(room=3)
        w, _ = worker(fake)
        ka = keys(b"a", 8)
        step(w, [SaveSpec("a", ka, list(range(10, 18)))])
        self.assertEqual(len(fake.complete()), 3)
        self.assertEqual(w.save_stats()["pending"], 5)
        self.assertIsNone(w.get_finished({"a"})[0])  # vLLM holds a's blocks meanwhile
        fake.room = 2
        self.assertEqual(w._pending.retry_once(), 5)
        self.assertEqual(fake.calls[-1][0], ka[3:])  # the oldest first, whole blocks
        self.assertEqual(fake.calls[-1][2:], (0, 0))
        self.assertIsNone(w.get_finished(set())[0])
        fake.room = None
        w._pending.retry_once()
        self.assertEqual(w.get_finished(set()), ({"a"}, None))  # from the earlier call's set
        self.assertEqual(w.get_finished({"a"}), (None, None))   # once
        self.assertEqual(fake.complete(), set(ka))
        self.assertEqual([fake.blocks[k] for k in ka], list(range(10, 18)))
        st = w.save_stats()
        self.assertEqual((st["refused"], st["stored_late"], st["dropped"]), (5, 5, {}))

    def test_declined_blocks_are_settled_not_given_up(self):
        fake = FakeStore(room=0)
        w, _ = worker(fake)
        ka = keys(b"a", 4)
        fake.decline = {ka[0]}
        step(w, [SaveSpec("a", ka, [1, 2, 3, 4])])  # ka[0] declined, the rest refused
        self.assertEqual(w.save_stats()["pending"], 3)
        self.assertIsNone(w.get_finished({"a"})[0])  # its refused blocks are pending
        fake.room = None
        fake.decline = {ka[1]}  # a retry may be declined too
        self.assertEqual(w._pending.retry_once(), 3)
        self.assertEqual(w.get_finished(set()), ({"a"}, None))
        st = w.save_stats()
        self.assertEqual((st["refused"], st["stored_late"], st["declined"], st["dropped"]),
                         (3, 2, 1, {}))
        self.assertEqual(fake.complete(), set(ka[2:]))

    def test_request_without_refusals_is_reported_at_once(self):
        w, _ = worker(FakeStore())
        step(w, [SaveSpec("a", keys(b"a", 2), [1, 2])])
        self.assertEqual(w.get_finished({"a", "no-saves"}), ({"a"}, None))
        self.assertEqual(w.get_finished({"a"}), (None, None))

    def test_retry_thread_stores_everything(self):
        fake = FakeStore(room=1)
        w, _ = worker(fake)
        w._pending._min_backoff = w._pending._max_backoff = 0.0
        w._pending.start()
        try:
            ka = keys(b"t", 6)
            step(w, [SaveSpec("a", ka, list(range(6)))])
            fake.room = None
            self.assertTrue(w._pending.wait_idle(30))
            self.assertEqual(w.get_finished({"a"}), ({"a"}, None))
            self.assertEqual(fake.complete(), set(ka))
        finally:
            w.shutdown()

    def test_preemption_drops_and_waits_for_the_store_in_flight(self):
        fake = FakeStore(room=0)
        w, _ = worker(fake)
        ka, kb = keys(b"a", 4), keys(b"b", 4)
        step(w, [SaveSpec("a", ka, [1, 2, 3, 4]), SaveSpec("b", kb, [5, 6, 7, 8])])
        fake.gate = threading.Event()
        fake.entered.clear()
        retry = threading.Thread(target=w._pending.retry_once)
        retry.start()
        self.assertTrue(fake.entered.wait(30))  # the retry Store reads a's blocks now
        preempt = threading.Thread(target=w.handle_preemptions, args=({"a"},))
        preempt.start()
        preempt.join(0.2)
        self.assertTrue(preempt.is_alive())  # waits for the Store in flight
        fake.gate.set()  # tuttid still refuses everything
        preempt.join(30)
        retry.join(30)
        self.assertFalse(preempt.is_alive())
        self.assertEqual(w.save_stats()["pending"], 4)  # b's only: a's never re-queued
        fake.gate, fake.room = None, None
        w._pending.retry_once()
        self.assertEqual(fake.complete(), set(kb))
        self.assertEqual(w.save_stats()["dropped"], {"request preempted": 4})
        # a resumes in other blocks, saves again, finishes: reported once its new saves are in
        step(w, [SaveSpec("a", ka[:1], [9])])
        self.assertEqual(w.get_finished({"a", "b"}), ({"a", "b"}, None))
        self.assertEqual(fake.blocks[ka[0]], 9)

    def test_preemption_in_metadata_drops_pending(self):
        fake = FakeStore(room=0)
        w, _ = worker(fake)
        step(w, [SaveSpec("a", keys(b"a", 3), [1, 2, 3])])
        step(w, preempted=["a"])  # newer vLLM: no handle_preemptions(ids)
        self.assertEqual(w.save_stats()["pending"], 0)
        fake.room = None
        self.assertEqual(w._pending.retry_once(), 0)
        self.assertEqual(fake.complete(), set())

    def test_deadline_gives_up_reports_and_logs_once(self):
        clock = Clock()
        fake = FakeStore(room=0)
        w, _ = worker(fake, clock=clock, retry_deadline_s=10.0)
        w._pending._log_interval = 60.0
        step(w, [SaveSpec("a", keys(b"a", 3), [1, 2, 3])])
        w._pending.retry_once()
        self.assertIsNone(w.get_finished({"a"})[0])
        clock.now += 10.5
        with self.assertLogs("tutti.vllm", logging.WARNING) as logs:
            self.assertEqual(w.get_finished(set()), ({"a"}, None))
            step(w, [SaveSpec("b", keys(b"b", 2), [4, 5])])
            clock.now += 10.5
            w.get_finished(set())  # b given up too, but within the log interval
        self.assertEqual(len(logs.records), 1)
        self.assertIn("3: still refused after save_retry_deadline_ms (10000 ms)",
                      logs.output[0])
        self.assertIn(WHY, logs.output[0])
        self.assertEqual(w.save_stats()["dropped"],
                         {"still refused after save_retry_deadline_ms (10000 ms)": 5})

    def test_tuttid_away_gives_up_everything(self):
        fake = FakeStore(room=0)
        w, _ = worker(fake)
        step(w, [SaveSpec("a", keys(b"a", 2), [1, 2]), SaveSpec("b", keys(b"b", 2), [3, 4])])
        w._pending.batch = 1
        fake.fail = tutti.Unavailable("fake: session ended")
        w._pending.retry_once()
        self.assertEqual(w.save_stats()["pending"], 0)
        self.assertEqual(w.get_finished({"a", "b"}), ({"a", "b"}, None))
        (cause, n), = w.save_stats()["dropped"].items()
        self.assertEqual(n, 4)
        self.assertIn("tuttid away", cause)
        # the step's own Store failing: the step's blocks are given up, nothing pending
        step(w, [SaveSpec("c", keys(b"c", 2), [5, 6])])
        self.assertEqual(w.get_finished({"c"}), ({"c"}, None))
        self.assertEqual(w.save_stats()["dropped"], {cause: 6})

    def test_cap_on_pending_blocks(self):
        w, _ = worker(FakeStore(room=0), max_pending_saves=3)
        step(w, [SaveSpec("a", keys(b"a", 5), [1, 2, 3, 4, 5])])
        st = w.save_stats()
        self.assertEqual((st["pending"], st["dropped"]),
                         (3, {"max_pending_saves (3 blocks) reached": 2}))

    def test_layer_saves_retry_a_refused_block_whole(self):
        fake = FakeStore(room=2)
        w, names = worker(fake, save="layer")
        ka = keys(b"l", 3)
        step(w, [SaveSpec("a", ka, [7, 8, 9])], names=names)
        # layer 0 took blocks 0 and 1; block 2 was refused and got none of its later layers
        self.assertEqual([c[0] for c in fake.calls], [ka, ka[:2], ka[:2]])
        self.assertEqual([c[2:] for c in fake.calls], [(0, 1), (1, 2), (2, 3)])
        self.assertEqual(fake.complete(), set(ka[:2]))
        self.assertNotIn(ka[2], fake.layers)  # no partial block holds staging
        self.assertIsNone(w.get_finished({"a"})[0])
        fake.room = 1
        w._pending.retry_once()
        self.assertEqual(fake.calls[-1], ([ka[2]], [9], 0, 0))  # every layer at once
        self.assertEqual(fake.complete(), set(ka))
        self.assertEqual(w.get_finished(set()), ({"a"}, None))

    def test_layer_refused_after_a_partial_capture_is_completed(self):
        """A refusal at a later layer (the partial was lost, say): the retry of all layers
        fills in what tuttid lacks."""
        fake = FakeStore()
        w, names = worker(fake, save="layer")
        k = keys(b"p", 1)
        w.bind(TuttiConnectorMetadata(saves=[SaveSpec("a", k, [3])]))
        w.save_layer(names[0], None)
        del fake.layers[k[0]]  # tuttid dropped the partial block
        fake.room = 0
        w.save_layer(names[1], None)
        w.save_layer(names[2], None)
        w.wait_for_save()
        self.assertEqual(len(fake.calls), 2)  # layer 2 not sent after the refusal
        fake.room = None
        w._pending.retry_once()
        self.assertEqual(fake.complete(), set(k))
        self.assertEqual(w.get_finished({"a"}), ({"a"}, None))


class Aggregator:
    """vLLM's KVOutputAggregator for finished_sending: an id is finished once every one of
    `world` workers listed it (a count down per id)."""

    def __init__(self, world):
        self.world, self.left, self.finished = world, {}, set()

    def add(self, finished_sending):
        for r in finished_sending or ():
            self.left[r] = self.left.get(r, self.world) - 1
            if self.left[r] == 0:
                self.finished.add(r)
                del self.left[r]


class TensorParallelTest(unittest.TestCase):
    def test_each_rank_reports_each_request_once(self):
        f0, f1 = FakeStore(), FakeStore(room=1)
        w0, _ = worker(f0, rank=0, tp=2)
        w1, _ = worker(f1, rank=1, tp=2)
        agg = Aggregator(2)
        saves = [SaveSpec("a", keys(b"a", 3), [1, 2, 3]), SaveSpec("b", keys(b"b", 1), [4])]
        for w in (w0, w1):
            step(w, saves)
        for w in (w0, w1):
            agg.add(w.get_finished({"a", "b"})[0])
        self.assertEqual(agg.finished, set())  # rank 1 still has a's and b's blocks pending
        self.assertEqual(agg.left, {"a": 1, "b": 1})
        f1.room = None
        w1._pending.retry_once()
        for w in (w0, w1):
            agg.add(w.get_finished(set())[0])
        self.assertEqual(agg.finished, {"a", "b"})
        self.assertEqual(agg.left, {})  # rank 0 did not report a second time


# Real tuttid: 4 layers of [8 heads, 16 tokens, 2 x 64] float16 = 32 KiB objects, 128 KiB blocks;
# 1 MiB of store staging (a session's share is at least one 16-object block of 64 KiB objects:
# all of it): 8 blocks at a time, so most of a step of 24 blocks is refused.
RL, RH, RN, RC, RB = 4, 8, 16, 128, 32


class RealTuttidTest(unittest.TestCase):
    def test_refused_blocks_end_up_stored(self):
        from vllm.config import ModelConfig
        from tutti.testing import Tuttid
        nbytes = RL * RB * RH * RN * RC * 2
        shm = tutti.SharedMemory(nbytes, prefix="tutti-vllm-saves")
        t = torch.frombuffer(shm.buffer, dtype=torch.float16, count=nbytes // 2).view(
            RL, RB, RH, RN, RC)
        t.copy_(torch.randn(RL, RB, RH, RN, RC).to(torch.float16))
        caches = {"model.layers.%d.self_attn.attn" % l: t[l] for l in range(RL)}
        register_host_memory(shm)
        with Tuttid(store_staging=1 << 20) as daemon:
            w = TuttiWorker(ModelConfig(model="saves-test"), None, 0, 1, daemon.socket)
            w.register_kv_caches(caches)
            try:
                ks = tutti.chain_keys(range(24 * RN), RN)
                step(w, [SaveSpec("a", ks, list(range(24)))])
                st = w.save_stats()
                self.assertGreater(st["refused"], 0, "staging did not refuse: %r" % st)
                self.assertIsNone(w.get_finished({"a"})[0])
                # the retry thread stores the rest as tuttid's writer drains staging
                self.assertTrue(w._pending.wait_idle(60), w.save_stats())
                self.assertEqual(w.get_finished(set()), ({"a"}, None))
                st = w.save_stats()
                self.assertEqual(st["dropped"], {})
                self.assertEqual(st["stored_late"], st["refused"])
                # every captured block is written by the time tuttid stops (SIGTERM): all 24
                # are there after a restart
                ns = w.namespace
                w.shutdown()
                daemon.restart()
                c = tutti.Client.attach_lookup_only(ns, os.urandom(16), socket_path=daemon.socket)
                try:
                    self.assertEqual(c.lookup(ks).hits, 24)
                finally:
                    c.detach()
            finally:
                w.shutdown()
                del caches, t
                shm.close()


if __name__ == "__main__":
    unittest.main()

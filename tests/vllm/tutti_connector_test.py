"""TuttiConnector (tutti.vllm) driven by the fake vLLM engine in host mode against real tuttid
instances (one per TP rank): store then load with verified bytes in a fresh engine; TP=2 hits
only where both ranks hold the block (one daemon evicted); a load that fails because a rank's
tuttid died between the lookup and the load (reported through get_block_ids_with_load_errors,
recomputed, no hung step); an eviction between lookup and load (the lease keeps the blocks); the
KV events (take_events) against what was stored and evicted, joined with vLLM's GPU-tier event
hashes; a prompt longer than tuttid's max_blocks_per_call hits in full; a Lookup a live tuttid
refuses is a miss for that request only; a fresh engine (its own random vLLM hash seed, as
without PYTHONHASHSEED) hits what another stored; a load that fails stores nothing computed over it;
FULL CUDA graph replays (no layer hooks) are refused.

TUTTI_HARNESS_DEVICE=cuda:0 (the GPU machine): the same tests in cuda mode, every worker's cache
in device memory and every tuttid with gpu { mode: "cuda" } (the GPU-side layer waits).
"""

import json
import os
import shutil
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "stub"), HERE]

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored  # noqa: E402
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from tutti.testing import Tuttid  # noqa: E402

from fakevllm.engine import Engine, EngineConfig  # noqa: E402
from fakevllm.executor import WorkerError  # noqa: E402

BS = 16
LAYERS, HEADS, HEAD_SIZE = 4, 4, 64
DEVICE = os.environ.get("TUTTI_HARNESS_DEVICE") or None  # e.g. "cuda:0"
OBJECT_BYTES = BS * HEADS * 2 * HEAD_SIZE * 4  # one (layer, block) of the packed cache: 32 KiB


def prompt(seed, blocks, tail=5):
    return [seed * 1000 + i for i in range(blocks * BS + tail)]


def find_tuttictl():
    if os.environ.get("TUTTICTL_BIN"):
        return os.environ["TUTTICTL_BIN"]
    root = os.environ.get("TEST_SRCDIR")
    if root and os.access(os.path.join(root, "tutti/client/tuttictl"), os.X_OK):
        return os.path.join(root, "tutti/client/tuttictl")
    return "bazel-bin/client/tuttictl"


def tuttictl(daemon, *args):
    out = subprocess.run([find_tuttictl(), args[0], "--socket", daemon.socket] +
                         list(args[1:]) + ["--json"], capture_output=True, text=True,
                         timeout=30)
    if out.returncode != 0:
        raise AssertionError("tuttictl %s: %s%s" % (args[0], out.stdout, out.stderr))
    return json.loads(out.stdout)


def evict_all(daemon):
    return tuttictl(daemon, "evict", "--all")


def blocks_on_ssd(daemon):
    return sum(ns["blocks_ssd"] for ns in tuttictl(daemon, "stats").get("namespaces", []))


def wait_blocks(daemon, n, timeout=20.0):
    """Waits until `daemon` holds at least n blocks on its SSD: a Store returns once tuttid
    captured the bytes, and a block is found by Lookup once it is written."""
    deadline = time.monotonic() + timeout
    while blocks_on_ssd(daemon) < n:
        if time.monotonic() > deadline:
            raise AssertionError("%s: %d blocks on SSD after %.0f s, want %d" %
                                 (daemon.socket, blocks_on_ssd(daemon), timeout, n))
        time.sleep(0.05)


def leases_held(daemon):
    return sum(s["leases"] for s in tuttictl(daemon, "sessions").get("sessions", []))



def lose_lease(req_id, rank):
    """A before_execute hook: the LoadSpec of `req_id` names, on `rank`, a lease tuttid does not
    know (as one that expired between the scheduler's Lookup and the worker's Retrieve)."""
    def hook(so):
        for spec in so.kv_connector_metadata.loads:
            if spec.req_id == req_id:
                spec.lease_ids[rank] = 1 << 40
    return hook

class TuttiConnectorTest(unittest.TestCase):
    def setUp(self):
        self.daemons, self.engines = [], []

    def tearDown(self):
        for e in self.engines:
            e.shutdown()
        for d in self.daemons:
            d.cleanup()

    def start_daemons(self, n, **kw):
        settings = dict(object_bytes=OBJECT_BYTES, max_objects=2 * LAYERS, session_ttl_ms=5000,
                        extra='gpu { mode: "cuda" }' if DEVICE else "")
        settings.update(kw)
        for _ in range(n):
            self.daemons.append(Tuttid(**settings).start())
        return self.daemons[-n:]

    def engine(self, tp_size=1, extra=None, **kw):
        # CI shares 2 cores among many tests: a Lookup past the default 500 ms would be a miss.
        cfg = {"sockets": [d.socket for d in self.daemons[-tp_size:]], "lookup_timeout_ms": 5000}
        cfg.update(extra or {})
        ktc = KVTransferConfig(kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm",
                               kv_role="kv_both", kv_connector_extra_config=cfg)
        shape = dict(num_layers=LAYERS, num_kv_heads=HEADS, head_size=HEAD_SIZE)
        shape.update(kw)
        e = Engine(EngineConfig(kv_transfer_config=ktc, tp_size=tp_size, block_size=BS,
                                register_host_memory=DEVICE is None, host=DEVICE is None,
                                device=DEVICE, step_timeout=30.0, **shape))
        self.engines.append(e)
        return e

    def assertGood(self, r):
        self.assertTrue(r.verified, r)
        self.assertTrue(r.correct, r)

    def pump_events(self, engine, done, timeout=20.0):
        """Runs steps (with sub-block requests that store nothing) until done(engine.events)."""
        deadline = time.monotonic() + timeout
        i = 0
        while not done(engine.events):
            if time.monotonic() > deadline:
                self.fail("events not seen within %.0f s: %s" % (timeout, engine.events))
            i += 1
            engine.generate([("ping-%d" % i, [7, 7, 7], 1)])
        return engine.events

    def test_store_then_load_in_a_fresh_engine(self):
        self.start_daemons(1)
        for seed, save in ((1, "end"), (11, "layer")):
            with self.subTest(save=save):
                p = prompt(seed, 4)
                first = self.engine(extra={"save": save}).generate([("a", p, 3)])["a"]
                self.assertGood(first)
                self.assertEqual(first.stats.external_tokens, 0)
                self.engines.pop().shutdown()
                wait_blocks(self.daemons[0], 4 if save == "end" else 8)
                second = self.engine(extra={"save": save}).generate([("b", p, 3)])["b"]
                self.assertGood(second)
                self.assertEqual(second.stats.external_tokens, 4 * BS)
                self.assertEqual(second.stats.computed_tokens, len(p) - 4 * BS + 2)
                self.assertEqual(second.output_token_ids, first.output_token_ids)
                self.engines.pop().shutdown()

    def test_a_fresh_engine_hits_without_pythonhashseed(self):
        """vLLM seeds its block hashes per process (init_none_hash: os.urandom(32) unless
        PYTHONHASHSEED is set); the connector's keys do not depend on it. cache_salt keeps
        requests apart as in vLLM."""
        saved = os.environ.pop("PYTHONHASHSEED", None)
        try:
            self.start_daemons(1)
            p = prompt(12, 3)
            first = self.engine()
            self.assertGood(first.generate([("a", p, 2)])["a"])
            self.assertGood(first.generate([("salted", p, 2, {"cache_salt": "x"})])["salted"])
            self.engines.pop().shutdown()
            wait_blocks(self.daemons[0], 6)
            second = self.engine()
            self.assertNotEqual(second.block_hashes(p), first.block_hashes(p))
            r = second.generate([("b", p, 2)])["b"]
            self.assertGood(r)
            self.assertEqual(r.stats.external_tokens, 3 * BS)
            for salt, hit in (("x", 3 * BS), ("y", 0)):
                r = second.generate([("s" + salt, p, 2, {"cache_salt": salt})])["s" + salt]
                self.assertGood(r)
                self.assertEqual(r.stats.external_tokens, hit, salt)
        finally:
            if saved is not None:
                os.environ["PYTHONHASHSEED"] = saved

    def test_a_prompt_past_max_blocks_per_call_hits_in_full(self):
        """2049 blocks: looked up in two chunks (2048 + 1), each under its own lease, loaded by
        two Retrieves. Small blocks (4 KiB a layer) keep the pool and the cache small."""
        small = dict(num_layers=2, num_kv_heads=1, head_size=32, num_gpu_blocks=2100,
                     max_num_batched_tokens=8192, max_model_len=40000)
        object_bytes = BS * 1 * 2 * 32 * 4
        (d0,) = self.start_daemons(1, object_bytes=object_bytes, max_objects=4,
                                   max_blocks_per_call=2048)
        n = 2049
        p = prompt(13, n)
        first = self.engine(**small).generate([("a", p, 2)])["a"]
        self.assertGood(first)
        self.engines.pop().shutdown()
        wait_blocks(d0, n)
        r = self.engine(**small).generate([("b", p, 2)])["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, n * BS)
        self.assertEqual(r.stats.computed_tokens, len(p) - n * BS + 1)
        self.assertEqual(r.output_token_ids, first.output_token_ids)
        self.assertEqual(leases_held(d0), 0)

    def test_a_lookup_tuttid_refuses_misses_that_request_only(self):
        """A live tuttid's INVALID_ARGUMENT is no dead rank: the next request still hits."""
        (d0,) = self.start_daemons(1, max_blocks_per_call=8)
        e = self.engine(max_num_batched_tokens=512)  # both looked up in one step
        short, long = prompt(14, 3), prompt(15, 10)
        self.assertGood(e.generate([("s", short, 2)])["s"])
        wait_blocks(d0, 3)
        e.reset_prefix_cache()
        links = e.connector._sched._links
        links[0].max_blocks_per_call = lambda: 64  # one Lookup of 10 keys: tuttid refuses it
        results = e.generate([("l", long, 2), ("s2", short, 2)])
        self.assertGood(results["l"])
        self.assertGood(results["s2"])
        self.assertEqual(results["l"].stats.external_tokens, 0)
        self.assertEqual(results["s2"].stats.external_tokens, 3 * BS)

    def test_chunked_prefill_and_preemption_save_every_full_block(self):
        self.start_daemons(1)
        reqs = [("r%d" % i, prompt(20 + i, 3, tail=10), 24) for i in range(3)]
        tight = self.engine(num_gpu_blocks=12, max_num_batched_tokens=24)
        out = tight.generate(reqs)
        for r in out.values():
            self.assertGood(r)
        self.assertGreater(sum(r.stats.preemptions for r in out.values()), 0)
        self.engines.pop().shutdown()
        wait_blocks(self.daemons[0], 3 * 5)
        again = self.engine().generate([(i + "'", p, 24) for i, p, _ in reqs])
        for r in again.values():
            self.assertGood(r)
            self.assertEqual(r.stats.external_tokens, 3 * BS)

    def test_physical_orders(self):
        self.start_daemons(1)
        for seed, order in ((30, "LBHNC"), (31, "BLNHC")):
            with self.subTest(order=order):
                p = prompt(seed, 2)
                self.assertGood(self.engine(order=order).generate([("a", p, 2)])["a"])
                self.engines.pop().shutdown()
                wait_blocks(self.daemons[0], 2 if order == "LBHNC" else 4)
                r = self.engine(order=order).generate([("b", p, 2)])["b"]
                self.assertGood(r)
                self.assertEqual(r.stats.external_tokens, 2 * BS)
                self.engines.pop().shutdown()
        with self.assertRaises(WorkerError) as cm:
            self.engine(order="LHBNC")
        self.assertIn("is not contiguous", str(cm.exception))

    def test_tp2_hits_only_where_both_ranks_hold_the_block(self):
        d0, d1 = self.start_daemons(2)
        e = self.engine(tp_size=2)
        p = prompt(2, 4)
        self.assertGood(e.generate([("a", p, 2)])["a"])
        wait_blocks(d0, 4)
        wait_blocks(d1, 4)
        evict_all(d1)
        e.reset_prefix_cache()
        # q shares p's first 2 blocks: it puts them back on rank 1 (rank 0 has them already).
        q = prompt(2, 2, tail=0) + prompt(3, 2)
        rq = e.generate([("q", q, 2)])["q"]
        self.assertGood(rq)
        self.assertEqual(rq.stats.external_tokens, 0, "rank 1 held nothing")
        wait_blocks(d1, 4)
        e.reset_prefix_cache()
        r = e.generate([("b", p, 2)])["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, 2 * BS)

    def test_a_rank_whose_tuttid_dies_before_the_load(self):
        d0, d1 = self.start_daemons(2)
        e = self.engine(tp_size=2)
        p = prompt(4, 3)
        first = e.generate([("a", p, 2)])["a"]
        wait_blocks(d0, 3)
        wait_blocks(d1, 3)
        e.reset_prefix_cache()

        def kill_rank1_once_loading(so):
            new = so.scheduled_new_reqs
            if new and new[0].req_id.startswith("b") and new[0].num_computed_tokens > 0:
                d1.kill()  # after the lookups granted the hits, before the workers' loads
        for attempt in range(5):
            t0 = time.monotonic()
            r = e.generate([("b%d" % attempt, p, 2)], before_execute=kill_rank1_once_loading)
            r = next(iter(r.values()))
            self.assertLess(time.monotonic() - t0, 30.0)
            if d1.proc is None:
                break
            e.reset_prefix_cache()  # a miss (a slow lookup): try again
        self.assertIsNone(d1.proc, "no lookup hit in 5 attempts")
        self.assertGood(r)
        self.assertEqual(r.output_token_ids, first.output_token_ids)
        self.assertEqual(r.stats.failed_load_tokens, 3 * BS)
        self.assertIn(1, r.reported_bad_blocks, "rank 1 read its failed blocks and said so")
        # With rank 1 gone, lookups miss and steps go on.
        e.reset_prefix_cache()
        later = e.generate([("c", p, 2)])["c"]
        self.assertGood(later)
        self.assertEqual(later.stats.external_tokens, 0)

    def test_repeated_lookups_for_a_waiting_request_hold_one_lease(self):
        (d0,) = self.start_daemons(1)
        e = self.engine(num_gpu_blocks=8, max_num_batched_tokens=128)
        p = prompt(7, 3)
        e.generate([("a", p, 2)])
        wait_blocks(d0, 3)
        e.reset_prefix_cache()
        e.add_request("long", prompt(8, 5), 8)  # takes 6 of the 7 usable blocks for 8 steps
        b = e.add_request("b", p, 2)            # 4 blocks: waits, looked up on every step
        for _ in range(4):
            e.step()
            self.assertLessEqual(leases_held(d0), 1)
        e.run_until_done()
        r = e.result(b)
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, 3 * BS)
        self.assertEqual(leases_held(d0), 0, "every lease released once the requests finished")

    def test_eviction_between_lookup_and_load_is_held_off_by_the_lease(self):
        (d0,) = self.start_daemons(1)
        e = self.engine()
        p = prompt(5, 3)
        e.generate([("a", p, 2)])
        wait_blocks(d0, 3)
        e.reset_prefix_cache()

        def evict(so):
            if so.scheduled_new_reqs and so.scheduled_new_reqs[0].req_id == "b":
                evict_all(d0)
        r = e.generate([("b", p, 2)], before_execute=evict)["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, 3 * BS)

    def test_a_failed_load_stores_no_block_computed_on_it(self):
        # vLLM's order: wait_for_save before get_block_ids_with_load_errors. Two requests load in
        # one step, in two Retrieves (max_blocks_per_call 3); the second request's lease is gone
        # when the worker retrieves under it (as after its expiry: tuttid, up, answers NOT_FOUND),
        # so its load fails; the block it computes in that step over the unloaded prefix must not
        # be stored, and the blocks vLLM recomputes afterwards must be: a fresh engine then loads
        # all three, correct. (The worker drops every save of that step; a2's is saved again in
        # its next step.)
        for save in ("end", "layer"):
            with self.subTest(save=save):
                (d0,) = self.start_daemons(1, max_blocks_per_call=3)
                seed = 60 if save == "end" else 70
                a, b = prompt(seed, 2, tail=0), prompt(seed + 1, 2, tail=0)
                tail = prompt(seed + 2, 1)
                first = self.engine(extra={"save": save}).generate([("a", a + [1], 1),
                                                                    ("b", b + [1], 1)])
                self.engines.pop().shutdown()
                wait_blocks(d0, 4)
                both = self.engine(extra={"save": save}).generate(
                    [("a2", a + tail, 2), ("b2", b + tail, 1)],
                    before_execute=lose_lease("b2", rank=0))
                self.engines.pop().shutdown()
                for r in list(first.values()) + list(both.values()):
                    self.assertGood(r)
                self.assertEqual(both["a2"].stats.external_tokens, 2 * BS)
                self.assertEqual(both["b2"].stats.failed_load_tokens, 2 * BS)
                wait_blocks(d0, 6)
                again = self.engine(extra={"save": save}).generate([("b3", b + tail, 2)])["b3"]
                self.assertGood(again)
                self.assertEqual(again.stats.external_tokens, 3 * BS)
                self.engines.pop().shutdown()
                self.daemons.pop().cleanup()

    def test_tp2_a_load_failed_on_one_rank_stores_nothing_on_the_other(self):
        # b2's lease on rank 0 is gone when rank 0 retrieves (rank 0's tuttid takes 3 blocks per
        # call, so a2 and b2 load in two Retrieves there): b2's load fails on rank 0 only.
        # Rank 1's KV of b2's block 2 is then computed from rank 0's garbage too (the ranks'
        # attention is all-reduced): rank 1 must not store it either.
        d0 = self.start_daemons(1, max_blocks_per_call=3)[0]
        d1 = self.start_daemons(1)[0]
        a, b, tail = prompt(100, 2, tail=0), prompt(101, 2, tail=0), prompt(102, 1)
        self.engine(tp_size=2).generate([("a", a + [1], 1), ("b", b + [1], 1)])
        self.engines.pop().shutdown()
        wait_blocks(d0, 4)
        wait_blocks(d1, 4)
        both = self.engine(tp_size=2).generate([("a2", a + tail, 2), ("b2", b + tail, 1)],
                                               before_execute=lose_lease("b2", rank=0))
        self.engines.pop().shutdown()
        for r in both.values():
            self.assertGood(r)
        self.assertEqual(both["b2"].stats.failed_load_tokens, 2 * BS)
        self.assertEqual(list(both["b2"].reported_bad_blocks), [0])
        wait_blocks(d0, 6)
        wait_blocks(d1, 6)
        again = self.engine(tp_size=2).generate([("b3", b + tail, 2)])["b3"]
        self.assertGood(again)
        self.assertEqual(again.stats.external_tokens, 3 * BS)

    def test_a_best_effort_cache_needs_no_kv_delivery(self):
        # base.py: best-effort caches return False (the default follows kv_role, True here).
        self.start_daemons(1)
        e = self.engine()
        self.assertTrue(e.vllm_config.kv_transfer_config.is_kv_producer)
        self.assertFalse(e.connector.requires_kv_delivery)

    def test_saves_stop_at_the_publishable_hashes(self):
        # base.py: content-addressed connectors apply request.num_publishable_block_hashes
        # before storing by hash (EAGLE successor-aware hashes: here they lag a step behind).
        (d0,) = self.start_daemons(1)
        e = self.engine(eagle_prefix_cache_hashing=True, max_num_batched_tokens=24)
        saved = {}

        def check(so):
            for spec in so.kv_connector_metadata.saves:
                saved[spec.req_id] = saved.get(spec.req_id, 0) + len(spec.keys)
                fence = e.scheduler.requests[spec.req_id].num_publishable_block_hashes
                self.assertLessEqual(saved[spec.req_id], fence, "saved past the fence")
        r = e.generate([("a", prompt(90, 4), 3)], before_execute=check)["a"]
        self.assertGood(r)
        self.assertGreaterEqual(saved.get("a", 0), 3)
        wait_blocks(d0, saved["a"])

    def test_full_cuda_graph_replays_keep_the_layer_hooks(self):
        # vLLM replays uniform-decode batches as FULL CUDA graphs (its default cudagraph_mode)
        # unless the connector requires PIECEWISE: the blocks decode completes would never be
        # saved per layer, and a load that leaves one token to compute would not be waited for
        # (in host mode its transfer lands before the read anyway: only the mode shows that).
        (d0,) = self.start_daemons(1)
        p = prompt(80, 1)
        e = self.engine(extra={"save": "layer"})
        self.assertEqual(e.cudagraph_mode, "PIECEWISE")
        first = e.generate([("a", p, 44)])["a"]  # 21 + 44 tokens: decode completes 3 blocks
        self.assertGood(first)
        self.engines.pop().shutdown()
        wait_blocks(d0, 4)
        whole = p + first.output_token_ids  # 65 tokens: 4 blocks to load, 1 token to compute
        r = self.engine(extra={"save": "layer"}).generate([("b", whole, 2)])["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, 4 * BS)

    def test_events_follow_stores_and_evictions(self):
        (d0,) = self.start_daemons(1)
        e = self.engine()
        p = prompt(6, 3)
        self.assertGood(e.generate([("a", p, 2, {"cache_salt": "s"})])["a"])
        # vLLM's GPU-tier BlockStored carries maybe_convert_block_hash(hash) (an int by
        # default): the disk tier's events join them by it
        req = Request("hashes-of-a", p, block_hasher=e.block_hasher, cache_salt="s")
        req_hashes = [maybe_convert_block_hash(h) for h in req.block_hashes]

        def stored(events):
            return [ev for ev in events if isinstance(ev, BlockStored)]
        self.pump_events(e, lambda evs: sum(len(ev.block_hashes) for ev in stored(evs)) >= 3)
        # joined by hash with the GPU tier's events of the same blocks: same tokens, same parent
        gpu = {}
        for ev in e.gpu_events:
            for j, h in enumerate(ev.block_hashes):
                parent = ev.block_hashes[j - 1] if j else ev.parent_block_hash
                gpu[h] = (parent, ev.token_ids[j * BS:(j + 1) * BS], ev.extra_keys[j])
        for ev in stored(e.events):
            for j, h in enumerate(ev.block_hashes):
                parent = ev.block_hashes[j - 1] if j else ev.parent_block_hash
                self.assertIn(h, gpu)
                self.assertEqual((parent, ev.token_ids[j * BS:(j + 1) * BS], ev.extra_keys[j]),
                                 gpu[h])
        hashes, tokens = [], []
        for ev in stored(e.events):
            self.assertEqual((ev.medium, ev.locality, ev.block_size), ("STORAGE", "LOCAL", BS))
            first = req_hashes.index(ev.block_hashes[0])
            self.assertEqual(ev.parent_block_hash, req_hashes[first - 1] if first else None)
            self.assertEqual(ev.extra_keys, [("s",) if first + j == 0 else None
                                             for j in range(len(ev.block_hashes))])
            hashes += ev.block_hashes
            tokens += ev.token_ids
        self.assertEqual(hashes, req_hashes[:3])
        self.assertEqual(tokens, p[:3 * BS])
        evict_all(d0)
        self.pump_events(e, lambda evs: sum(len(ev.block_hashes) for ev in evs
                                            if isinstance(ev, BlockRemoved)) >= 3)
        removed = [h for ev in e.events if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
        self.assertEqual(sorted(removed), sorted(req_hashes[:3]))
        self.assertFalse(any(isinstance(ev, AllBlocksCleared) for ev in e.events))

    def test_a_restart_that_kept_the_pool_clears_nothing_a_wiped_pool_clears_all(self):
        (d0,) = self.start_daemons(1)
        e = self.engine()
        p = prompt(9, 2)
        self.assertGood(e.generate([("a", p, 2)])["a"])
        self.pump_events(e, lambda evs: any(isinstance(ev, BlockStored) for ev in evs))
        d0.restart()
        e.reset_prefix_cache()
        deadline = time.monotonic() + 20.0
        hit = None
        while hit is None or hit.stats.external_tokens == 0:  # until the sessions are back
            self.assertLess(time.monotonic(), deadline, "no hit after the restart")
            hit = e.generate([("b%d" % len(e.step_reports), p, 2)])
            hit = next(iter(hit.values()))
            self.assertGood(hit)
            e.reset_prefix_cache()
        self.assertEqual(hit.stats.external_tokens, 2 * BS)
        self.assertFalse(any(isinstance(ev, AllBlocksCleared) for ev in e.events))
        d0.stop()
        shutil.rmtree(os.path.join(d0.root, "pool"))
        shutil.rmtree(os.path.join(d0.root, "state"))
        os.makedirs(os.path.join(d0.root, "pool"))
        os.makedirs(os.path.join(d0.root, "state"))
        d0.start()
        self.pump_events(e, lambda evs: any(isinstance(ev, AllBlocksCleared) for ev in evs))
        clears = [ev for ev in e.events if isinstance(ev, AllBlocksCleared)]
        self.assertEqual(len(clears), 1, "the wiped pool's clear only, none for the restart")


if __name__ == "__main__":
    unittest.main()

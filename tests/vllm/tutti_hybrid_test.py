"""TuttiConnector with hybrid models (several KV cache groups, vLLM's hybrid KV cache manager)
driven by the fake vLLM engine in host mode against a real tuttid:

- full-attention and sliding-window groups (layers alternate; each group its own block table,
  the sliding group's blocks outside the window freed to the null block): store, then load in a
  fresh engine; the toy model checks every KV value each layer reads (its whole context for a
  full layer, its window for a sliding one) against the direct computation;
- a hit cut down to what the sliding group can serve (its blocks past the cut evicted);
- a restart of tuttid keeps the hits of every group;
- a Mamba (state-space) group refused when the engine starts, with a message naming it.
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "stub"), HERE]

from vllm.config import KVTransferConfig  # noqa: E402

from tutti.testing import Tuttid  # noqa: E402

from fakevllm.engine import Engine, EngineConfig  # noqa: E402
from fakevllm.executor import WorkerError  # noqa: E402
from tutti_connector_test import (BS, HEAD_SIZE, HEADS, OBJECT_BYTES, prompt,  # noqa: E402
                                  tuttictl, wait_blocks)

LAYERS = 2                          # per group
WINDOW = 32                         # tokens: the sliding group needs 2 blocks before a cut
HYBRID = (("sliding", WINDOW), ("full",))


class TuttiHybridTest(unittest.TestCase):
    def setUp(self):
        self.daemons, self.engines = [], []

    def tearDown(self):
        for e in self.engines:
            e.shutdown()
        for d in self.daemons:
            d.cleanup()

    def start_daemon(self):
        d = Tuttid(object_bytes=OBJECT_BYTES, max_objects=2 * LAYERS,
                   session_ttl_ms=5000).start()
        self.daemons.append(d)
        return d

    def engine(self, kv_groups=HYBRID, extra=None, **kw):
        cfg = {"sockets": [self.daemons[-1].socket], "lookup_timeout_ms": 5000}
        cfg.update(extra or {})
        ktc = KVTransferConfig(kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm",
                               kv_role="kv_both", kv_connector_extra_config=cfg)
        shape = dict(num_layers=LAYERS, num_kv_heads=HEADS, head_size=HEAD_SIZE,
                     num_gpu_blocks=64)
        shape.update(kw)
        e = Engine(EngineConfig(kv_transfer_config=ktc, block_size=BS, register_host_memory=True,
                                host=True, step_timeout=30.0, kv_groups=kv_groups, **shape))
        self.engines.append(e)
        return e

    def done(self, e):
        self.engines.remove(e)
        e.shutdown()

    def assertGood(self, r):
        self.assertTrue(r.verified, r)
        self.assertTrue(r.correct, r)
        self.assertFalse(r.reported_bad_blocks, r)

    def namespaces(self, daemon):
        return {ns["model_id"]: ns["blocks_ssd"]
                for ns in tuttictl(daemon, "stats").get("namespaces", [])}

    def test_store_then_load_every_group_in_a_fresh_engine(self):
        d = self.start_daemon()
        for n, (seed, save) in enumerate(((1, "end"), (2, "layer"))):
            with self.subTest(save=save):
                p = prompt(seed, 6)
                e = self.engine(extra={"save": save})
                first = e.generate([("a", p, 3)])["a"]
                self.assertGood(first)
                self.assertEqual(first.stats.external_tokens, 0)
                self.done(e)
                wait_blocks(d, 12 * (n + 1))  # 6 blocks in each of the 2 groups' namespaces
                e = self.engine(extra={"save": save})
                second = e.generate([("b", p, 3)])["b"]
                self.assertGood(second)
                self.assertEqual(second.stats.external_tokens, 6 * BS)
                self.assertEqual(second.stats.computed_tokens, len(p) - 6 * BS + 2)
                self.assertEqual(second.output_token_ids, first.output_token_ids)
                self.done(e)
        ids = self.namespaces(d)
        self.assertEqual(len(ids), 2, ids)
        self.assertTrue(any("|group=0/2:sliding_window=%d" % WINDOW in m for m in ids), ids)
        self.assertTrue(any("|group=1/2:full" in m for m in ids), ids)

    def test_loads_of_each_group(self):
        """The step's LoadSpecs: the full group every block past the GPU prefix, the sliding
        group the window before the cut, each with that group's block ids (none null)."""
        self.start_daemon()
        p = prompt(3, 8)
        e = self.engine()
        self.assertGood(e.generate([("a", p, 2)])["a"])
        self.done(e)
        wait_blocks(self.daemons[0], 16)
        e = self.engine()
        seen = []

        def grab(so):
            seen.extend(so.kv_connector_metadata.loads)
        r = e.generate([("b", p, 2)], before_execute=grab)["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, 8 * BS)
        by_group = {}
        for spec in seen:
            by_group.setdefault(spec.group, []).extend(spec.block_ids)
        self.assertEqual(len(by_group[1]), 8)          # full: blocks 0..7
        self.assertEqual(len(by_group[0]), 2)          # sliding: blocks 6, 7
        self.assertNotIn(0, by_group[0] + by_group[1])
        self.assertFalse(set(by_group[0]) & set(by_group[1]))

    def test_a_hit_is_cut_to_what_the_sliding_group_holds(self):
        """8 blocks stored in both groups; the sliding group's namespace evicted; a 4-block
        prompt stores its blocks 0..3 again (the full group has them). A fresh engine's 8-block
        prompt then hits 8 blocks in the full group but only blocks 0..3 in the sliding group:
        the cut moves down to 4 (window [2, 4) held), not to a point the sliding group cannot
        serve."""
        d = self.start_daemon()
        p = prompt(4, 8)
        e = self.engine()
        self.assertGood(e.generate([("a", p, 2)])["a"])
        self.done(e)
        wait_blocks(d, 16)
        sliding = [m for m in self.namespaces(d) if "sliding_window" in m]
        self.assertEqual(len(sliding), 1)
        tuttictl(d, "evict", "--namespace", sliding[0])
        self.assertEqual(self.namespaces(d).get(sliding[0], 0), 0)
        e = self.engine()
        short = e.generate([("s", p[:4 * BS + 3], 2)])["s"]
        self.assertGood(short)
        self.assertEqual(short.stats.external_tokens, 0)  # the sliding group had nothing
        self.done(e)
        wait_blocks(d, 12)
        e = self.engine()
        r = e.generate([("b", p, 2)])["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, 4 * BS)
        self.assertEqual(r.stats.computed_tokens, len(p) - 4 * BS + 1)

    def test_a_restart_of_tuttid_keeps_the_hits(self):
        d = self.start_daemon()
        p = prompt(5, 5)
        e = self.engine()
        first = e.generate([("a", p, 2)])["a"]
        self.assertGood(first)
        self.done(e)
        wait_blocks(d, 10)
        d.restart()
        e = self.engine()
        r = e.generate([("b", p, 2)])["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, 5 * BS)
        self.assertEqual(r.output_token_ids, first.output_token_ids)

    def test_chunked_prefill_frees_sliding_blocks_and_stores_every_group(self):
        """A prompt prefilled in chunks of 64 tokens: the sliding group's early blocks are freed
        (and reused by another request) while the request runs; what was stored still loads
        correctly in a fresh engine."""
        d = self.start_daemon()
        p, q = prompt(6, 10), prompt(7, 6)
        e = self.engine(num_gpu_blocks=40, max_num_batched_tokens=64)
        res = e.generate([("a", p, 2), ("c", q, 2)])
        for r in res.values():
            self.assertGood(r)
        self.done(e)
        wait_blocks(d, 2 * 10 + 2 * 6)
        e = self.engine()
        r = e.generate([("b", p, 2)])["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, 10 * BS)

    def test_a_mamba_group_is_refused(self):
        self.start_daemon()
        with self.assertRaises(WorkerError) as cm:
            self.engine(kv_groups=(("full",), ("mamba",)))
        msg = str(cm.exception)
        self.assertIn("KV cache group 1 (MambaSpec", msg)
        self.assertIn("state at every block boundary", msg)


if __name__ == "__main__":
    unittest.main()

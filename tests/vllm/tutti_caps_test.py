"""A router's per-request caps (kv_transfer_params "max_load_tokens", vllm#55885, and
"max_offload_tokens") through TuttiConnector, driven by the fake vLLM engine in vLLM's call order
against a real tuttid in host mode (as tutti_connector_test.py): 0 loads nothing and the request
computes everything; a cap below the hits loads exactly its whole blocks (past the GPU prefix),
with correct KV; tuttid's load-or-recompute advice below the cap wins (a compute sample and an
SSD bandwidth prior make tuttid advise 2 of 6 hits); max_offload_tokens stores exactly the first
N tokens' whole blocks, in both save modes, decode included (looked up afterwards); bad values
are ignored with a warning naming the request and the value.

TUTTI_HARNESS_DEVICE=cuda:0 (the GPU machine): the same in cuda mode.
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "stub"), HERE]

import tutti  # noqa: E402
from tutti.vllm.keys import request_keys  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import tutti_connector_test as base  # noqa: E402  (not its class: unittest would run it here)
from tutti_connector_test import BS, DEVICE, OBJECT_BYTES, prompt  # noqa: E402
from tutti_connector_test import blocks_on_ssd, leases_held, wait_blocks  # noqa: E402


def params(**caps):
    return {"kv_transfer_params": caps}


class Specs:
    """A before_execute hook: the keys of every LoadSpec and SaveSpec the workers got, per
    request (the workers retrieve and store exactly those)."""

    def __init__(self):
        self.loads, self.saves = {}, {}

    def __call__(self, so):
        meta = so.kv_connector_metadata
        for spec in meta.loads:
            self.loads.setdefault(spec.req_id, []).extend(spec.keys)
        for spec in meta.saves:
            self.saves.setdefault(spec.req_id, []).extend(spec.keys)


def keys_of(tokens, n):
    return request_keys(Request("keys", tokens), BS, n)


class RouterCapsTest(unittest.TestCase):
    setUp = base.TuttiConnectorTest.setUp
    tearDown = base.TuttiConnectorTest.tearDown
    start_daemons = base.TuttiConnectorTest.start_daemons
    engine = base.TuttiConnectorTest.engine
    assertGood = base.TuttiConnectorTest.assertGood

    def stored(self, p, n, max_tokens=3):
        """Stores p's first n blocks from an engine of its own; returns its result."""
        first = self.engine().generate([("stored", p, max_tokens)])["stored"]
        self.assertGood(first)
        self.engines.pop().shutdown()
        wait_blocks(self.daemons[0], n)
        return first

    def lookup_client(self, e):
        return e.connector._sched._links[0].attached_client()

    def test_max_load_tokens_zero_loads_nothing(self):
        (d0,) = self.start_daemons(1)
        p = prompt(40, 4)
        first = self.stored(p, 4)
        e = self.engine()
        specs = Specs()
        r = e.generate([("b", p, 3, params(max_load_tokens=0))], before_execute=specs)["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, 0)
        self.assertEqual(r.stats.computed_tokens, len(p) + 2, "the whole prompt computed")
        self.assertEqual(r.output_token_ids, first.output_token_ids)
        self.assertNotIn("b", specs.loads)
        self.assertEqual(leases_held(d0), 0)
        e.reset_prefix_cache()
        plain = e.generate([("c", p, 3)])["c"]  # the blocks were there: the cap kept them out
        self.assertGood(plain)
        self.assertEqual(plain.stats.external_tokens, 4 * BS)

    def test_max_load_tokens_below_the_hits_caps_the_load(self):
        (d0,) = self.start_daemons(1)
        p = prompt(41, 6)
        first = self.stored(p, 6)
        e = self.engine()
        specs = Specs()
        cap = 2 * BS + 5  # whole blocks: 2
        r = e.generate([("b", p, 3, params(max_load_tokens=cap))], before_execute=specs)["b"]
        self.assertGood(r)  # the 2 loaded blocks' KV read and checked by the toy model
        self.assertEqual(r.stats.external_tokens, 2 * BS)
        self.assertEqual(r.stats.computed_tokens, len(p) - 2 * BS + 2)
        self.assertEqual(r.output_token_ids, first.output_token_ids)
        self.assertEqual(specs.loads["b"], keys_of(p, 2), "exactly the first 2 blocks retrieved")
        self.assertEqual(leases_held(d0), 0, "the pins of blocks 2-5 ended with the Retrieve")
        # the cap counts past the GPU prefix: 2 blocks on the GPU, 2 more loaded
        e.reset_prefix_cache()
        self.assertGood(e.generate([("gpu", p[:2 * BS] + [1], 1)])["gpu"])
        r = e.generate([("c", p, 3, params(max_load_tokens=2 * BS))], before_execute=specs)["c"]
        self.assertGood(r)
        self.assertEqual(r.stats.local_hit_tokens, 2 * BS)
        self.assertEqual(r.stats.external_tokens, 2 * BS)
        self.assertEqual(r.stats.computed_tokens, len(p) - 4 * BS + 2)
        self.assertEqual(specs.loads["c"], keys_of(p, 4)[2:])
        self.assertEqual(r.output_token_ids, first.output_token_ids)
        self.assertEqual(leases_held(d0), 0)

    def test_advice_below_the_cap_wins(self):
        # One compute sample of c ms per token and layer, and an SSD prior at which a block's
        # layer loads in L = 34.5 c ms: for a 101-token prompt with 6 hits, TTFT(k) over 4
        # layers is 404 c - 29.5 c k up to k = 2 (load <= compute), 101 c + 122 c k past it:
        # tuttid advises 2 (docs/decision.md, the formula; 345 c against 404 c recomputing).
        prior = 1e7
        extra = "datapath { ssd_read_prior_bytes_per_sec: %r }" % prior
        if DEVICE:
            extra += ' gpu { mode: "cuda" }'
        (d0,) = self.start_daemons(1, extra=extra)
        p = prompt(42, 6)
        self.assertEqual(len(p), 101)
        first = self.stored(p, 6)
        e = self.engine()
        load_ms = OBJECT_BYTES / prior * 1e3
        c = load_ms / 34.5
        # Three prefills of each kind (with and without a cached prefix), all c ms a token: the
        # model fits both kinds exactly, so it is sure of its compute either way and loading wins
        # beyond its uncertainty (docs/decision.md, "Robust advice"; with fewer than three of a
        # kind it predicts that kind less surely and would recompute).
        self.lookup_client(e).report_compute(
            [tutti.ComputeSample(n, ctx, n * c) for n, ctx in
             ((100, 100), (50, 50), (80, 80), (68, 100), (36, 68), (52, 100))])
        specs = Specs()
        for name, caps, want in (("plain", {}, 2), ("cap4", dict(max_load_tokens=4 * BS), 2),
                                 ("cap1", dict(max_load_tokens=BS), 1),
                                 ("cap0", dict(max_load_tokens=0), 0)):
            with self.subTest(name):
                e.reset_prefix_cache()
                r = e.generate([(name, p, 3, params(**caps))], before_execute=specs)[name]
                self.assertGood(r)
                self.assertEqual(r.stats.external_tokens, want * BS)
                self.assertEqual(r.stats.computed_tokens, len(p) - want * BS + 2)
                self.assertEqual(specs.loads.get(name, []), keys_of(p, want))
                self.assertEqual(r.output_token_ids, first.output_token_ids)
                self.assertEqual(leases_held(d0), 0)

    def test_max_offload_tokens_stores_the_first_n_tokens_blocks(self):
        # 69 prompt tokens + 19 decoded = 88: 5 full blocks (decode completes block 4). With
        # max_offload_tokens 3 * BS + 7 only blocks 0-2 are stored, in either save mode.
        for seed, save in ((50, "end"), (51, "layer")):
            with self.subTest(save=save):
                (d0,) = self.start_daemons(1)
                p = prompt(seed, 4)
                e = self.engine(extra={"save": save})
                specs = Specs()
                out = e.generate([("a", p, 20, params(max_offload_tokens=3 * BS + 7)),
                                  ("z", prompt(seed + 100, 4), 20, params(max_offload_tokens=0))],
                                 before_execute=specs)
                for r in out.values():
                    self.assertGood(r)
                whole = p + out["a"].output_token_ids
                self.assertEqual(len(whole) // BS, 5)
                self.assertEqual(specs.saves["a"], keys_of(whole, 3))
                self.assertNotIn("z", specs.saves, "max_offload_tokens 0: nothing stored")
                self.engines.pop().shutdown()
                wait_blocks(d0, 3)
                self.assertEqual(blocks_on_ssd(d0), 3)
                # looked up afterwards: blocks 0-2 there, 3 and 4 (and z's) each absent
                e = self.engine(extra={"save": save})
                client = self.lookup_client(e)
                keys = keys_of(whole, 5)
                lease = client.lookup(keys)
                self.assertEqual(lease.hits, 3)
                client.release(lease)
                for k in keys[3:] + keys_of(prompt(seed + 100, 4), 1):
                    self.assertEqual(client.lookup([k]).hits, 0)
                r = e.generate([("b", p, 2)])["b"]
                self.assertGood(r)
                self.assertEqual(r.stats.external_tokens, 3 * BS)
                self.engines.pop().shutdown()
                self.daemons.pop().cleanup()

    def test_bad_values_are_ignored_with_a_warning(self):
        (d0,) = self.start_daemons(1)
        p = prompt(43, 3)
        e = self.engine()
        specs = Specs()
        with self.assertLogs("tutti.vllm", "WARNING") as cm:
            a = e.generate([("bad-a", p, 2, params(max_load_tokens=-1,
                                                   max_offload_tokens="16"))],
                           before_execute=specs)["bad-a"]
        self.assertGood(a)
        self.assertEqual(specs.saves["bad-a"], keys_of(p, 3), "the bad offload cap ignored")
        wait_blocks(d0, 3)
        bad = [(-1, "max_load_tokens"), ("16", "max_offload_tokens")]  # bad-a's
        for value, name in (True, "max_load_tokens"), (2.5, "max_load_tokens"):
            e.reset_prefix_cache()
            with self.assertLogs("tutti.vllm", "WARNING") as more:
                rid = "bad-%r" % (value,)
                r = e.generate([(rid, p, 2, params(**{name: value}))])[rid]
            self.assertGood(r)
            self.assertEqual(r.stats.external_tokens, 3 * BS, "the bad load cap ignored")
            cm.output.extend(more.output)
            bad.append((value, name))
        rids = ["bad-a", "bad-a", "bad-True", "bad-2.5"]
        lines = [ln for ln in cm.output if "kv_transfer_params" in ln]
        self.assertEqual(len(lines), len(bad), cm.output)  # once per request and value
        for line, rid, (value, name) in zip(lines, rids, bad):
            self.assertIn("request %s:" % rid, line)
            self.assertIn("%s = %r" % (name, value), line)
        self.assertEqual(leases_held(d0), 0)


if __name__ == "__main__":
    unittest.main()

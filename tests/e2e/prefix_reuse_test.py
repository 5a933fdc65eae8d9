"""Prefix reuse through tuttid, end to end, in host mode on the CPU (CI).

A small Llama-architecture model (4 layers, GQA with 16 query / 8 KV heads, head dim 128, float32,
random weights) with its KV cache in vLLM-style paged blocks in shared memory, attached to a real
tuttid. Request A computes a prompt and stores its full blocks. Request B = A's prompt + a new
suffix: it loads the prefix from tuttid layer by layer into *different* blocks (A's blocks are
poisoned with NaN when freed), computes only the suffix, and its logits must match a full
recomputation of B. Also: tuttid restarted between A and B; a prefix only partly cached; tuttid
killed while B loads (B recomputes and is still right); B with the load-or-recompute decision
(docs/decision.md) at SSD priors that make tuttid advise loading nothing, everything and an
interior split (each must match the full recompute); and a negative control (a prefix of the
wrong tokens' KV fails the comparison), which shows the tolerance would catch a wrong load.

Tolerance (float32): max |logit_B(loaded) - logit_B(full)| <= 1e-4 * max(1, max |logit|).
Both paths do the same float32 arithmetic on the same values except that the prefix's K/V come
from request A's matmuls (a different batch shape, so a different summation order) and the
attention runs over a different query block: differences are a few float32 ulps accumulated over
4 layers (measured up to 5e-7 on the CI CPU with OpenBLAS); a wrong or stale block
changes logits by O(1) (the negative control measures about 0.5).
"""

import os
import random
import sys
import unittest

import torch

import tutti
from tutti.testing import Tuttid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine import Engine  # noqa: E402
from llama import LlamaShape, PagedLlama, random_weights  # noqa: E402

SHAPE = LlamaShape()  # 4 layers, hidden 512, 16 heads / 8 KV heads x 128, vocab 1024
BLOCK = 16
NUM_BLOCKS = 160
RTOL = 1e-4


def max_rel_err(a, b):
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


class PrefixReuseTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.model = PagedLlama(SHAPE, random_weights(SHAPE, seed=1), BLOCK)
        cls.layout = tutti.KvLayout(num_layers=SHAPE.layers, kv_heads=SHAPE.kv_heads,
                                    head_dim=SHAPE.head_dim, dtype_bytes=4, block_tokens=BLOCK)
        cls.ns = tutti.Namespace(model_id="e2e-llama-tiny-seed1", layout=cls.layout)
        # A reference engine without tuttid, for full recomputations.
        cls.reference = Engine(cls.model, cls.model.new_cache(NUM_BLOCKS))
        cls.full_logits = {}

    def setUp(self):
        self.daemon = Tuttid(object_bytes=self.layout.object_bytes,
                             max_objects=2 * SHAPE.layers, session_ttl_ms=2000).start()
        self.shm = tutti.SharedMemory(tutti.cache_bytes(self.layout, NUM_BLOCKS), "tutti-e2e")
        self.cache, per_layer = tutti.host_cache_tensor(self.layout, NUM_BLOCKS, torch.float32,
                                                        self.shm)
        self.client = tutti.Client.attach(
            self.ns, NUM_BLOCKS, tutti.objects_from_tensors(self.layout, per_layer),
            host_regions=[self.shm.region()], socket_path=self.daemon.socket,
            engine_id="e2e-prefix-reuse")
        self.engine = Engine(self.model, self.cache, self.client)
        self.rng = random.Random(self.id())
        self.prompt_a = self.tokens(200)  # 12 blocks + 8 tokens
        self.prompt_b = self.prompt_a + self.tokens(56)

    def tokens(self, n):
        return [self.rng.randrange(SHAPE.vocab) for _ in range(n)]

    def tearDown(self):
        self.client.detach()
        del self.engine, self.cache
        self.shm.close()
        self.daemon.cleanup()

    def full(self, tokens):
        """Logits of a full recomputation (memoized: the CPU is slow)."""
        key = tuple(tokens)
        if key not in self.full_logits:
            self.full_logits[key] = self.reference.prefill(tokens, use_cache=False).logits
        return self.full_logits[key]

    def assert_matches_full(self, result, tokens):
        ref = self.full(tokens)[len(tokens) - result.logits.shape[0]:]
        err = max_rel_err(result.logits, ref)
        print("%s: hits %d, computed %d tokens, max rel err %.2e" % (
            self._testMethodName, result.hits, result.computed_tokens, err))
        self.assertTrue(torch.isfinite(result.logits).all(), "a poisoned block was read")
        self.assertLessEqual(err, RTOL)

    def await_reattached(self, generation):
        import time
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            info = self.client.info
            if info["attached"] and info["generation"] >= generation:
                return
            time.sleep(0.02)
        self.fail("no re-attach:\n" + self.daemon.log_tail())

    def test_prefix_loaded_from_tuttid_matches_full_recompute(self):
        a = self.engine.prefill(self.prompt_a)
        self.assertEqual(a.hits, 0)
        self.assertEqual(a.stored, ["durable"] * 12)
        self.assert_matches_full(a, self.prompt_a)
        b = self.engine.prefill(self.prompt_b, keep_blocks=True)
        self.assertEqual(b.hits, 12)
        self.assertEqual(b.computed_tokens, 256 - 192)
        self.assertFalse(b.recomputed)
        self.assertTrue(set(b.block_table).isdisjoint(a.block_table), "B must use other blocks")
        self.assert_matches_full(b, self.prompt_b)
        # The loaded blocks hold exactly the K/V request A computed.
        ref = Engine(self.model, self.model.new_cache(32), poison=False)
        r = ref.prefill(self.prompt_a, use_cache=False, keep_blocks=True)
        for i in range(12):
            self.assertTrue(torch.equal(self.cache[:, :, b.block_table[i]],
                                        ref.cache[:, :, r.block_table[i]]), "block %d" % i)
        self.engine.free(b.block_table)
        self.assertEqual(b.stored, ["durable"] * 4)  # B's own 4 new full blocks

    def test_after_tuttid_restart(self):
        self.engine.prefill(self.prompt_a)
        self.assertEqual(self.daemon.stop(), 0)
        self.daemon.start()
        self.await_reattached(2)
        b = self.engine.prefill(self.prompt_b)
        self.assertEqual(b.hits, 12)
        self.assert_matches_full(b, self.prompt_b)

    def test_partly_cached_prefix(self):
        a = self.engine.prefill(self.prompt_a, store_limit=5)
        self.assertEqual(a.stored, ["durable"] * 5)
        b = self.engine.prefill(self.prompt_b)
        self.assertEqual(b.hits, 5)
        self.assertEqual(b.computed_tokens, 256 - 80)
        self.assert_matches_full(b, self.prompt_b)

    def test_tuttid_killed_while_b_loads(self):
        # A longer prompt (63 full blocks, 31 MiB), so that the kill lands while B loads.
        prompt_a = self.tokens(1010)
        prompt_b = prompt_a + self.tokens(40)
        self.assertEqual(len(self.engine.prefill(prompt_a).stored), 63)

        def kill_at_layer0(layer):
            if layer == 0:
                self.daemon.kill()

        b = self.engine.prefill(prompt_b, hook=kill_at_layer0, store=False)
        print("killed mid-load: recomputed=%s failed=%d" % (b.recomputed, len(b.failed)))
        if b.recomputed:
            self.assertEqual(b.hits, 0)
            self.assertEqual(b.failed, list(range(63)))
        self.assert_matches_full(b, prompt_b)
        self.daemon.start()
        self.await_reattached(2)
        again = self.engine.prefill(prompt_b, store=False)
        self.assertEqual(again.hits, 63)  # stored durably before the kill
        self.assert_matches_full(again, prompt_b)

    def restart_with(self, extra):
        generation = self.client.info["generation"]
        self.assertEqual(self.daemon.stop(), 0)
        self.daemon.write_config(extra=extra)
        self.daemon.start()
        self.await_reattached(generation + 1)

    def test_decided_split_matches_full_recompute_whatever_the_split(self):
        # The model restarts empty with tuttid: A's report (200 new tokens, no prefix) is its one
        # sample, so it predicts c ms per new token and layer, c = A's mean layer time / 200.
        # One block's layer is 128 KiB: at a prior of 128 KiB / (16 c) per ms a block loads in
        # the time 16 tokens compute, and with 4 layers TTFT(k) = 1024 c - 48 c k up to k = 8
        # (load <= compute), 256 c + 48 c k beyond: the best split is 8 of the 12 hits.
        object_layer = 2 * self.layout.object_bytes
        for name in ("recompute", "load all", "interior"):
            prompt_a = self.tokens(200)
            prompt_b = prompt_a + self.tokens(56)
            prior = {"recompute": 1e6, "load all": 1e13}.get(name, 1e13)
            self.restart_with("datapath { ssd_read_prior_bytes_per_sec: %r }" % prior)
            a = self.engine.prefill(prompt_a)
            self.assertEqual(a.computed_tokens, 200)
            self.assertEqual(len(a.layer_ms), SHAPE.layers)
            if name == "interior":
                c = sum(a.layer_ms) / len(a.layer_ms) / a.computed_tokens
                prior = object_layer / (16 * c) * 1e3
                self.restart_with("datapath { ssd_read_prior_bytes_per_sec: %r }" % prior)
                self.client.report_compute([tutti.ComputeSample(  # A's sample again, exactly
                    a.computed_tokens, len(prompt_a), c * a.computed_tokens, a.overhead_ms)])
            b = self.engine.prefill(prompt_b, decide=True)
            print("decision %s (prior %.3g B/s): load %d of %d hits, predicted %.1f ms "
                  "(recompute %.1f, load all %.1f), measured %.1f ms, error %.2f" % (
                      name, prior, b.hits, b.cached, b.predicted_ttft_ms,
                      b.predicted_recompute_ms, b.predicted_load_all_ms, b.ttft_ms,
                      b.prediction_error))
            self.assertEqual(b.cached, 12)
            self.assertLessEqual(b.hits, b.cached)
            self.assertEqual(b.hits, {"recompute": 0, "load all": 12, "interior": 8}[name])
            self.assertEqual(b.computed_tokens, 256 - 16 * b.hits)
            self.assertIsNotNone(b.decision_id)
            self.assertIsNotNone(b.prediction_error, "the measured TTFT reached its decision")
            self.assertLessEqual(b.predicted_ttft_ms,
                                 min(b.predicted_recompute_ms, b.predicted_load_all_ms))
            self.assert_matches_full(b, prompt_b)

    def test_negative_control_wrong_prefix_is_caught(self):
        # Store the KV of *other* tokens under B's prefix keys: the comparison must fail.
        other = [(t + 1) % SHAPE.vocab for t in self.prompt_a]
        o = self.engine.prefill(other, store=False, keep_blocks=True)
        keys = tutti.chain_keys(self.prompt_a, BLOCK)
        self.assertEqual(self.client.store(keys, o.block_table[:12], wait_durable=True),
                         ["durable"] * 12)
        self.engine.free(o.block_table)
        b = self.engine.prefill(self.prompt_b, store=False)
        self.assertEqual(b.hits, 12)
        ref = self.full(self.prompt_b)[192:]
        err = max_rel_err(b.logits, ref)
        print("negative control: max rel err %.2e (tolerance %.0e)" % (err, RTOL))
        self.assertGreater(err, 100 * RTOL)


if __name__ == "__main__":
    unittest.main(verbosity=2)

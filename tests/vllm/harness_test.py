"""The fake vLLM engine proven with the reference connector (fakevllm.dir_connector) in host
mode: misses then hits with verified bytes, GPU prefix hits before the connector's, partial hits,
chunked prefill, preemption and resumed requests, a failed load recomputed from its first failed
block, a silently wrong load caught, TP=2 (a hit needs every rank's copy; one rank's failure),
the physical orders of the cross-layer cache, and the order of vLLM's connector calls.
"""

import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "stub"), HERE]

from vllm.config import KVTransferConfig  # noqa: E402

import torch  # noqa: E402

from fakevllm import dir_connector  # noqa: E402
from fakevllm.engine import Engine, EngineConfig  # noqa: E402
from fakevllm.kv_cache import CacheGeometry, KvCache, layer_name  # noqa: E402

BS = 16


def prompt(seed, blocks, tail=5):
    return [seed * 1000 + i for i in range(blocks * BS + tail)]


class KvCacheTest(unittest.TestCase):
    def geometry(self, order):
        return CacheGeometry(num_layers=3, num_blocks=5, num_kv_heads=2, block_size=4,
                             head_size=8, dtype=torch.float32, order=order)

    def test_per_layer_views_have_the_physical_order_strides(self):
        C, N, H, B = 16, 4, 2, 5
        want = {"LBNHC": (N * H * C, C, H * C, 1), "LBHNC": (H * N * C, N * C, C, 1),
                "BLNHC": (3 * N * H * C, C, H * C, 1), "LHBNC": (N * C, B * N * C, C, 1)}
        for order, strides in want.items():
            with self.subTest(order=order):
                cache = KvCache(self.geometry(order), host=True)
                views = cache.layers
                self.assertEqual(list(views), [layer_name(i) for i in range(3)])
                v = views[layer_name(1)]
                self.assertEqual(tuple(v.shape), (B, H, N, C))
                self.assertEqual(v.stride(), strides)
                offset = 4 * cache.tensor[1].storage_offset()
                self.assertEqual(v.data_ptr(), cache.shm.address + offset)
                v[2, 1, 3, 5] = 42.0  # the view writes the shared memory
                flat = torch.frombuffer(cache.shm.buffer, dtype=torch.float32)
                self.assertEqual(int((flat == 42.0).sum()), 1)
                del v, views, flat
                cache.close()

    def test_orders_must_be_permutations(self):
        with self.assertRaises(ValueError):
            KvCache(self.geometry("LBNHH"), host=False)


class DirConnectorHarnessTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="fakevllm-dir-", dir=os.environ.get("TEST_TMPDIR"))
        self.engines = []

    def tearDown(self):
        for e in self.engines:
            e.shutdown()

    def engine(self, extra=None, **kw):
        cfg = {"root": self.root}
        cfg.update(extra or {})
        ktc = KVTransferConfig(kv_connector="DirConnector",
                               kv_connector_module_path="fakevllm.dir_connector",
                               kv_role="kv_both", kv_connector_extra_config=cfg)
        e = Engine(EngineConfig(kv_transfer_config=ktc, **kw))
        self.engines.append(e)
        return e

    def assertGood(self, result):
        self.assertTrue(result.verified, result)
        self.assertTrue(result.correct, result)

    def test_miss_then_hit_after_the_gpu_cache_is_gone(self):
        e = self.engine()
        p = prompt(1, 3)
        first = e.generate([("a", p, 4)])["a"]
        self.assertGood(first)
        self.assertEqual((first.stats.external_tokens, first.stats.local_hit_tokens), (0, 0))
        e.reset_prefix_cache(poison=True)
        second = e.generate([("b", p, 4)])["b"]
        self.assertGood(second)
        self.assertEqual(second.stats.external_tokens, 3 * BS)
        self.assertEqual(second.stats.computed_tokens, len(p) - 3 * BS + 3)
        self.assertEqual(second.output_token_ids, first.output_token_ids)

    def test_gpu_prefix_hit_is_passed_to_the_connector(self):
        e = self.engine()
        e.generate([("a", prompt(2, 2), 2)])
        shared = prompt(2, 2, tail=0) + prompt(3, 1)
        r = e.generate([("b", shared, 2)])["b"]
        self.assertGood(r)
        self.assertEqual((r.stats.local_hit_tokens, r.stats.external_tokens), (2 * BS, 0))

    def test_partial_hit_and_a_prompt_of_whole_blocks(self):
        e = self.engine()
        e.generate([("a", prompt(4, 4, tail=0), 1)])
        e.reset_prefix_cache()
        partial = prompt(4, 2, tail=0) + prompt(5, 2)
        whole = prompt(4, 4, tail=0)  # the last token is always computed: 3 blocks at most
        out = e.generate([("b", partial, 3), ("c", whole, 3)])
        self.assertGood(out["b"])
        self.assertGood(out["c"])
        self.assertEqual(out["b"].stats.external_tokens, 2 * BS)
        self.assertEqual(out["c"].stats.external_tokens + out["c"].stats.local_hit_tokens,
                         3 * BS)

    def test_chunked_prefill_saves_as_chunks_complete_blocks(self):
        e = self.engine(max_num_batched_tokens=24)
        p = prompt(6, 5)
        r = e.generate([("a", p, 3)])["a"]
        self.assertGood(r)
        prefill_steps = -(-len(p) // 24)
        # + 2 decode steps + 1 step that only tells the workers the request finished (vLLM steps
        # while Scheduler.finished_req_ids is not empty)
        self.assertEqual(len(e.step_reports), prefill_steps + 3)
        stored = [ev.block_hashes[0] for ev in e.events]
        self.assertEqual(len(stored), 5)
        self.assertEqual(len(set(stored)), 5)
        e.reset_prefix_cache()
        again = e.generate([("b", p, 3)])["b"]
        self.assertGood(again)
        self.assertEqual(again.stats.external_tokens, 5 * BS)

    def test_preemption_and_resumed_requests(self):
        # 3 requests of 4-5 blocks each in 11 usable blocks: the newest is preempted.
        e = self.engine(num_gpu_blocks=12, max_num_batched_tokens=256)
        reqs = [("r%d" % i, prompt(10 + i, 3, tail=10), 24) for i in range(3)]
        out = e.generate(reqs)
        for r in out.values():
            self.assertGood(r)
        self.assertGreater(sum(r.stats.preemptions for r in out.values()), 0)
        resumed = [r for r in out.values() if r.stats.preemptions]
        self.assertTrue(any(r.stats.external_tokens + r.stats.local_hit_tokens > 0
                            for r in resumed), [r.stats for r in resumed])

    def test_lookups_repeat_while_a_request_waits_for_blocks(self):
        e = self.engine(num_gpu_blocks=8, max_num_batched_tokens=128)
        p = prompt(15, 3)
        e.generate([("a", p, 2)])
        e.reset_prefix_cache()
        # "long" takes 6 of the 7 usable blocks for its 8 steps; "b" (4 blocks) waits.
        out = e.generate([("long", prompt(16, 5), 8), ("b", p, 2)])
        self.assertGood(out["long"])
        self.assertGood(out["b"])
        self.assertEqual(out["b"].stats.external_tokens, 3 * BS)
        lookups = sum(calls.count("get_num_new_matched_tokens") for calls in e.scheduler_calls)
        allocs = sum(calls.count("update_state_after_alloc") for calls in e.scheduler_calls)
        self.assertGreater(lookups, allocs + 3, "b is looked up again on every step it waits")

    def test_failed_load_is_recomputed_from_the_first_failed_block(self):
        e = self.engine(extra={"fail_loads": {"b": [1]}})
        p = prompt(20, 3)
        e.generate([("a", p, 4)])
        e.reset_prefix_cache()
        r = e.generate([("b", p, 4)])["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.failed_load_tokens, 2 * BS)
        self.assertEqual(r.stats.external_tokens, 1 * BS)
        self.assertEqual(len(r.reported_bad_blocks[0]), 1, "block 1 read wrong, reported")
        e.reset_prefix_cache()
        clean = e.generate([("c", p, 4)])["c"]  # injected once: loads cleanly now
        self.assertGood(clean)
        self.assertEqual(clean.stats.external_tokens, 3 * BS)

    def test_a_silently_wrong_load_is_caught(self):
        e = self.engine(extra={"corrupt_loads": {"b": [2]}})
        p = prompt(21, 3)
        e.generate([("a", p, 2)])
        e.reset_prefix_cache()
        r = e.generate([("b", p, 2)])["b"]
        self.assertFalse(r.verified)
        self.assertFalse(r.correct)
        self.assertEqual(len(set(r.unreported_bad_blocks[0])), 2,
                         "block 2, and the tail block computed over it")

    def test_tp2_hits_need_every_rank(self):
        e = self.engine(tp_size=2)
        p = prompt(30, 4)
        first = e.generate([("a", p, 2)])["a"]
        self.assertGood(first)
        h = e.scheduler.requests.get("a")  # finished: gone from the scheduler
        self.assertIsNone(h)
        hashes = [ev.block_hashes[0] for ev in e.events]
        self.assertEqual(len(hashes), 4)
        self.assertTrue(dir_connector.evict(self.root, 1, hashes[2]))
        e.reset_prefix_cache()
        r = e.generate([("b", p, 2)])["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.external_tokens, 2 * BS)
        self.assertEqual(r.output_token_ids, first.output_token_ids)

    def test_tp2_one_rank_fails_its_load(self):
        e = self.engine(tp_size=2, extra={"fail_loads": {"b": [0]}, "fail_ranks": [1]})
        p = prompt(31, 2)
        e.generate([("a", p, 2)])
        e.reset_prefix_cache()
        r = e.generate([("b", p, 2)])["b"]
        self.assertGood(r)
        self.assertEqual(r.stats.failed_load_tokens, 2 * BS)
        self.assertEqual(list(r.reported_bad_blocks), [1])

    def test_physical_orders(self):
        for order in ("LBHNC", "BLNHC", "LHBNC"):
            with self.subTest(order=order):
                e = self.engine(order=order)
                p = prompt(40 + len(self.engines), 2)
                e.generate([("a", p, 2)])
                e.reset_prefix_cache()
                r = e.generate([("b", p, 2)])["b"]
                self.assertGood(r)
                self.assertEqual(r.stats.external_tokens, 2 * BS)

    def test_connector_calls_follow_vllm(self):
        e = self.engine(num_layers=2)
        e.generate([("a", prompt(50, 1), 2)])
        layer = ["wait_for_layer_load", "save_kv_layer"]
        worker_step = (["bind_connector_metadata", "start_load_kv"] + layer * 2 +
                       ["wait_for_save", "get_finished",
                        "get_block_ids_with_load_errors", "get_kv_connector_stats",
                        "get_kv_connector_kv_cache_events", "clear_connector_metadata"])
        no_forward = [c for c in worker_step if c not in layer]
        # The last step only announces the finished request: no forward (vLLM's
        # kv_connector_no_forward), so no per-layer calls.
        for reports in e.step_reports[:-1]:
            self.assertEqual(reports[0].calls, worker_step)
        self.assertEqual(e.step_reports[-1][0].calls, no_forward)
        self.assertEqual(e.scheduler_calls[0],
                         ["get_num_new_matched_tokens", "update_state_after_alloc",
                          "build_connector_meta", "update_connector_output", "take_events"])
        self.assertEqual(e.scheduler_calls[-2],
                         ["build_connector_meta", "request_finished", "update_connector_output",
                          "take_events"])
        self.assertEqual(e.scheduler_calls[-1],
                         ["build_connector_meta", "update_connector_output", "take_events"])

    def test_full_cuda_graphs_skip_the_layer_hooks(self):
        # vLLM's default cudagraph_mode replays uniform-decode batches as FULL graphs, without
        # the layer hooks, unless the connector requires PIECEWISE.
        p = prompt(51, 1)
        for piecewise in (True, False):
            with self.subTest(piecewise=piecewise):
                e = self.engine(extra={"piecewise": piecewise}, num_layers=2)
                self.assertEqual(e.cudagraph_mode,
                                 "PIECEWISE" if piecewise else "FULL_AND_PIECEWISE")
                self.assertGood(e.generate([("a", p, 3)])["a"])
                decode = e.step_reports[1][0].calls  # one token: a uniform-decode batch
                self.assertEqual("save_kv_layer" in decode, piecewise)
                self.assertEqual("wait_for_layer_load" in decode, piecewise)
                self.assertIn("wait_for_save", decode)

    def test_abort_calls_request_finished(self):
        e = self.engine()
        e.add_request("a", prompt(60, 2), 50)
        e.step()
        e.abort_request("a")
        self.assertEqual(e.scheduler.connector.calls, ["request_finished"])
        so = e.step()
        self.assertEqual(so.finished_req_ids, {"a"})


if __name__ == "__main__":
    unittest.main()

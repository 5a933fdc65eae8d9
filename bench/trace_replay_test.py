"""Tests of the trace replay (issue 23 section 1): the trace format and its blocks, the
simulation's policies on hand-made traces whose counts are worked out below, and the replay of
bench/data/mooncake_synthetic_slice.jsonl through a real tuttid (host mode), whose hits, blocks
written and evictions must equal the simulation's, every retrieved byte checked.

    run_py_test.sh bench/trace_replay_test.py   (//bench:trace_replay_test)
"""

import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import trace_format as tf  # noqa: E402
import trace_policies as tp  # noqa: E402
import trace_sim  # noqa: E402

SLICE = os.path.join(HERE, "data", "mooncake_synthetic_slice.jsonl")


def req(ts, ids, tokens=None):
    return tf.Request(ts, tokens if tokens is not None else 512 * len(ids), 1, tuple(ids))


class FormatTest(unittest.TestCase):
    def test_parse_and_errors_name_the_line(self):
        r = tf.parse_line('{"timestamp": 5, "input_length": 600, "output_length": 2, '
                          '"hash_ids": [7, 8]}', "t:1")
        self.assertEqual(r, tf.Request(5, 600, 2, (7, 8)))
        with self.assertRaisesRegex(tf.TraceError, "t:3: no 'hash_ids'"):
            tf.parse_line('{"timestamp": 5, "input_length": 600}', "t:3")
        with self.assertRaisesRegex(tf.TraceError, "t:4: input_length 2000 needs more"):
            tf.parse_line('{"timestamp": 5, "input_length": 2000, "hash_ids": [1]}', "t:4")

    def test_chain_maps_trace_blocks_to_tutti_blocks(self):
        r = req(0, [3, 4], tokens=512 + 300)
        self.assertEqual(tf.chain(r), [(3, 0), (4, 0)])
        # 128-token blocks: id 3 gives 4, id 4 only the 3 its 300 tokens reach.
        self.assertEqual(tf.chain(r, 128), [(3, 0), (3, 1), (3, 2), (3, 3), (4, 0), (4, 1),
                                            (4, 2)])
        with self.assertRaisesRegex(ValueError, "must divide 512"):
            tf.chain(r, 100)

    def test_keys_are_stable_and_distinct(self):
        self.assertEqual(tf.key_of((1, 0)).hex(), tf.key_of((1, 0)).hex())
        self.assertEqual(len(tf.key_of((1, 0))), 16)
        self.assertEqual(len({tf.key_of((i, j)) for i in range(50) for j in range(4)}), 200)

    def test_slice_is_the_documented_one(self):
        reqs = tf.read_trace(SLICE)
        self.assertEqual(len(reqs), 150)
        self.assertEqual(tf.unique_blocks(reqs, 512), 2995)


class SimTest(unittest.TestCase):
    # Capacity 3: A=[1,2] then B=[1,2,3,4] then C=[1,2,5] then A again.
    TRACE = [req(0, [1, 2]), req(1, [1, 2, 3, 4]), req(2, [1, 2, 5]), req(3, [1, 2])]

    def test_store_all_lru(self):
        c = trace_sim.simulate(self.TRACE, tp.Policy(3))
        # (cache from least to most recent) A: no hits; writes 1, 2 -> [1 2]. B: hits 1, 2;
        # writes 3 -> [1 2 3], 4 evicts 1 -> [2 3 4]. C: 1 misses, no hits; offered 1 and 5 (2
        # is cached): 1 evicts 2, 5 evicts 3 -> [4 1 5]. A: hits 1 (2 is gone) -> [4 5 1];
        # writes 2, evicting 4.
        self.assertEqual((c.blocks, c.hits, c.written, c.evicted), (11, 3, 7, 4))

    def test_second_sight_writes_on_the_second_offer(self):
        c = trace_sim.simulate(self.TRACE, tp.SecondSight(3))
        # A declines 1, 2 (first sight). B: no hits, writes 1, 2 (second sight), declines 3, 4.
        # C: hits 1, 2, declines 5. A: hits 1, 2.
        self.assertEqual((c.hits, c.written, c.declined), (4, 2, 5))

    def test_tail_first_keeps_heads(self):
        # The same trace with each request's blocks used from tail to head: C keeps the hit on
        # 1 and the last A hits both (0 + 2 + 1 + 2), against 3 with chain order.
        c = trace_sim.simulate(self.TRACE, tp.Policy(3, "tail_first"))
        self.assertEqual(c.hits, 5)

    def test_dram_front_promotes_on_the_second_sight(self):
        p = tp.DramFront(3, dram_blocks=2)
        c = trace_sim.simulate([req(0, [1, 2]), req(1, [1, 2, 3]), req(2, [1, 2, 3])], p)
        # First: 1, 2 to DRAM only. Second: hits both in DRAM (promoted: 2 SSD writes), 3 to
        # DRAM. Third: hits all three (3 promoted).
        self.assertEqual((c.hits, c.written, c.declined), (5, 3, 3))
        self.assertEqual(len(p.dram), 0)
        self.assertEqual((c.promoted, c.promoted_on_offer, c.dram_dropped), (3, 0, 0))

    def test_dram_front_drops_what_dram_cannot_hold(self):
        # DRAM of 1: A's 1 and 2 are declined, 1 never fits; B offers 1 again (the ghost: a
        # second sight, written) and hits nothing (1 is not in DRAM, 2 after it does not count).
        c = trace_sim.simulate([req(0, [1, 2]), req(1, [1, 2])], tp.DramFront(3, dram_blocks=1))
        self.assertEqual((c.hits, c.written, c.declined, c.dram_dropped), (0, 2, 2, 1))
        self.assertEqual(c.promoted_on_offer, 1)  # 2 was still in DRAM

    def test_oracle_writes_only_what_is_used_again(self):
        c = trace_sim.simulate(self.TRACE, tp.OracleReuse(3))
        self.assertEqual(c.written, 2)  # 1 and 2; 3, 4, 5 are never used again

    def test_a_store_call_never_evicts_its_own_blocks(self):
        c = trace_sim.simulate([req(0, list(range(10)))], tp.Policy(4), chunk=512)
        self.assertEqual((c.written, c.evicted), (10, 6))


class ReplayTest(unittest.TestCase):
    def test_replay_counts_equal_the_simulation(self):
        import trace_replay
        out = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "r.jsonl")
        text = io.StringIO()
        with redirect_stdout(text):
            code = trace_replay.main([SLICE, "--capacity-share", "0.3", "--wait-durable",
                                      "--verify", "--check", "--out", out])
        sys.stdout.write(text.getvalue())
        self.assertEqual(code, 0)
        import json
        with open(out) as f:
            lines = [json.loads(l) for l in f]
        head = lines[0]
        self.assertEqual(head["metric"], "trace_replay_hit_ratio_vs_sim")
        self.assertEqual(head["hits"], head["sim_hits"])
        self.assertEqual(head["written"], head["sim_written"])
        self.assertEqual(head["daemon"]["evictions"], head["sim_evicted"])
        self.assertEqual(head["daemon"]["blocks_stored"], head["written"])
        self.assertEqual(head["daemon"]["lookup_hits"], head["hits"])
        self.assertGreater(head["hits"], 0)
        self.assertGreater(head["sim_evicted"], 0)  # the pool was full: eviction was compared
        self.assertEqual(head["value"], 1.0)
        self.assertEqual(head["dropped"], 0)

    def test_second_sight_in_tuttid_equals_the_simulation(self):
        # The same slice through tuttid with pool.admission "second_sight" and a ghost of 1x the
        # capacity (small enough that the bound forgets first sights): hits, blocks written and
        # declined, and evictions equal trace_policies.SecondSight's with the same ghost.
        import json
        import trace_replay
        out = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "r.jsonl")
        unique = tf.unique_blocks(tf.read_trace(SLICE), 512)
        want = round(0.3 * unique)
        text = io.StringIO()
        with redirect_stdout(text):
            code = trace_replay.main([SLICE, "--capacity-share", "0.3", "--wait-durable",
                                      "--verify", "--check", "--admission", "second_sight",
                                      "--ghost-blocks", str(want), "--out", out])
        sys.stdout.write(text.getvalue())
        self.assertEqual(code, 0)
        with open(out) as f:
            head = json.loads(f.readline())
        self.assertEqual(head["admission"], "second_sight")
        self.assertEqual(head["hits"], head["sim_hits"])
        self.assertEqual(head["written"], head["sim_written"])
        self.assertEqual(head["declined"], head["sim_declined"])
        self.assertEqual(head["daemon"]["blocks_declined"], head["declined"])
        self.assertEqual(head["daemon"]["blocks_admitted"], head["written"])
        self.assertEqual(head["daemon"]["blocks_stored"], head["written"])
        self.assertEqual(head["daemon"]["evictions"], head["sim_evicted"])
        self.assertGreater(head["declined"], 0)
        self.assertGreater(head["hits"], 0)
        self.assertEqual(head["dropped"], 0)
        # Against store-all on the same slice (the other test): fewer blocks written.
        store_all = trace_sim.simulate(tf.read_trace(SLICE), tp.Policy(want))
        self.assertLess(head["written"], store_all.written)

    def test_dram_front_in_tuttid_equals_the_simulation(self):
        # The slice through tuttid with pool.admission "dram_front", a DRAM tier of 10% of the
        # capacity and a ghost of 4x (trace_sim's dram10_front): hits, blocks stored (at Stores and
        # promoted by Lookup hits), blocks kept in DRAM, promoted and dropped, and SSD evictions
        # equal trace_policies.DramFront's.
        import json
        import trace_replay
        out = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "r.jsonl")
        text = io.StringIO()
        with redirect_stdout(text):
            code = trace_replay.main([SLICE, "--capacity-share", "0.3", "--wait-durable",
                                      "--verify", "--check", "--admission", "dram_front",
                                      "--dram-share", "0.1", "--recency", "chain", "--out", out])
        sys.stdout.write(text.getvalue())
        self.assertEqual(code, 0)
        with open(out) as f:
            head = json.loads(f.readline())
        d = head["daemon"]
        self.assertEqual(head["admission"], "dram_front")
        self.assertEqual(head["hits"], head["sim_hits"])
        self.assertEqual(d["lookup_hits"], head["hits"])
        self.assertEqual(d["blocks_stored"], head["sim_written"])
        self.assertEqual(head["written"], head["sim_written"] - head["sim_promoted"])
        self.assertEqual(head["in_dram"], head["sim_declined"])
        self.assertEqual(d["front_kept"], head["sim_declined"])
        self.assertEqual(d["front_promoted"],
                         head["sim_promoted"] + head["sim_promoted_on_offer"])
        self.assertEqual(d["front_dropped"], head["sim_dram_dropped"])
        self.assertEqual(d["evictions"], head["sim_evicted"])
        self.assertEqual(head["declined"], 0)
        self.assertEqual(head["dropped"], 0)
        self.assertGreater(head["sim_promoted"], 0)  # Lookup hits in DRAM were compared
        self.assertGreater(head["sim_evicted"], 0)
        # Against store-all on the same slice: more hits, fewer blocks written.
        want = round(0.3 * tf.unique_blocks(tf.read_trace(SLICE), 512))
        store_all = trace_sim.simulate(tf.read_trace(SLICE), tp.Policy(want))
        self.assertLess(d["blocks_stored"], store_all.written)


class SustainedTest(unittest.TestCase):
    def test_series_and_verdicts_by_hand(self):
        import trace_sustained as ts
        # [t, bytes_read, bytes_written, backlog]: 1 MB read and 2 MB written per 0.5 s.
        samples = [[0.5 * i, 10 ** 6 * i, 2 * 10 ** 6 * i, 100 * i] for i in range(7)]
        self.assertEqual(ts.bandwidth_series(samples)[0], [0.5, 0.002, 0.004, 100])
        self.assertEqual(len(ts.bandwidth_series(samples, max_points=2)), 2)
        self.assertEqual(ts.bandwidth_series(samples, max_points=2)[0], [1.5, 0.002, 0.004, 300])
        # Over [0, 3]: middle third [1, 2) holds 200, 300; last [2, 3] holds 400, 500, 600.
        v = ts.backlog_verdict(samples, 0.0, 3.0, limit=1000, floor=0, growth_limit=1.5)
        self.assertAlmostEqual(v["write_backlog_growth"], 500 / 250)
        self.assertFalse(v["growth_ok"])
        self.assertEqual(v["backlog_max_bytes"], 600)
        self.assertEqual(v["backlog_at_limit_share"], 0.0)
        flat = ts.backlog_verdict([[t, 0, 0, 0] for t in range(10)], 0, 9, 1000, 4096, 1.5)
        self.assertEqual(flat["write_backlog_growth"], 1.0)
        self.assertTrue(flat["growth_ok"])
        # 1000 blocks over the slice's span at 64 KiB: speed for 0.05 GB/s.
        reqs = tf.read_trace(SLICE)
        speed = ts.speed_for(0.05, reqs, 1000, 65536)
        self.assertAlmostEqual(1000 * 65536 * speed / tf.span_seconds(reqs), 0.05e9)

    def test_sustained_replay_on_two_pool_dirs(self):
        # The slice with writes offered at 0.05 GB/s on a pool of two directories: every stored
        # block found after the drain, the pass alone loads exactly what the mixed pass loaded,
        # and the series covers both passes.
        import json
        import trace_replay
        tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        out = os.path.join(tmp, "r.jsonl")
        dirs = ",".join(os.path.join(tmp, "d%d" % i) for i in range(2))
        text = io.StringIO()
        with redirect_stdout(text):
            code = trace_replay.main([SLICE, "--sustained", "--target-write-gbps", "0.05",
                                      "--engines", "2", "--pool-dirs", dirs,
                                      "--emulation", "host-test", "--sample-ms", "100",
                                      "--out", out])
        sys.stdout.write(text.getvalue())
        self.assertEqual(code, 0)
        with open(out) as f:
            lines = {l["metric"]: l for l in map(json.loads, f)}
        read, growth, lost = (lines["trace_sustained_" + m]
                              for m in ("read_vs_alone", "backlog_growth", "lost_blocks"))
        for line in (read, growth, lost):
            self.assertEqual((line["emulation"], line["n_devices"]), ("host-test", 2))
            self.assertEqual(line["block_bytes"], 2 * 2 * 16384)
            self.assertGreater(line["speed"], 1.0)
            self.assertGreater(len(line["series"]), 10)
        self.assertEqual(lost["value"], 0)
        self.assertTrue(lost["goal_met"])
        self.assertEqual(lost["stored_keys"], 2995)  # capacity 1.1x: every unique block stored
        self.assertEqual((lost["verify_errors"], lost["io_errors"], lost["evictions"]), (0, 0, 0))
        self.assertTrue(read["same_hits"])
        self.assertEqual(read["hits_alone"], read["loaded"])
        self.assertGreater(read["loaded"], 0)
        self.assertGreater(read["value"], 0.0)
        self.assertTrue(growth["drained"])
        self.assertEqual(growth["dropped"], 0)
        self.assertLessEqual(growth["backlog_max_bytes"], growth["backlog_limit_bytes"])
        self.assertGreater(growth["backlog_limit_bytes"], 0)
        self.assertGreater(growth["value"], 0.0)
        # Both passes in the series: writes while mixed, reads in both, no writes alone.
        phases = read["phases"]
        mixed = [p for p in read["series"] if p[0] <= phases["drain"]]
        alone = [p for p in read["series"] if p[0] > phases["alone"] + 0.2]
        self.assertGreater(sum(p[2] for p in mixed), 0)
        self.assertGreater(sum(p[1] for p in alone), 0)
        self.assertEqual(sum(p[2] for p in alone), 0)
        self.assertEqual(os.listdir(os.path.join(tmp, "d0")), [])  # the pool removed


class BackgroundLoadTest(unittest.TestCase):
    """tests/e2e/replay_load.py: the replay as background load of ttft_grid's advice_replay."""

    def load(self, socket_path, **kw):
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))
        import replay_load
        return replay_load.ReplayLoad(socket_path, SLICE, layers=2, object_bytes=16384,
                                      call_blocks=160, **kw)

    def test_runs_beside_and_says_what_it_did(self):
        import time
        import tutti.testing
        # A pool of about 3,900 slots of the replay's 64 KiB blocks: nothing evicted.
        with tutti.testing.Tuttid(object_bytes=16384, max_objects=4) as d:
            load = self.load(d.socket, gbps=0.05).start()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 4.0:
                load.check()
                time.sleep(0.2)
            t1 = time.monotonic()
            load.stop()
        w = load.window(t0, t1)
        self.assertGreater(w["requests"], 5)
        self.assertEqual(w["load_failed"], 0)
        self.assertGreater(w["hits"], 0)  # 22 hits by the slice's 11th request, 1.7 s in
        self.assertEqual(w["loaded"], w["hits"])  # no compute samples: tuttid advises all hits
        self.assertGreater(w["written"], 0)
        self.assertAlmostEqual(w["gb_written"], w["written"] * 65536 / 1e9)
        self.assertGreater(load.info["speed"], 1.0)
        self.assertIn("started %d requests" % w["requests"], load.describe(t0, t1))

    def test_failures_are_raised(self):
        import time
        import tutti.testing
        with tutti.testing.Tuttid() as d:
            load = self.load(d.socket, gbps=1.0, count=3).start()
            deadline = time.monotonic() + 30
            while load.ended is None and time.monotonic() < deadline:
                time.sleep(0.05)
            with self.assertRaisesRegex(RuntimeError, "served its last request"):
                load.check()
            load.stop()
        with self.assertRaisesRegex(RuntimeError, "served no request"):
            self.load("/nonexistent/tuttid.sock", gbps=0.05).start()


if __name__ == "__main__":
    unittest.main(verbosity=2)

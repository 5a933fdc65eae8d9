"""trace_replay: replays a Mooncake-format request trace (../shared/traces/README.md) through a
real tuttid as one or several engines (issue 23 section 1), and checks its counts against an
independent count: the pure-Python cache simulation of the same trace (trace_sim.py).

    PYTHONPATH=bazel-bin/client/python/site python3 bench/trace_replay.py TRACE
        [--first N --count N] [--block-tokens 512] [--layers 2 --object-kib 16]
        [--capacity-share 0.2 | --capacity-blocks N] [--engines 1] [--speed 0]
        [--wait-durable] [--verify] [--tuttid BIN | --socket S --admin-socket S]
        [--admission all|second_sight|dram_front [--ghost-blocks N] [--dram-share 0.1]]
        [--out bench/results/trace_replay.jsonl]
        [--sustained [--pool-dirs D1,.. | --array tmpfs:N|loop:N] [--target-write-gbps X]]

Each request becomes what an engine does (trace_engine.py): Lookup of its chain (keys from the
trace's hash_ids, one 512-token trace block = 512 / --block-tokens tutti blocks), Retrieve of the
hits tuttid advises loading, Store of the blocks it computed. Requests go to --engines engines
(each its own session and shared memory) through one queue, the next free engine taking the next
request: at the trace's arrival times divided by --speed (1: the trace's rate, 10: ten times
faster), or as fast as the engines go (--speed 0). Without --tuttid/--socket a host-mode tuttid
is started here (tutti.testing.Tuttid: the pool in $TEST_TMPDIR or /var/tmp, the DRAM tier off
but for --admission dram_front, where it holds --dram-share x the capacity asked, in blocks),
its pool sized to the capacity asked for; the simulation runs at the capacity the pool really
has (admin Stats slots_total). --wait-durable makes every Store wait until its blocks are
durable; with it, one engine and --speed 0 the replay's counts must equal the simulation's
(hits, blocks written, evictions), and the tool exits 1 when they do not (--check).

Reported (stdout and JSON lines in --out, with date, machine and the exact command): the prefix
hit ratio, replay and simulation; bytes loaded and written (blocks x block bytes, and tuttid's
own Stats counters); write amplification (bytes written per byte later read); SSD writes per
hour at the trace's rate (the replay's blocks, and scaled to --model-bytes-per-token: Llama-3-8B's
128 KiB by default, 64 MiB per 512-token block); the write backlog over time (admin Stats every
--sample-ms: max, mean, and the series); the loads' bandwidth (bytes retrieved / seconds in
Retrieve); requests' lag behind their arrival time.

--sustained (issue 23 section 3, trace_sustained.py): reads and writes together at a chosen write
rate against the same reads alone, the write backlog's verdict and the lost-block check, the pool
on --pool-dirs or an emulated --array; its own flags and metrics are described there.
"""

import argparse
import datetime
import json
import os
import platform
import queue
import shlex
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))
import admin_stats  # noqa: E402
import trace_engine  # noqa: E402
import trace_format  # noqa: E402
import trace_policies  # noqa: E402
import trace_sim  # noqa: E402

LLAMA3_8B_BYTES_PER_TOKEN = 128 << 10
SLOT_HEADER_BYTES = 4096


class BacklogSampler(admin_stats.Sampler):
    """admin Stats every `period` s on its own thread: (t, backlog bytes, blocks, age ms)."""

    def __init__(self, admin_socket, period):
        super().__init__(admin_socket, period, lambda s: (
            s.get("write_backlog_bytes", 0), s.get("write_backlog_blocks", 0),
            s.get("write_backlog_age_ms", 0)), name="backlog-sampler")

    def summary(self, max_points=200):
        bytes_ = [s[1] for s in self.samples] or [0]
        step = max(1, len(self.samples) // max_points)
        return dict(backlog_samples=len(self.samples), backlog_sample_errors=self.errors,
                    backlog_max_bytes=max(bytes_), backlog_mean_bytes=sum(bytes_) / len(bytes_),
                    backlog_max_blocks=max([s[2] for s in self.samples] or [0]),
                    backlog_max_age_ms=max([s[3] for s in self.samples] or [0]),
                    backlog_series=self.samples[::step])


def run_engines(args, socket_path, geometry, requests, call_blocks, serve=None, halt=None):
    """Serves every request (engine.serve, or serve(engine, index, request)); returns the
    RequestResults in trace order and the wall seconds. Once the threading.Event `halt` is set,
    no further request is started (their results stay None)."""
    engines = [trace_engine.TraceEngine(socket_path, geometry, call_blocks, "trace-engine-%d" % i,
                                        args.wait_durable, args.store_retries,
                                        args.staging_wait_ms, args.verify)
               for i in range(args.engines)]
    work, results, failures = queue.Queue(), [None] * len(requests), []

    def engine_loop(engine):
        while True:
            item = work.get()
            if item is None:
                return
            i, req, due = item
            if halt is not None and halt.is_set():
                continue
            started = time.monotonic()
            try:
                r = serve(engine, i, req) if serve else engine.serve(i, req)
            except Exception as e:  # reported after the run, with the request's index
                failures.append("request %d: %r" % (i, e))
                continue
            r.lag_s = max(0.0, started - due) if due else 0.0
            results[i] = r

    threads = [threading.Thread(target=engine_loop, args=(e,), daemon=True) for e in engines]
    for t in threads:
        t.start()
    t0, ts0 = time.monotonic(), requests[0].timestamp_ms if requests else 0
    for i, req in enumerate(requests):
        due = 0.0
        if args.speed > 0:
            due = t0 + (req.timestamp_ms - ts0) / 1000.0 / args.speed
            if halt is not None:
                halt.wait(max(0.0, due - time.monotonic()))
            else:
                time.sleep(max(0.0, due - time.monotonic()))
        if halt is not None and halt.is_set():
            break
        work.put((i, req, due))
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    for e in engines:
        e.close()
    if failures:
        raise trace_engine.ReplayError("%d requests failed; first: %s" % (len(failures),
                                                                         failures[0]))
    return results, wall


def pool_bytes_for(blocks, geometry):
    """Pool capacity_bytes that holds about `blocks` slots (rounded down to whole extents by
    tuttid, so one extent more is asked for): at least tuttid's 64 MiB."""
    object_bytes = -(-geometry.object_bytes // 4096) * 4096
    slot = geometry.num_objects * object_bytes + SLOT_HEADER_BYTES
    extent = max(1, (1 << 20) // object_bytes)
    return max(64 << 20, (blocks + extent) * slot + (4 << 20)), object_bytes


def report(args, requests, results, wall, sim, slots, before, after, sampler, geometry):
    tot = {k: sum(getattr(r, k) for r in results)
           for k in ("blocks", "hits", "loaded", "load_failed", "written", "already_present",
                     "dropped", "refusals", "declined", "in_dram")}
    retrieve_s = sum(r.retrieve_s for r in results)
    lags = sorted(r.lag_s for r in results)
    span_h = trace_format.span_seconds(requests) / 3600.0
    bb = geometry.block_bytes
    model_block = args.model_bytes_per_token * args.block_tokens
    d = {k: after.get(k, 0) - before.get(k, 0)
         for k in ("lookup_hits", "blocks_stored", "bytes_read", "bytes_written", "evictions",
                   "store_rejected", "store_rejected_backlog", "blocks_retrieved",
                   "blocks_admitted", "blocks_declined", "front_kept", "front_promoted",
                   "front_dropped", "front_promotions_deferred")}
    out = dict(requests=len(results), capacity_blocks=slots, wall_s=round(wall, 3),
               trace_span_s=span_h * 3600, **tot,
               hit_ratio=tot["hits"] / max(tot["blocks"], 1), sim_hit_ratio=sim.hit_ratio,
               sim_hits=sim.hits, sim_written=sim.written, sim_evicted=sim.evicted,
               sim_declined=sim.declined, sim_promoted=sim.promoted,
               sim_promoted_on_offer=sim.promoted_on_offer, sim_dram_dropped=sim.dram_dropped,
               admission=args.admission, dram_blocks=args.dram_blocks,
               bytes_loaded=tot["loaded"] * bb, bytes_written=tot["written"] * bb,
               block_bytes=bb, write_amplification=tot["written"] / max(tot["loaded"], 1),
               ssd_write_bytes_per_hour=tot["written"] * bb / span_h,
               ssd_write_bytes_per_hour_model=tot["written"] * model_block / span_h,
               model_block_bytes=model_block,
               load_gbps=tot["loaded"] * bb / retrieve_s / 1e9 if retrieve_s else 0.0,
               lag_p50_s=lags[len(lags) // 2] if lags else 0.0, lag_max_s=lags[-1] if lags else 0,
               daemon={k: v for k, v in d.items()}, errors=[e for r in results for e in r.errors])
    out.update(sampler.summary())
    if args.admission == "dram_front":
        # Blocks a Lookup promotes are written without a Store: the engines' outcomes count the
        # rest. Declined blocks are kept in DRAM (in_dram), none dropped at once.
        out["counts_agree"] = (
            tot["hits"] == sim.hits and d["blocks_stored"] == sim.written and
            tot["written"] == sim.written - sim.promoted and d["evictions"] == sim.evicted and
            tot["in_dram"] == sim.declined and tot["declined"] == 0 and
            d["blocks_declined"] == sim.declined and d["front_kept"] == sim.declined and
            d["front_promoted"] == sim.promoted + sim.promoted_on_offer and
            d["front_dropped"] == sim.dram_dropped and d["front_promotions_deferred"] == 0)
    else:
        out["counts_agree"] = (tot["hits"] == sim.hits and tot["written"] == sim.written and
                               d["evictions"] == sim.evicted and
                               d["blocks_stored"] == sim.written and
                               tot["declined"] == sim.declined and
                               d["blocks_declined"] == sim.declined)
    return out


def result_lines(args, rep, command):
    base = dict(bench="trace_replay", trace=os.path.basename(args.trace), first=args.first,
                count=args.count, block_tokens=args.block_tokens, layers=args.layers,
                object_kib=args.object_kib, engines=args.engines, speed=args.speed,
                wait_durable=args.wait_durable, label=args.label, machine=platform.node(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command=command)
    fields = {k: v for k, v in rep.items() if k != "backlog_series"}
    lines = [dict(base, metric="trace_replay_hit_ratio_vs_sim", unit="ratio",
                  value=rep["hit_ratio"] / rep["sim_hit_ratio"] if rep["sim_hit_ratio"] else 1.0,
                  baseline_name="sim_hit_ratio", baseline_value=rep["sim_hit_ratio"],
                  measured_value=rep["hit_ratio"], **fields),
             dict(base, metric="trace_replay_write_amplification", unit="ratio",
                  value=rep["write_amplification"], capacity_blocks=rep["capacity_blocks"]),
             dict(base, metric="trace_replay_ssd_write_bytes_per_hour", unit="bytes/h",
                  value=rep["ssd_write_bytes_per_hour"],
                  model_value=rep["ssd_write_bytes_per_hour_model"],
                  model_block_bytes=rep["model_block_bytes"]),
             dict(base, metric="trace_replay_load_gbps", unit="GB/s", value=rep["load_gbps"]),
             dict(base, metric="trace_replay_write_backlog_max_bytes", unit="bytes",
                  value=rep["backlog_max_bytes"], backlog_series=rep["backlog_series"],
                  series_columns=["t_s", "bytes", "blocks", "age_ms"])]
    return lines


def print_report(rep):
    print("replay: %d requests in %.1f s; prefix hit ratio %.4f (simulation %.4f); hits %d / %d "
          "(sim %d); written %d (sim %d); evictions %d (sim %d); agree: %s" % (
              rep["requests"], rep["wall_s"], rep["hit_ratio"], rep["sim_hit_ratio"],
              rep["hits"], rep["blocks"], rep["sim_hits"], rep["written"], rep["sim_written"],
              rep["daemon"]["evictions"], rep["sim_evicted"], rep["counts_agree"]))
    print("  loaded %d blocks (%.1f MB, %.2f GB/s), written %d (%.1f MB; tuttid %d stored, "
          "%.1f MB), write amplification %.2f, dropped %d, refusals %d, declined %d (sim %d, "
          "admission %s)" % (
              rep["loaded"], rep["bytes_loaded"] / 1e6, rep["load_gbps"], rep["written"],
              rep["bytes_written"] / 1e6, rep["daemon"]["blocks_stored"],
              rep["daemon"]["bytes_written"] / 1e6, rep["write_amplification"], rep["dropped"],
              rep["refusals"], rep["declined"], rep["sim_declined"], rep["admission"]))
    if rep["admission"] == "dram_front":
        d = rep["daemon"]
        print("  dram front (%d blocks): kept %d (sim %d), promoted %d (sim %d at lookups + %d at "
              "offers), dropped %d (sim %d), deferred %d" % (
                  rep["dram_blocks"], d["front_kept"], rep["sim_declined"], d["front_promoted"],
                  rep["sim_promoted"], rep["sim_promoted_on_offer"], d["front_dropped"],
                  rep["sim_dram_dropped"], d["front_promotions_deferred"]))
    print("  SSD writes at the trace's rate: %.2f GB/h of these blocks, %.1f GB/h at %d MiB a "
          "block; write backlog max %d bytes (%d blocks, oldest %d ms), mean %.0f bytes; lag "
          "p50 %.3f s, max %.3f s" % (
              rep["ssd_write_bytes_per_hour"] / 1e9, rep["ssd_write_bytes_per_hour_model"] / 1e9,
              rep["model_block_bytes"] >> 20, rep["backlog_max_bytes"],
              rep["backlog_max_blocks"], rep["backlog_max_age_ms"], rep["backlog_mean_bytes"],
              rep["lag_p50_s"], rep["lag_max_s"]))


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=0, help="requests (0: to the end)")
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--object-kib", type=int, default=16, help="bytes of one K or V object")
    ap.add_argument("--capacity-share", type=float, default=None,
                    help="pool slots as a share of the replayed requests' unique blocks "
                         "(default 0.2; --sustained: 1.1, nothing evicted)")
    ap.add_argument("--capacity-blocks", type=int, default=0)
    ap.add_argument("--engines", type=int, default=1)
    ap.add_argument("--speed", type=float, default=0.0,
                    help="trace time / replay time (0: as fast as the engines go)")
    ap.add_argument("--call-blocks", type=int, default=512, help="most keys per call")
    ap.add_argument("--wait-durable", action="store_true")
    ap.add_argument("--store-retries", type=int, default=3)
    ap.add_argument("--staging-wait-ms", type=int, default=1000)
    ap.add_argument("--verify", action="store_true", help="check every retrieved byte")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless hits, blocks written and evictions equal the simulation's")
    ap.add_argument("--tuttid", default="", help="tuttid binary to start (default: found)")
    ap.add_argument("--socket", default="", help="use a running tuttid (and --admin-socket)")
    ap.add_argument("--admin-socket", default="")
    ap.add_argument("--store-staging-mib", type=int, default=64)
    ap.add_argument("--sample-ms", type=int, default=200)
    ap.add_argument("--model-bytes-per-token", type=int, default=LLAMA3_8B_BYTES_PER_TOKEN)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="", help="append JSON lines here")
    ap.add_argument("--admission-out", default="",
                    help="append the admission table's metrics (trace_hit_ratio_vs_best_rule, "
                         "trace_bytes_written_vs_store_all) for this run here")
    ap.add_argument("--admission", choices=("all", "second_sight", "dram_front"), default="all",
                    help="tuttid's pool.admission (the simulation runs the same policy); with "
                         "--socket, the running tuttid's must match")
    ap.add_argument("--recency", choices=("tail_first", "chain"), default="tail_first",
                    help="tuttid's pool.recency (the simulation evicts in the same order); "
                         "dram_front only with chain: tuttid's DRAM front keeps its own blocks "
                         "in chain order")
    ap.add_argument("--ghost-blocks", type=int, default=0,
                    help="pool.admission_ghost_blocks (0: 2 x the capacity asked for "
                         "second_sight, 4 x for dram_front, as trace_sim's dram10_front)")
    ap.add_argument("--dram-share", type=float, default=0.1,
                    help="dram_front: the DRAM tier's blocks as a share of the capacity asked")
    sustained_args(ap)
    args = ap.parse_args(argv)
    if args.capacity_share is None:
        args.capacity_share = 1.1 if args.sustained else 0.2
    if (args.pool_dirs or args.array or args.target_write_gbps) and not args.sustained:
        ap.error("--pool-dirs, --array and --target-write-gbps go with --sustained")
    if args.sustained and (args.socket or args.admission != "all" or args.wait_durable):
        ap.error("--sustained starts its own tuttid (no --socket), admission all, no "
                 "--wait-durable")
    if args.engines < 1 or args.speed < 0 or args.call_blocks < 1:
        ap.error("--engines and --call-blocks must be >= 1, --speed >= 0")
    if args.admission == "dram_front" and args.recency != "chain":
        ap.error("--admission dram_front runs with --recency chain: tuttid's DRAM front keeps "
                 "its blocks in chain order, so only then does the simulation match it")
    if bool(args.socket) != bool(args.admin_socket):
        ap.error("--socket and --admin-socket go together")
    trace_format.check_block_tokens(args.block_tokens)
    return args


def sustained_args(ap):
    """The flags of --sustained (trace_sustained.py, issue 23 section 3)."""
    g = ap.add_argument_group("sustained mode (trace_sustained.py)")
    g.add_argument("--sustained", action="store_true",
                   help="reads and writes together against the same reads alone, the backlog "
                        "verdict and the lost-block check")
    g.add_argument("--pool-dirs", default="", help="pool files on these directories, "
                   "comma-separated, one per device")
    g.add_argument("--array", default="", help="tmpfs:N or loop:N, built with bench/ssd_array.py "
                   "under --array-base (loop: root, capped at --io-cap-gbps per device)")
    g.add_argument("--array-base", default="/dev/shm")
    g.add_argument("--io-cap-gbps", type=float, default=2.5,
                   help="loop:N: each device's read and write cap (cgroup io.max), GB/s")
    g.add_argument("--emulation", default="", help="the result's emulation name (default: "
                   "tmpfs or loop for --array, disk for --pool-dirs, host-test otherwise)")
    g.add_argument("--target-write-gbps", type=float, default=0.0,
                   help="pick --speed so that the window's writes arrive at this many GB/s")
    g.add_argument("--retrieve-staging-mib", type=int, default=64)
    g.add_argument("--max-write-backlog-mib", type=int, default=0,
                   help="datapath.max_write_backlog_bytes (0: tuttid's default, store staging)")
    g.add_argument("--drain-timeout-s", type=float, default=120.0)
    g.add_argument("--growth-limit", type=float, default=1.5,
                   help="the backlog is bounded when its growth is at most this")


def dram_bytes_for(blocks, geometry):
    """dram.capacity_bytes that holds `blocks` blocks of the DRAM tier (one pool slot's objects
    each, pool.max_objects x pool.object_bytes)."""
    object_bytes = -(-geometry.object_bytes // 4096) * 4096
    return blocks * geometry.num_objects * object_bytes


def pool_admission(args, ghost):
    """The pool { } fields that set tuttid's admission policy and eviction order."""
    fields = 'recency: "%s"' % args.recency
    if args.admission == "all":
        return fields
    return fields + ' admission: "%s" admission_ghost_blocks: %d' % (args.admission, ghost)


def sim_policy(args, slots, ghost):
    """The simulation's policy that tuttid's pool.admission and pool.recency run, with the same
    ghost bound."""
    if args.admission == "all":
        return trace_policies.Policy(slots, args.recency)
    if args.admission == "dram_front":
        return trace_policies.DramFront(slots, args.recency, dram_blocks=args.dram_blocks,
                                        ghost_blocks=ghost)
    return trace_policies.SecondSight(slots, args.recency, ghost_blocks=ghost)


def replay(args, command):
    requests = trace_format.read_trace(args.trace, args.first, args.count)
    if not requests:
        raise trace_engine.ReplayError("no requests in %s from %d" % (args.trace, args.first))
    geometry = trace_engine.Geometry(args.block_tokens, args.layers, args.object_kib << 10)
    geometry.layout()  # checks the shape
    unique = trace_format.unique_blocks(requests, args.block_tokens)
    want = args.capacity_blocks or max(1, round(args.capacity_share * unique))
    # The ghost and the DRAM front, the same for tuttid and the simulation.
    ghost = args.ghost_blocks or (4 if args.admission == "dram_front" else 2) * want
    args.dram_blocks = max(1, round(args.dram_share * want)) if args.admission == "dram_front" else 0
    daemon = None
    if not args.socket:
        import tutti.testing
        capacity, object_bytes = pool_bytes_for(want, geometry)
        daemon = tutti.testing.Tuttid(binary=args.tuttid or None, capacity=capacity,
                                      object_bytes=object_bytes, max_objects=geometry.num_objects,
                                      dram=dram_bytes_for(args.dram_blocks, geometry),
                                      store_staging=args.store_staging_mib << 20,
                                      max_blocks_per_call=max(args.call_blocks, 512),
                                      pool_extra=pool_admission(args, ghost)).start()
    socket_path = args.socket or daemon.socket
    admin = args.admin_socket or daemon.admin_socket
    try:
        before = admin_stats.stats(admin)
        slots = before.get("slots_total", 0) - before.get("slots_used", 0)
        print("%s: %d requests (%d unique blocks of %d tokens), %d free slots (asked %d), "
              "%d-byte blocks" % (args.trace, len(requests), unique, args.block_tokens, slots,
                                  want, geometry.block_bytes))
        sim = trace_sim.simulate(requests, sim_policy(args, slots, ghost), args.block_tokens,
                                 args.call_blocks)
        sampler = BacklogSampler(admin, args.sample_ms / 1000.0).start()
        try:
            results, wall = run_engines(args, socket_path, geometry, requests,
                                        min(args.call_blocks, slots))
        finally:
            sampler.stop()
        after = admin_stats.stats(admin)
    finally:
        if daemon is not None:
            daemon.stop()
            daemon.cleanup()
    rep = report(args, requests, results, wall, sim, slots, before, after, sampler, geometry)
    print_report(rep)
    if args.out:
        with open(args.out, "a") as f:
            for line in result_lines(args, rep, command):
                f.write(json.dumps(line, sort_keys=True) + "\n")
    if args.admission_out:
        with open(args.admission_out, "a") as f:
            for line in admission_lines(args, rep, requests, slots, command):
                f.write(json.dumps(line, sort_keys=True) + "\n")
    return rep


def admission_lines(args, rep, requests, slots, command):
    """The admission table's two metrics (trace_sim.result_lines' names) for what tuttid did:
    its hit ratio against the better of the simulation's store-all LRU and second sight
    (unbounded ghost) at the pool's capacity, and its blocks written (tuttid's blocks_stored)
    against store-all's."""
    rules = {v: trace_sim.simulate(requests, trace_sim.make_policy(v, slots), args.block_tokens,
                                   args.call_blocks) for v in trace_sim.RULES}
    best = max(c.hit_ratio for c in rules.values())
    store_all = rules["store_all"].written
    stored = rep["daemon"]["blocks_stored"]
    unique = trace_format.unique_blocks(requests, args.block_tokens)
    common = dict(bench="trace_replay", trace=os.path.basename(args.trace),
                  capacity_share=round(slots / unique, 4), capacity_blocks=slots,
                  policy="tuttid_" + args.admission + (
                      "_dram%g" % args.dram_share if args.admission == "dram_front" else ""),
                  dram_blocks=args.dram_blocks, hit_ratio=rep["hit_ratio"],
                  sim_hit_ratio=rep["sim_hit_ratio"], counts_agree=rep["counts_agree"],
                  hits=rep["hits"], blocks=rep["blocks"], blocks_stored=stored,
                  best_rule_hit_ratio=best, store_all_written=store_all,
                  goal_met=bool(rep["hit_ratio"] >= best - 0.01 and stored <= 0.5 * store_all),
                  block_tokens=args.block_tokens, wall_s=rep["wall_s"], machine=platform.node(),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command=command, unit="ratio")
    return [dict(common, metric="trace_hit_ratio_vs_best_rule", value=rep["hit_ratio"] / best,
                 baseline_name="best_rule_hit_ratio", baseline_value=best),
            dict(common, metric="trace_bytes_written_vs_store_all", value=stored / store_all,
                 baseline_name="store_all_written", baseline_value=store_all)]


def main(argv=None):
    args = parse_args(argv)
    command = " ".join(shlex.quote(a) for a in ["python3", "bench/trace_replay.py"] +
                       (argv if argv is not None else sys.argv[1:]))
    try:
        if args.sustained:
            import trace_sustained
            rep = trace_sustained.run(args, command)
            return 0 if rep["ok_no_loss"] else 1
        rep = replay(args, command)
    except (trace_engine.ReplayError, trace_format.TraceError, OSError) as e:
        print("trace_replay: %s" % e, file=sys.stderr)
        return 2
    if args.check and not rep["counts_agree"]:
        print("trace_replay: the replay's counts differ from the simulation's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

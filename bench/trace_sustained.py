"""trace_replay's sustained mode (issue 23 section 3, "Reads and writes together, sustained"):
the trace's requests replayed at a rate where the writes matter, against the same requests'
reads alone, on a pool that may sit on an emulated array. Run through trace_replay.py:

    python3 bench/trace_replay.py TRACE --sustained [--first N --count N]
        [--layers L --object-kib K] [--target-write-gbps X | --speed S] [--engines E]
        [--pool-dirs D1,D2,... | --array tmpfs:N|loop:N [--array-base /dev/shm]
         [--io-cap-gbps G]] [--emulation NAME] [--store-staging-mib M]
        [--max-write-backlog-mib M] [--sample-ms 200] [--out FILE]

One tuttid (started here, host mode, DRAM tier off: every load comes from the pool files), pool
files on --pool-dirs (one per device) or on an array built with bench/ssd_array.py's builders
(tmpfs:N: N directories under --array-base; loop:N: N ext4 loop devices over files there, their
reads and writes capped at --io-cap-gbps each by a cgroup that tuttid runs in; root only). The
pool holds --capacity-share (default 1.1) x the window's unique blocks, so that nothing is evicted
and every block loaded in pass 1 is still there for pass 2. Then, on one clock:

  1. mixed: the requests at their arrival times / speed, as trace_replay does (Lookup, Retrieve of
     the advised hits, Store of the rest, not waiting for durability).
  2. drain: admin Stats until the write backlog and store staging are empty (--drain-timeout-s).
  3. lost check: every key a Store of pass 1 handed to tuttid (captured or durable) is looked up;
     a key not found and not accounted for by tuttid's evictions is lost.
  4. alone: the same requests at the same arrival times, each Retrieving exactly the blocks it
     Retrieved in pass 1 (the same leading keys of its chain, into the same engine blocks), with
     no Store: the reads alone. What differs from pass 1: its Lookups cover only those keys and
     carry no prompt length (no advice asked; the advice's count is replayed), requests that
     loaded nothing are skipped, and the pool now holds the whole window (the same blocks are
     found: the report checks that hits_alone equals the blocks pass 1 asked for).

Measured: admin Stats every --sample-ms (bytes_read, bytes_written, write_backlog_bytes), giving
per window the bytes retrieved and written per second and the backlog (the series: [t_s,
read_gbps, write_gbps, backlog_bytes], merged to at most 300 windows, the backlog the window's
largest); the loads' bandwidth per pass as the engines see it (bytes retrieved / seconds spent in
Retrieve calls, the calls of both passes being the same), and their ratio
retrieve_with_writes_vs_alone (pass 1 / pass 4). The backlog verdict, over pass 1 by time:
write_backlog_growth = (mean of the last third + floor) / (mean of the middle third + floor),
the floor the larger of one block and what the pass writes in BACKLOG_FLOOR_S (0.1 s) at its
measured write rate (a backlog the array writes in a tenth of a second is no growth: a bare ratio
of two near-empty means swung to 2-4 on a few MB); bounded when growth <= --growth-limit (1.5), fewer than 5% of samples at >= 90% of the
backlog limit (datapath.max_write_backlog_bytes, by default limits.store_staging_bytes), no Store
dropped for lack of room, and drained within --drain-timeout-s of the last request. Lost:
lost_blocks = max(0, keys not found - tuttid's evictions) + nothing else may be off: verify_errors,
io_errors and store_failed must stay 0 and durability_lost false (ok_no_loss).

--target-write-gbps X picks --speed so that the window's writes arrive at X GB/s: speed = X x
span / (blocks the simulation writes x block bytes), the block bytes set by --layers and
--object-kib (2 x layers x object bytes). Choose X as the share of the array's write bandwidth
that should be kept busy (e.g. 0.5 x 4 x --io-cap-gbps on loop:4).

JSON lines (--out): trace_sustained_read_vs_alone (ratio), trace_sustained_backlog_growth
(ratio), trace_sustained_lost_blocks (blocks), each with trace, emulation, n_devices, speed,
block_bytes, the verdict fields and the series.
"""

import datetime
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))
import admin_stats  # noqa: E402
import trace_engine  # noqa: E402
import trace_format  # noqa: E402
import trace_policies  # noqa: E402
import trace_sim  # noqa: E402

SERIES_POINTS = 300
GROWTH_AT_LIMIT = 0.9        # a sample at >= this share of the backlog limit is "at the limit"
AT_LIMIT_SHARE_BOUND = 0.05  # bounded: fewer samples than this share at the limit
BACKLOG_FLOOR_S = 0.1  # the growth's floor: this many seconds of the pass's writes
POOL_DIRS_TEMPLATE = 'dirs: "{root}/pool"'


def stats_sampler(admin_socket, period):
    """admin_stats.Sampler of [t_s, bytes_read, bytes_written, write_backlog_bytes]."""
    return admin_stats.Sampler(admin_socket, period, lambda s: (
        s.get("bytes_read", 0), s.get("bytes_written", 0), s.get("write_backlog_bytes", 0)))


def bandwidth_series(samples, max_points=SERIES_POINTS):
    """[[t_s, read_gbps, write_gbps, backlog_bytes]]: one entry per window between samples, and
    neighbouring windows merged so that at most max_points remain (the rates over the merged
    window, the backlog the largest sampled in it). t_s is the window's end."""
    if len(samples) < 2:
        return []
    step = -(-(len(samples) - 1) // max_points)
    out = []
    for i in range(step, len(samples) + step - 1, step):
        a, b = samples[i - step], samples[min(i, len(samples) - 1)]
        dt = b[0] - a[0]
        if dt <= 0:
            continue
        peak = max(s[3] for s in samples[i - step + 1:i + 1])
        out.append([b[0], round((b[1] - a[1]) / dt / 1e9, 4), round((b[2] - a[2]) / dt / 1e9, 4),
                    peak])
    return out


def backlog_verdict(samples, t0, t1, limit, floor, growth_limit):
    """The write backlog over [t0, t1] (the mixed pass): growth of the last third's mean over the
    middle third's (each plus `floor` bytes, so that a backlog the array writes at once is no
    growth),
    the max, and the share of samples at >= GROWTH_AT_LIMIT x limit. `bounded` is left to the
    caller (it also needs the drain and the dropped Stores)."""
    span = max(t1 - t0, 1e-9)
    mid = [s[3] for s in samples if t0 + span / 3 <= s[0] < t0 + 2 * span / 3]
    last = [s[3] for s in samples if t0 + 2 * span / 3 <= s[0] <= t1]
    inside = [s[3] for s in samples if t0 <= s[0] <= t1]

    def mean(xs):
        return sum(xs) / len(xs) if xs else 0.0

    growth = (mean(last) + floor) / (mean(mid) + floor)
    at_limit = sum(1 for b in inside if limit and b >= GROWTH_AT_LIMIT * limit)
    return dict(write_backlog_growth=round(growth, 4), backlog_mid_mean_bytes=mean(mid),
                backlog_last_mean_bytes=mean(last), backlog_max_bytes=max(inside or [0]),
                backlog_limit_bytes=limit, backlog_samples=len(inside),
                backlog_at_limit_share=round(at_limit / len(inside), 4) if inside else 0.0,
                growth_ok=bool(growth <= growth_limit and len(mid) > 0 and len(last) > 0))


def speed_for(target_gbps, requests, written_blocks, block_bytes):
    """The --speed at which `written_blocks` of block_bytes over the requests' span arrive at
    target_gbps GB/s."""
    rate_at_1 = written_blocks * block_bytes / trace_format.span_seconds(requests)
    return target_gbps * 1e9 / rate_at_1


# --- the pool's devices ----------------------------------------------------------------------

class Devices:
    """Where the pool files go: `dirs` (one per device), the emulation's name, and an optional
    wrapper that starts tuttid inside the array's cgroup. close() tears down what was built."""

    def __init__(self, dirs, emulation, wrap=None, teardown=None, cgroup=None):
        self.dirs, self.emulation, self.wrap, self._teardown = dirs, emulation, wrap, teardown
        self.cgroup = cgroup  # ssd_array.Cgroup capping the loop devices, or None

    def io_bytes(self):
        """(read, written) bytes on the capped devices so far; (0, 0) with no cgroup."""
        return self.cgroup.io_bytes() if self.cgroup is not None else (0, 0)

    def close(self):
        if self._teardown is not None:
            self._teardown()
            self._teardown = None


def _check_o_direct(dirs, hint):
    import ssd_array  # its O_DIRECT probe, also used for --array-base below
    for d in dirs:
        if not ssd_array.takes_o_direct(d):
            raise trace_engine.ReplayError(
                "%s does not take O_DIRECT (tuttid's pool needs it); %s" % (d, hint))


def make_devices(args, capacity):
    """The pool's devices from --pool-dirs or --array (None: tuttid's default, one directory)."""
    if args.pool_dirs:
        # A fresh directory in each, removed at the end: no pool of an earlier run is reused.
        dirs = []
        for d in (d for d in args.pool_dirs.split(",") if d):
            os.makedirs(d, exist_ok=True)
            dirs.append(tempfile.mkdtemp(prefix="tutti-sustained-pool-", dir=d))
        devices = Devices(dirs, args.emulation or "disk", teardown=lambda: [
            shutil.rmtree(d, ignore_errors=True) for d in dirs])
        try:
            _check_o_direct(dirs, "pass --pool-dirs on a filesystem that does (ext4, xfs)")
        except trace_engine.ReplayError:
            devices.close()
            raise
        return devices
    if not args.array:
        return None
    kind, _, n = args.array.partition(":")
    if kind not in ("tmpfs", "loop") or not n.isdigit() or int(n) < 1:
        raise trace_engine.ReplayError("--array %r: tmpfs:N or loop:N" % args.array)
    import ssd_array  # only here: its builders and teardown (it needs root for loop)
    if not os.path.isdir(args.array_base) or not ssd_array.takes_o_direct(args.array_base):
        raise trace_engine.ReplayError(
            "--array-base %s does not take O_DIRECT (tmpfs before Linux 6.6 refuses it); pass "
            "--array-base DIR on a filesystem that does (e.g. /var/tmp), or --pool-dirs" %
            args.array_base)
    opts = types.SimpleNamespace(base=args.array_base, io_cap_gbps=args.io_cap_gbps)
    mark = ssd_array.TEARDOWN.mark()
    tops = [os.path.join(top, "%s%d" % (ssd_array.PREFIX, os.getpid()))
            for top in (args.array_base, "/tmp")]  # what ssd_array's main removes at its end

    def teardown():
        ssd_array.TEARDOWN.run_to(mark)
        for top in tops:
            shutil.rmtree(top, ignore_errors=True)

    try:
        if kind == "tmpfs":
            array = ssd_array.build_tmpfs_array(opts, int(n))
        else:
            array = ssd_array.build_loop_array(opts, int(n), capacity // int(n) + (64 << 20))
        _check_o_direct(array.pool_dirs, "pass --array-base on a filesystem that does")
    except (ssd_array.BenchError, OSError) as e:
        teardown()
        raise trace_engine.ReplayError("--array %s: %s" % (args.array, e)) from None
    return Devices(array.pool_dirs, args.emulation or kind,
                   array.wrap if array.cgroup is not None else None, teardown, array.cgroup)


def start_daemon(args, devices, capacity, object_bytes, geometry):
    """A host-mode tuttid (tutti.testing.Tuttid) with its pool on `devices` (or its default
    directory), the DRAM tier off; started, inside the array's cgroup where there is one."""
    import tutti.testing

    class PoolDirsTuttid(tutti.testing.Tuttid):
        def write_config(self, **changes):
            self.settings.update(changes)
            template = tutti.testing.CONFIG
            if devices is not None:
                if POOL_DIRS_TEMPLATE not in template:
                    raise trace_engine.ReplayError("tutti.testing's config has no %s to replace"
                                                   % POOL_DIRS_TEMPLATE)
                template = template.replace(POOL_DIRS_TEMPLATE, " ".join(
                    'dirs: "%s"' % d for d in devices.dirs))
            with open(self.config_path, "w") as f:
                f.write(template.format(**self.settings))

    binary = args.tuttid or tutti.testing.find_tuttid()
    extra = ""
    if args.max_write_backlog_mib:
        extra = "datapath { max_write_backlog_bytes: %d }" % (args.max_write_backlog_mib << 20)
    root = None
    if devices is not None and args.array:  # state beside the array (tmpfs on the GPU machine)
        root = tempfile.mkdtemp(prefix="tutti-sustained-", dir=args.array_base)
    daemon = PoolDirsTuttid(binary=binary, capacity=capacity, object_bytes=object_bytes,
                            max_objects=geometry.num_objects, dram=0,
                            store_staging=args.store_staging_mib << 20,
                            retrieve_staging=args.retrieve_staging_mib << 20,
                            max_blocks_per_call=max(args.call_blocks, 512), extra=extra,
                            root=root)
    if devices is not None and devices.wrap is not None:
        wrapper = os.path.join(daemon._sock_dir, "tuttid-in-cgroup.sh")
        with open(wrapper, "w") as f:
            f.write("#!/bin/sh\nexec %s \"$@\"\n" % " ".join(
                shlex.quote(c) for c in devices.wrap([os.path.abspath(binary)])))
        os.chmod(wrapper, 0o755)
        daemon.binary = wrapper
    try:
        daemon.start()
        if devices is not None and devices.cgroup is not None and \
                not devices.cgroup.contains(daemon.proc.pid):
            raise trace_engine.ReplayError("tuttid (pid %d) is not in %s" % (
                daemon.proc.pid, devices.cgroup.describe()))
        return daemon
    except Exception:
        daemon.cleanup()
        raise


# --- the passes --------------------------------------------------------------------------------

def wait_drained(admin, timeout_s, period=0.05):
    """Seconds until the write backlog and store staging are empty, and whether they were within
    timeout_s."""
    t0 = time.monotonic()
    while True:
        s = admin_stats.stats(admin)
        if not s.get("write_backlog_bytes", 0) and not s.get("store_staging_used_bytes", 0):
            return time.monotonic() - t0, True
        if time.monotonic() - t0 > timeout_s:
            return time.monotonic() - t0, False
        time.sleep(period)


def count_missing(client, keys, call_blocks):
    """Keys a Lookup does not find, each Lookup of up to call_blocks keys (a chain stops at its
    first miss: the next call starts after it). The leases are released."""
    missing, i = 0, 0
    while i < len(keys):
        part = keys[i:i + call_blocks]
        lease = client.lookup(part)
        if lease.hits:
            client.release(lease)
        if lease.hits < len(part):
            missing += 1
            i += lease.hits + 1
        else:
            i += len(part)
    return missing


def lost_check(socket_path, geometry, call_blocks, stored):
    engine = trace_engine.TraceEngine(socket_path, geometry, call_blocks, "trace-lost-check",
                                      False)
    try:
        return count_missing(engine.client, stored, call_blocks)
    finally:
        engine.close()


def alone_pass(args, socket_path, geometry, requests, mixed, call_blocks):
    """Pass 4: the requests that loaded in pass 1, at the same arrival times, each Retrieving the
    same leading keys of its chain; no Store."""
    import trace_replay
    picked = [i for i, r in enumerate(mixed) if r.load_prefix]
    reqs = [requests[i] for i in picked]

    def serve(engine, j, req):
        keys = trace_format.keys_of(trace_format.chain(req, geometry.block_tokens))
        return engine.serve_loads(picked[j], keys[:mixed[picked[j]].load_prefix])

    if not reqs:
        return [], 0.0
    return trace_replay.run_engines(args, socket_path, geometry, reqs, call_blocks, serve)


def pass_summary(results, bb):
    loaded = sum(r.loaded for r in results)
    retrieve_s = sum(r.retrieve_s for r in results)
    lags = sorted(r.lag_s for r in results) or [0.0]
    return dict(loaded=loaded, hits=sum(r.hits for r in results),
                load_failed=sum(r.load_failed for r in results), retrieve_s=round(retrieve_s, 4),
                load_gbps=loaded * bb / retrieve_s / 1e9 if retrieve_s else 0.0,
                lag_p50_s=lags[len(lags) // 2], lag_max_s=lags[-1],
                errors=[e for r in results for e in r.errors][:10])


def delta(a, b, names):
    return {k: b.get(k, 0) - a.get(k, 0) for k in names}


COUNTERS = ("bytes_read", "bytes_written", "blocks_stored", "blocks_retrieved", "evictions",
            "store_rejected", "store_rejected_backlog", "store_failed", "verify_errors",
            "io_errors", "lookup_hits")


def run(args, command):
    """The sustained replay (module comment); returns the report dict and writes --out."""
    requests = trace_format.read_trace(args.trace, args.first, args.count)
    if not requests:
        raise trace_engine.ReplayError("no requests in %s from %d" % (args.trace, args.first))
    geometry = trace_engine.Geometry(args.block_tokens, args.layers, args.object_kib << 10)
    geometry.layout()
    bb = geometry.block_bytes
    unique = trace_format.unique_blocks(requests, args.block_tokens)
    want = args.capacity_blocks or max(1, round(args.capacity_share * unique))
    planned = trace_sim.simulate(requests, trace_policies.Policy(want), args.block_tokens,
                                 args.call_blocks)
    if args.target_write_gbps > 0:
        args.speed = speed_for(args.target_write_gbps, requests, planned.written, bb)
    import trace_replay
    capacity, object_bytes = trace_replay.pool_bytes_for(want, geometry)
    print("%s: %d requests over %.1f s (%d unique blocks, %d to write), %d-byte blocks; speed "
          "%.3f: writes offered at %.3f GB/s" % (
              args.trace, len(requests), trace_format.span_seconds(requests), unique,
              planned.written, bb, args.speed, planned.written * bb * args.speed /
              trace_format.span_seconds(requests) / 1e9 if args.speed else 0.0), flush=True)
    devices = make_devices(args, capacity)
    daemon = None
    try:
        daemon = start_daemon(args, devices, capacity, object_bytes, geometry)
        io_before = devices.io_bytes() if devices is not None else (0, 0)
        m = measure(args, daemon.socket, daemon.admin_socket, geometry, requests)
        io_after = devices.io_bytes() if devices is not None else (0, 0)
        m.device_io = dict(read=io_after[0] - io_before[0], written=io_after[1] - io_before[1])
    finally:
        if daemon is not None:
            daemon.stop()
            daemon.cleanup()
        if devices is not None:
            devices.close()
    rep = report(args, m, requests, unique, planned, geometry, devices)
    print_report(rep)
    if args.out:
        import json
        with open(args.out, "a") as f:
            for line in result_lines(args, rep, command):
                f.write(json.dumps(line, sort_keys=True) + "\n")
    return rep


def measure(args, socket_path, admin, geometry, requests):
    import trace_replay
    m = types.SimpleNamespace()
    m.before = admin_stats.stats(admin)
    m.slots = m.before.get("slots_total", 0) - m.before.get("slots_used", 0)
    call_blocks = min(args.call_blocks, m.slots)
    sampler = stats_sampler(admin, args.sample_ms / 1000.0).start()
    try:
        sampler.mark("mixed")
        m.mixed, m.mixed_wall = trace_replay.run_engines(args, socket_path, geometry, requests,
                                                         call_blocks)
        sampler.mark("drain")
        m.drain_s, m.drained = wait_drained(admin, args.drain_timeout_s)
        sampler.mark("check")
        m.after_mixed = admin_stats.stats(admin)
        m.stored = list(dict.fromkeys(k for r in m.mixed for k in r.stored_keys))
        m.missing = lost_check(socket_path, geometry, call_blocks, m.stored)
        m.after_check = admin_stats.stats(admin)
        sampler.mark("alone")
        m.alone, m.alone_wall = alone_pass(args, socket_path, geometry, requests, m.mixed,
                                           call_blocks)
        sampler.mark("end")
        time.sleep(args.sample_ms / 1000.0)  # one sample after the last Retrieve
    finally:
        sampler.stop()
    m.after = admin_stats.stats(admin)
    m.samples, m.marks, m.sample_errors = sampler.samples, sampler.marks, sampler.errors
    return m


def report(args, m, requests, unique, planned, geometry, devices):
    bb = geometry.block_bytes
    mixed, alone = pass_summary(m.mixed, bb), pass_summary(m.alone, bb)
    d_mixed = delta(m.before, m.after_mixed, COUNTERS)
    d_all = delta(m.before, m.after, COUNTERS)
    d_alone = delta(m.after_check, m.after, COUNTERS)
    asked = sum(r.load_prefix for r in m.mixed)
    limit = (args.max_write_backlog_mib << 20) or m.before.get("store_staging_bytes", 0)
    t0, t1 = m.marks["mixed"], m.marks["drain"]
    write_rate = d_mixed["bytes_written"] / max(m.mixed_wall + m.drain_s, 1e-9)
    floor = max(bb, BACKLOG_FLOOR_S * write_rate)
    verdict = backlog_verdict(m.samples, t0, t1, limit, floor, args.growth_limit)
    verdict["backlog_floor_bytes"] = int(floor)
    dropped = sum(r.dropped for r in m.mixed)
    verdict["backlog_bounded"] = bool(verdict["growth_ok"] and m.drained and dropped == 0 and
                                      verdict["backlog_at_limit_share"] < AT_LIMIT_SHARE_BOUND)
    lost = max(0, m.missing - d_all["evictions"])
    span = trace_format.span_seconds(requests)
    rep = dict(requests=len(requests), unique_blocks=unique, capacity_blocks=m.slots,
               block_bytes=bb, speed=round(args.speed, 4), trace_span_s=span,
               offered_write_gbps=planned.written * bb * args.speed / span / 1e9,
               emulation=devices.emulation if devices else (args.emulation or "host-test"),
               n_devices=len(devices.dirs) if devices else 1, mixed=mixed, alone=alone,
               retrieve_with_writes_vs_alone=(mixed["load_gbps"] / alone["load_gbps"]
                                              if alone["load_gbps"] else 0.0),
               loads_asked_mixed=asked, same_hits=bool(alone["hits"] == asked and
                                                       alone["loaded"] == mixed["loaded"]),
               mixed_wall_s=round(m.mixed_wall, 3), alone_wall_s=round(m.alone_wall, 3),
               mixed_read_gbps=d_mixed["bytes_read"] / m.mixed_wall / 1e9 if m.mixed_wall else 0,
               mixed_write_gbps=(d_mixed["bytes_written"] / (m.mixed_wall + m.drain_s) / 1e9
                                 if m.mixed_wall else 0),
               alone_read_gbps=d_alone["bytes_read"] / m.alone_wall / 1e9 if m.alone_wall else 0,
               alone_bytes_written=d_alone["bytes_written"],
               written=sum(r.written for r in m.mixed), dropped=dropped,
               refusals=sum(r.refusals for r in m.mixed), stored_keys=len(m.stored),
               drain_s=round(m.drain_s, 3), drained=m.drained, missing_blocks=m.missing,
               lost_blocks=lost, daemon=d_all, daemon_mixed=d_mixed,
               durability_lost=bool(m.after.get("durability_lost", 0)),
               sample_errors=m.sample_errors, phases=m.marks, device_io_bytes=m.device_io,
               series=bandwidth_series(m.samples), **verdict)
    rep["ok_no_loss"] = bool(lost == 0 and not rep["durability_lost"] and
                             d_all["verify_errors"] == 0 and d_all["io_errors"] == 0 and
                             d_all["store_failed"] == 0)
    return rep


NOTE = ("pass alone: the same requests at the same arrival times Retrieving the same blocks "
        "(same keys, same engine blocks, same block bytes) with no Store; its Lookups cover only "
        "those keys, carry no prompt length (the advice's count from the mixed pass is replayed), "
        "requests that loaded nothing are skipped, and it runs after the drain, on a pool that "
        "holds the whole window. Bandwidth = bytes retrieved / seconds in Retrieve calls.")


def result_lines(args, rep, command):
    base = dict(bench="trace_replay", mode="sustained", trace=os.path.basename(args.trace),
                emulation=rep["emulation"], n_devices=rep["n_devices"], speed=rep["speed"],
                block_bytes=rep["block_bytes"], first=args.first, count=args.count,
                block_tokens=args.block_tokens, layers=args.layers, object_kib=args.object_kib,
                engines=args.engines, target_write_gbps=args.target_write_gbps,
                offered_write_gbps=rep["offered_write_gbps"], label=args.label,
                machine=platform.node(), command=command, series=rep["series"],
                series_columns=["t_s", "read_gbps", "write_gbps", "backlog_bytes"],
                phases=rep["phases"],
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    verdict = {k: rep[k] for k in (
        "write_backlog_growth", "backlog_bounded", "backlog_max_bytes", "backlog_limit_bytes",
        "backlog_at_limit_share", "drained", "drain_s", "dropped", "refusals")}
    return [dict(base, metric="trace_sustained_read_vs_alone", unit="ratio",
                 value=rep["retrieve_with_writes_vs_alone"], baseline_name="alone_load_gbps",
                 baseline_value=rep["alone"]["load_gbps"],
                 measured_value=rep["mixed"]["load_gbps"], measured_unit="GB/s",
                 goal_met=bool(rep["retrieve_with_writes_vs_alone"] >= 0.9),
                 same_hits=rep["same_hits"], loaded=rep["mixed"]["loaded"],
                 hits_alone=rep["alone"]["hits"], mixed_read_gbps=rep["mixed_read_gbps"],
                 mixed_write_gbps=rep["mixed_write_gbps"],
                 alone_read_gbps=rep["alone_read_gbps"],
                 device_io_bytes=rep["device_io_bytes"], note=NOTE),
            dict(base, metric="trace_sustained_backlog_growth", unit="ratio",
                 value=rep["write_backlog_growth"], goal_met=rep["backlog_bounded"], **verdict),
            dict(base, metric="trace_sustained_lost_blocks", unit="blocks",
                 value=rep["lost_blocks"], goal_met=rep["ok_no_loss"],
                 stored_keys=rep["stored_keys"], missing_blocks=rep["missing_blocks"],
                 evictions=rep["daemon"]["evictions"],
                 verify_errors=rep["daemon"]["verify_errors"],
                 io_errors=rep["daemon"]["io_errors"],
                 store_failed=rep["daemon"]["store_failed"],
                 durability_lost=rep["durability_lost"],
                 device_io_bytes=rep["device_io_bytes"])]


def print_report(rep):
    mx, al = rep["mixed"], rep["alone"]
    print("sustained on %s:%d, %d-byte blocks, speed %.3f (writes offered %.3f GB/s): mixed "
          "%.1f s, reads %.3f GB/s and writes %.3f GB/s over the pass; lag p50 %.3f s, max "
          "%.3f s" % (rep["emulation"], rep["n_devices"], rep["block_bytes"], rep["speed"],
                      rep["offered_write_gbps"], rep["mixed_wall_s"], rep["mixed_read_gbps"],
                      rep["mixed_write_gbps"], mx["lag_p50_s"], mx["lag_max_s"]))
    print("  loads: with writes %d blocks at %.3f GB/s, alone %d at %.3f GB/s (hits %d of %d "
          "asked; same: %s): retrieve_with_writes_vs_alone %.3f" % (
              mx["loaded"], mx["load_gbps"], al["loaded"], al["load_gbps"], al["hits"],
              rep["loads_asked_mixed"], rep["same_hits"], rep["retrieve_with_writes_vs_alone"]))
    print("  backlog: growth %.3f (mid %.0f, last %.0f bytes), max %d of limit %d, at limit "
          "%.3f, drained %s in %.3f s, dropped %d, refusals %d: bounded %s" % (
              rep["write_backlog_growth"], rep["backlog_mid_mean_bytes"],
              rep["backlog_last_mean_bytes"], rep["backlog_max_bytes"],
              rep["backlog_limit_bytes"], rep["backlog_at_limit_share"], rep["drained"],
              rep["drain_s"], rep["dropped"], rep["refusals"], rep["backlog_bounded"]))
    d = rep["daemon"]
    print("  lost: %d (%d stored keys, %d not found, %d evictions; verify %d, io %d, store "
          "failed %d, durability lost %s): no loss %s" % (
              rep["lost_blocks"], rep["stored_keys"], rep["missing_blocks"], d["evictions"],
              d["verify_errors"], d["io_errors"], d["store_failed"], rep["durability_lost"],
              rep["ok_no_loss"]))
    if rep["device_io_bytes"]["read"] or rep["device_io_bytes"]["written"]:
        print("  the array's cgroup saw %.1f MB read and %.1f MB written" % (
            rep["device_io_bytes"]["read"] / 1e6, rep["device_io_bytes"]["written"] / 1e6))

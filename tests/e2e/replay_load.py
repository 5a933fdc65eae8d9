"""The Mooncake-format trace replayed against a running tuttid as background load: other engines
beside the one being measured (ttft_grid.py's part advice_replay, issue 23 section 4).

The replay runs in a child process (this file as a script), so that its Python work never holds
the measuring process's GIL. It is bench/trace_replay.py's replay (run_engines, trace_engine's
engines: per request a Lookup of its chain with the prompt's length, a Retrieve of the hits
tuttid advises loading, a Store of the blocks computed, not waiting for durability, refused
blocks offered again and then dropped) of the requests from `first` at the trace's arrival times
sped up so that the blocks the requests reference (loaded or stored) arrive at `gbps` GB/s. Each
served request is one JSON line on the child's stdout ({"done": {...}}, its start on
time.monotonic(), the system-wide clock both processes read); a failed request, a Retrieve that
failed or came back short is an {"error": ...} line. The child stops starting requests when its
stdin closes.

    load = ReplayLoad(socket, trace, layers, object_bytes, gbps).start()
    t0 = time.monotonic(); ...; load.check()  # raises once the replay failed or ended
    t1 = time.monotonic(); load.stop()        # raises when it failed
    load.describe(t0, t1)                     # what it did in [t0, t1]
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench")
GB = 1e9
COUNTS = ("blocks", "hits", "loaded", "load_failed", "written", "already_present", "dropped",
          "refusals")


class ReplayLoad:
    def __init__(self, socket_path, trace, layers, object_bytes, gbps, engines=2, first=0,
                 count=0, call_blocks=128, block_tokens=512):
        self.argv = [sys.executable, os.path.abspath(__file__), "--socket", socket_path,
                     "--trace", trace, "--layers", str(layers), "--object-bytes",
                     str(object_bytes), "--gbps", str(gbps), "--engines", str(engines),
                     "--first", str(first), "--count", str(count), "--call-blocks",
                     str(call_blocks), "--block-tokens", str(block_tokens)]
        self.proc = self.info = self._reader = None
        self.done, self.errors, self.ended = [], [], None
        self._lock = threading.Lock()

    def start(self, timeout=120.0):
        """Starts the child; returns once it served a request. Raises RuntimeError when it failed
        or served none within `timeout` seconds."""
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self._reader = threading.Thread(target=self._read, name="replay-load-reader",
                                        daemon=True)
        self._reader.start()
        t0 = time.monotonic()
        while not self.done and time.monotonic() - t0 < timeout:
            if self.errors or self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if not self.done:
            self.kill()
            raise RuntimeError("the trace replay served no request in %.0f s: %s" % (
                time.monotonic() - t0, self._why()))
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                msg = {"error": "not a JSON line: %r" % line[:200]}
            with self._lock:
                if "start" in msg:
                    self.info = msg["start"]
                elif "done" in msg:
                    self.done.append(msg["done"])
                elif "end" in msg:
                    self.ended = msg["end"]
                else:
                    self.errors.append(msg.get("error", line))

    def _why(self):
        rc = self.proc.poll() if self.proc else None
        return "; ".join(self.errors[:3]) or ("it exited with %s" % rc if rc is not None
                                              else "no error reported")

    def check(self):
        """Raises RuntimeError once the replay failed, exited, or ended its requests (the load
        it was asked to give is then gone)."""
        if self.errors or self.ended is not None or self.proc.poll() is not None:
            raise RuntimeError("the trace replay stopped: %s" % (
                self._why() if self.errors or self.ended is None else
                "it served its last request (%d requests): the load it was to give is gone "
                "(replay fewer GB/s, or from an earlier request)" % len(self.done)))

    def stop(self, timeout=60.0):
        """Stops the child (requests in flight finish); raises RuntimeError when it failed."""
        if self.proc is None:
            return
        self.proc.stdin.close()
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("the trace replay did not stop within %.0f s" % timeout)
        self._close()
        if rc != 0 or self.errors:
            raise RuntimeError("the trace replay failed (exit %s): %s" % (rc, self._why()))

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self):
        """After the child exited: the reader's last lines, then the pipes closed."""
        if self.proc is None:
            return
        self._reader.join(10)
        for f in (self.proc.stdin, self.proc.stdout):
            if not f.closed:
                f.close()

    def window(self, t0, t1):
        """Totals of the requests that started in [t0, t1] (time.monotonic()), with GB read and
        written (blocks x block bytes), GB/s over the window and the requests' lag behind their
        arrival times."""
        with self._lock:
            rs = [r for r in self.done if t0 <= r["started"] <= t1]
            allr = list(self.done)
        out = {k: sum(r[k] for r in rs) for k in COUNTS}
        bb, span = self.info["block_bytes"], max(t1 - t0, 1e-9)
        # Lag: start - due, the arrival clock set so that the least late request is on time.
        zero = min(r["started"] - r["due_s"] for r in allr)
        lags = sorted(r["started"] - r["due_s"] - zero for r in rs) or [0.0]
        out.update(requests=len(rs), seconds=span, gb_read=out["loaded"] * bb / GB,
                   gb_written=out["written"] * bb / GB,
                   retrieve_s=sum(r["retrieve_s"] for r in rs), lag_p50_s=lags[len(lags) // 2],
                   lag_max_s=lags[-1])
        out["gbps"] = (out["gb_read"] + out["gb_written"]) / span
        return out

    def describe(self, t0, t1):
        w, i = self.window(t0, t1), self.info
        return ("the trace replay (%s, a child process of %d engines, %d KiB blocks of %d "
                "tokens, from request %d at %.2fx the trace's rate: %.2f GB/s of referenced "
                "blocks offered) over those %.1f s started %d requests (%d blocks referenced, "
                "prefix hit ratio %.3f, %d hits loaded as advised), read %.2f GB and wrote %.2f GB "
                "(%.2f GB/s together; its loads %.2f GB/s in Retrieve), %d stores refused for "
                "room and %d dropped, lag behind the arrival times p50 %.2f s max %.2f s" % (
                    os.path.basename(i["trace"]), i["engines"], i["block_bytes"] >> 10,
                    i["block_tokens"], i["first"], i["speed"], i["offered_gbps"], w["seconds"],
                    w["requests"], w["blocks"], w["hits"] / max(w["blocks"], 1), w["loaded"],
                    w["gb_read"], w["gb_written"], w["gbps"],
                    w["gb_read"] / w["retrieve_s"] if w["retrieve_s"] else 0.0, w["refusals"],
                    w["dropped"], w["lag_p50_s"], w["lag_max_s"]))


# --- the child -----------------------------------------------------------------------------------

def child(argv):
    ap = argparse.ArgumentParser(description="the background replay (see the module comment)")
    for name in ("--socket", "--trace"):
        ap.add_argument(name, required=True)
    for name, default in (("--layers", 2), ("--object-bytes", 16384), ("--engines", 2),
                          ("--first", 0), ("--count", 0), ("--call-blocks", 128),
                          ("--block-tokens", 512)):
        ap.add_argument(name, type=int, default=default)
    ap.add_argument("--gbps", type=float, required=True)
    a = ap.parse_args(argv)
    sys.path.insert(0, BENCH)
    import trace_engine
    import trace_format
    import trace_replay
    lock = threading.Lock()

    def emit(**msg):
        with lock:
            print(json.dumps(msg), flush=True)

    try:
        requests = trace_format.read_trace(a.trace, a.first, a.count)
        if len(requests) < 2:
            raise trace_engine.ReplayError("%d requests in %s from %d" % (len(requests), a.trace,
                                                                          a.first))
        geometry = trace_engine.Geometry(a.block_tokens, a.layers, a.object_bytes)
        geometry.layout()
        refs = sum(len(trace_format.chain(r, a.block_tokens)) for r in requests)
        span = trace_format.span_seconds(requests)
        speed = a.gbps * GB * span / (refs * geometry.block_bytes)
        emit(start=dict(trace=a.trace, first=a.first, requests=len(requests), span_s=span,
                        engines=a.engines, block_bytes=geometry.block_bytes,
                        block_tokens=a.block_tokens, speed=speed, offered_gbps=a.gbps))
        halt = threading.Event()
        threading.Thread(target=lambda: (sys.stdin.read(), halt.set()), daemon=True).start()
        ts0 = requests[0].timestamp_ms

        def serve(engine, i, req):
            started = time.monotonic()
            try:
                r = engine.serve(i, req)
            except Exception as e:
                emit(error="request %d: %r" % (a.first + i, e))
                raise
            if r.errors or r.load_failed:
                emit(error="request %d: %d blocks failed to load: %s" % (
                    a.first + i, r.load_failed, r.errors[:3]))
            emit(done=dict({k: getattr(r, k) for k in COUNTS}, i=a.first + i, started=started,
                           due_s=(req.timestamp_ms - ts0) / 1000.0 / speed,
                           retrieve_s=r.retrieve_s))
            return r

        opts = types.SimpleNamespace(engines=a.engines, speed=speed, wait_durable=False,
                                     store_retries=3, staging_wait_ms=1000, verify=True)
        _, wall = trace_replay.run_engines(opts, a.socket, geometry, requests, a.call_blocks,
                                           serve, halt)
        if not halt.is_set():
            emit(end=dict(wall_s=wall))
        return 0
    except Exception as e:
        emit(error="the replay: %r" % e)
        return 1


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))

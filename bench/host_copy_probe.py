"""What the host's memory gives to copies, alone and beside a pinned copy to the GPU: the ceiling
of an emulated array on tmpfs, where every read and write is a CPU copy through DRAM (a tmpfs
read copies page cache into tuttid's staging; the retrieve then DMAs that staging to the GPU).

    python3 bench/host_copy_probe.py [--mib 512] [--seconds 1.5] [--threads 1,2,4,8,12,16] \
        [--out bench/results/host_copy_probe.jsonl] [--label TEXT]

Rows (metric host_copy_gbps): per thread count, T threads each copying its own --mib buffer into
another (torch CPU copies, one intra-op thread each, so T copies run at once), the copy rate
summed over threads (bytes copied, not bytes of DRAM traffic: a copy reads its source and writes
its destination, and the destination's lines are usually read first); with "beside_h2d": the same
while one stream copies a 256 MiB pinned buffer to the GPU without pause, and that copy's rate
("h2d_gbps"). A row "h2d_alone_gbps" gives the pinned copy by itself. Not a test: no assertion.
"""

import argparse
import datetime
import json
import os
import shlex
import socket
import sys
import threading
import time

import torch

GB = 1e9


def copy_rate(threads, mib, seconds):
    """Bytes per second copied by `threads` threads, each copying its own buffer repeatedly."""
    n = mib << 20
    pairs = [(torch.ones(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8))
             for _ in range(threads)]
    for src, dst in pairs:
        dst.copy_(src)  # first touch outside the timed part
    stop = threading.Event()
    copied = [0] * threads

    def run(i):
        src, dst = pairs[i]
        while not stop.is_set():
            dst.copy_(src)
            copied[i] += n

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return sum(copied) / (time.perf_counter() - t0)


class H2dCopier:
    """One stream copying a pinned 256 MiB buffer to the GPU until stopped; rate() after stop()."""

    def __init__(self):
        n = 256 << 20
        self.n = n
        self.host = torch.ones(n, dtype=torch.uint8).pin_memory()
        self.dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        self.stop_ev = threading.Event()
        self.moved, self.secs = 0, 0.0
        self.thread = threading.Thread(target=self._run)

    def _run(self):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            t0 = time.perf_counter()
            while not self.stop_ev.is_set():
                for _ in range(4):
                    self.dev.copy_(self.host, non_blocking=True)
                stream.synchronize()
                self.moved += 4 * self.n
            self.secs = time.perf_counter() - t0

    def start(self):
        self.thread.start()
        time.sleep(0.2)
        return self

    def stop(self):
        self.stop_ev.set()
        self.thread.join()
        return self.moved / self.secs if self.secs else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=512, help="MiB per thread's buffer (not cached)")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--threads", default="1,2,4,8,12,16")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results", "host_copy_probe.jsonl"))
    ap.add_argument("--label", default="")
    ap.add_argument("--machine", default="%s (%d cores)" % (socket.gethostname(), os.cpu_count()))
    args = ap.parse_args()
    torch.set_num_threads(1)
    gpu = torch.cuda.is_available()
    common = {"bench": "host_copy_probe", "label": args.label, "machine": args.machine,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
              "mib_per_thread": args.mib}
    out = open(args.out, "a")

    def emit(**row):  # each row as soon as it is measured: a run cut short keeps what it had
        out.write(json.dumps(dict(common, **row)) + "\n")
        out.flush()

    if gpu:
        c = H2dCopier().start()
        time.sleep(args.seconds)
        alone = c.stop()
        emit(metric="h2d_alone_gbps", value=round(alone / GB, 3))
        print("pinned copy to the GPU alone: %.2f GB/s" % (alone / GB))
    for t in [int(x) for x in args.threads.split(",")]:
        rate = copy_rate(t, args.mib, args.seconds)
        emit(metric="host_copy_gbps", threads=t, beside_h2d=False, value=round(rate / GB, 3))
        line = "%2d threads: copy %.2f GB/s" % (t, rate / GB)
        if gpu:
            c = H2dCopier().start()
            rate2 = copy_rate(t, args.mib, args.seconds)
            h2d = c.stop()
            emit(metric="host_copy_gbps", threads=t, beside_h2d=True, value=round(rate2 / GB, 3),
                 h2d_gbps=round(h2d / GB, 3))
            line += "; beside a pinned copy to the GPU: copy %.2f GB/s, that copy %.2f GB/s" % (
                rate2 / GB, h2d / GB)
        print(line, flush=True)
    out.close()


if __name__ == "__main__":
    main()

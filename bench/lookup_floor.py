"""What a Lookup costs below tuttid's work: the floor the scheduler's first call stands on
(issue 21 section 4). Three round trips of a 2048-key-sized request on this machine:

- grpc_refused: tutti._lookup (libgrpc++) sends a 2048-key LookupRequest of an unknown session
  to a real tuttid, which refuses it at the session check (NOT_FOUND): gRPC's round trip with
  next to no work in tuttid;
- grpc_lookup_1 / grpc_lookup_2048: Client.lookup_many of 1 and of 2048 stored keys (a lease
  each, released untimed);
- socket_refused / socket_lookup_1 / socket_lookup_2048: the same three through tuttid's lookup
  socket (<socket>.lookup, common/lookup_wire.h) instead of gRPC;
- raw_socket: the same 32 KiB as a length-prefixed message over a plain unix stream socket to a
  Python process that answers 44 bytes: what carrying it costs with no server work at all.

    TUTTID_BIN=bazel-bin/daemon/tuttid PYTHONPATH=bazel-bin/client/python/site \\
        /usr/bin/python3 bench/lookup_floor.py [--iterations 3000] [--out FILE] [--machine TEXT]

Writes lookup_floor_<name>_p50_us / _p99_us rows (JSON lines, the bench's format) to --out
(bench/results/vllm_lookup_latency.jsonl by default). Not a test.
"""

import argparse
import json
import multiprocessing
import os
import shlex
import socket
import struct
import sys
import tempfile
import time

import tutti
import tutti.client as tc
from tutti.testing import Tuttid
from tutti.v1 import kvcache_pb2 as pb

CHAIN, BS, HEADS, HEAD = 2048, 16, 4, 32


def timed(fn, n, warm=200, after=None):
    for _ in range(warm):
        r = fn()
        if after:
            after(r)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = fn()
        ts.append(time.perf_counter() - t0)
        if after:
            after(r)
    ts.sort()
    return ts[len(ts) // 2] * 1e6, ts[min(len(ts) - 1, int(0.99 * len(ts)))] * 1e6


def _serve(path, ready):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(1)
    ready.set()
    c, _ = s.accept()
    answer = struct.pack("<I", 40) + bytes(40)
    while True:
        head = c.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return
        (n,) = struct.unpack("<I", head)
        if len(c.recv(n, socket.MSG_WAITALL)) < n:
            return
        c.sendall(answer)


def raw_socket(n, size):
    d = tempfile.mkdtemp(prefix="tutti-floor-")
    path = os.path.join(d, "s.sock")
    ready = multiprocessing.Event()
    p = multiprocessing.Process(target=_serve, args=(path, ready), daemon=True)
    p.start()
    ready.wait(10)
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(path)
    msg = struct.pack("<I", size) + os.urandom(size)

    def rt():
        c.sendall(msg)
        (m,) = struct.unpack("<I", c.recv(4, socket.MSG_WAITALL))
        c.recv(m, socket.MSG_WAITALL)
    try:
        return timed(rt, n)
    finally:
        c.close()
        p.join(5)
        os.unlink(path)
        os.rmdir(d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=3000)
    ap.add_argument("--out", default="bench/results/vllm_lookup_latency.jsonl")
    ap.add_argument("--machine", default="build machine (2-core VM)")
    args = ap.parse_args()
    native = tc.native_lookup()
    if native is None:
        sys.exit("lookup_floor: tutti._lookup does not load")
    out = {}
    daemon = Tuttid(object_bytes=BS * HEADS * 2 * HEAD * 4, max_objects=2, capacity=1 << 30,
                    max_blocks_per_call=CHAIN, store_staging=256 << 20).start()
    try:
        layout = tutti.KvLayout(1, HEADS, 2 * HEAD, 4, BS, "packed")
        shm = tutti.SharedMemory(tutti.cache_bytes(layout, CHAIN), "lookup-floor")
        obj = tutti.ObjectTensor(shm.address, BS * HEADS * 2 * HEAD * 4)
        c = tutti.Client.attach(tutti.Namespace(model_id="lookup-floor", layout=layout), CHAIN,
                                [obj], host_regions=[shm.region()], socket_path=daemon.socket)
        keys = [os.urandom(16) for _ in range(CHAIN)]
        for b in range(0, CHAIN, 256):
            c.store(keys[b:b + 256], list(range(b, b + 256)), wait_durable=True)
        packed = b"".join(keys)
        refused = pb.LookupRequest(session_id=1 << 40, session_token=b"x" * 16,
                                   packed_keys=packed).SerializeToString()
        for way, on_socket in (("grpc", False), ("socket", True)):
            ch = native.open(daemon.socket, on_socket)
            assert bool(native.on_socket(ch)) == on_socket, way
            c._native = ch  # lookup_many's channel: this way
            code = native.lookup([(ch, refused, 1.0)])[0][0]
            assert code == 5, code  # NOT_FOUND
            out[way + "_refused"] = timed(lambda: native.lookup([(ch, refused, 1.0)]),
                                          args.iterations)
            for name, k in (("_lookup_1", packed[:16]), ("_lookup_2048", packed)):
                out[way + name] = timed(lambda: tutti.Client.lookup_many([(c, k, None)])[0],
                                        args.iterations, after=c.release)
            assert bool(native.on_socket(ch)) == on_socket, way
        c.detach()
        shm.close()
    finally:
        daemon.cleanup()
    out["raw_socket"] = raw_socket(args.iterations, len(packed) + 32)
    command = "TUTTID_BIN=%s PYTHONPATH=%s %s %s" % (
        shlex.quote(os.environ.get("TUTTID_BIN", "")),
        shlex.quote(os.environ.get("PYTHONPATH", "")), sys.executable,
        " ".join(shlex.quote(a) for a in sys.argv))
    detail = {"grpc_refused": "a 2048-key LookupRequest of an unknown session through tutti._lookup"
                              " (libgrpc++), refused by tuttid at the session check",
              "grpc_lookup_1": "Client.lookup_many of 1 stored key through tutti._lookup",
              "grpc_lookup_2048": "Client.lookup_many of 2048 stored keys through tutti._lookup",
              "socket_refused": "a 2048-key LookupRequest of an unknown session through "
                                "tutti._lookup on tuttid's lookup socket, refused at the session "
                                "check",
              "socket_lookup_1": "Client.lookup_many of 1 stored key through tutti._lookup on "
                                 "tuttid's lookup socket",
              "socket_lookup_2048": "Client.lookup_many of 2048 stored keys through tutti._lookup "
                                    "on tuttid's lookup socket",
              "raw_socket": "the same 32 KiB, length-prefixed, over a plain unix stream socket "
                            "to a Python process answering 44 bytes"}
    load = os.getloadavg()[0]
    with open(args.out, "a") as f:
        for name, (p50, p99) in out.items():
            for label, v in (("p50", p50), ("p99", p99)):
                f.write(json.dumps(dict(
                    bench="lookup_floor", metric="lookup_floor_%s_%s_us" % (name, label),
                    value=round(v, 1), unit="us", baseline_name=None, baseline_value=None,
                    ratio=None, detail="%s; %d iterations after 200 warm-up; load average %.2f "
                    "at the end" % (detail[name], args.iterations, load),
                    machine=args.machine,
                    date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    command=command)) + "\n")
            print("%-18s p50 %6.1f us  p99 %6.1f us" % (name, p50, p99), flush=True)


if __name__ == "__main__":
    main()

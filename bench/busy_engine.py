"""A stand-in for an inference engine that keeps every SM of the GPU busy: bf16 matrix
multiplications back to back, each timed, so that a parent can count how much compute the engine
lost while something else (tuttid's retrieve) ran on the same GPU.

    python3 bench/busy_engine.py --seconds S [--n 8192] [--device cpu]

Prints "ready <monotonic s>" once warmed up, then runs for S seconds and prints one JSON line:
{"ends": [monotonic seconds at which each multiplication finished], "op_ms": [each one's own time:
on the GPU between CUDA events around it, on the CPU its call], "flops_per_op": F}. Each
multiplication is waited for before the next is launched, so the time between two ends is the
multiplication's own time plus the host's turnaround (the wait's wake-up and the next launch). The
times are CLOCK_MONOTONIC (time.monotonic), the same clock in every process of the machine, so the
parent can cut them into windows of its own. Exit status 0, or 1 with the CUDA error on stderr.
"""

import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--n", type=int, default=8192, help="square matrix size")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: float32 on the host (a dry run of the parent's logic)")
    args = ap.parse_args()
    import torch
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("busy_engine: no CUDA device", file=sys.stderr)
        return 1
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(args.n, args.n, device=args.device, dtype=dtype)
    b = torch.randn(args.n, args.n, device=args.device, dtype=dtype)
    c = torch.empty_like(a)
    for _ in range(20):  # warm-up: cuBLAS picks its kernel, clocks settle
        torch.matmul(a, b, out=c)
    begun = torch.cuda.Event(enable_timing=True) if cuda else None
    done = torch.cuda.Event(enable_timing=True) if cuda else None
    if cuda:
        torch.cuda.synchronize()
    print("ready %.6f" % time.monotonic(), flush=True)
    ends, op_ms = [], []
    stop = time.monotonic() + args.seconds
    while True:
        t = time.monotonic()
        if cuda:
            begun.record()
        torch.matmul(a, b, out=c)
        if cuda:
            done.record()
            done.synchronize()
        now = time.monotonic()
        ends.append(now)
        op_ms.append(begun.elapsed_time(done) if cuda else (now - t) * 1e3)
        if now >= stop:
            break
    print(json.dumps({"ends": ends, "op_ms": op_ms, "flops_per_op": 2 * args.n ** 3}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

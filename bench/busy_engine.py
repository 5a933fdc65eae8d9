"""A stand-in for an inference engine that keeps every SM of the GPU busy: bf16 matrix
multiplications back to back, each timed, so that a parent can count how much compute the engine
lost while something else (tuttid's retrieve) ran on the same GPU.

    python3 bench/busy_engine.py --seconds S [--n 8192] [--device cpu]

Prints "ready <monotonic s>" once warmed up, then runs for S seconds and prints one JSON line:
{"ends": [monotonic seconds at which each multiplication finished], "flops_per_op": F}. The
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
    done = torch.cuda.Event() if cuda else None
    if cuda:
        torch.cuda.synchronize()
    print("ready %.6f" % time.monotonic(), flush=True)
    ends = []
    stop = time.monotonic() + args.seconds
    while True:
        torch.matmul(a, b, out=c)
        if cuda:
            done.record()
            done.synchronize()
        now = time.monotonic()
        ends.append(now)
        if now >= stop:
            break
    print(json.dumps({"ends": ends, "flops_per_op": 2 * args.n ** 3}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

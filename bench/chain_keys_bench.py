"""What hashing a prompt's block keys costs in the Python client, before its first Lookup:
tutti.chain_keys (in C where tutti._keychain loads, since stop 60; else in Python, the tokens
packed in one call) against the scheme's definition done one token at a time (tutti-sha256-v1, as
the client did before stop 59), on the same tokens in the same run.
Each: the best of --reps timings of --runs calls. The two must give the same keys (exit 1 if not).

    PYTHONPATH=bazel-bin/client/python/site /usr/bin/python3 bench/chain_keys_bench.py \\
        [--tokens 32768] [--block-tokens 16] [--out bench/results/chain_keys.jsonl] [--label L]

Writes one JSON line per run (chain_keys_ms_vs_per_token: a ratio, lower is better). Not a test.
"""

import argparse
import datetime
import hashlib
import json
import platform
import random
import shlex
import struct
import sys
import time

import tutti


def per_token(tokens, block_tokens, parent=bytes(16)):
    """tutti-sha256-v1 as written: each token masked and packed on its own."""
    words = [int(t) & 0xFFFFFFFF for t in tokens]
    head = struct.pack("<I", block_tokens)
    fmt = "<%dI" % block_tokens
    keys, prev = [], parent
    for b in range(len(words) // block_tokens):
        block = words[b * block_tokens:(b + 1) * block_tokens]
        prev = hashlib.sha256(prev + head + struct.pack(fmt, *block)).digest()[:16]
        keys.append(prev)
    return keys


def best_ms(fn, tokens, block_tokens, runs, reps):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(runs):
            fn(tokens, block_tokens)
        best = min(best, (time.perf_counter() - t0) / runs * 1e3)
    return best


def ratio_line(bench, metric, ms, baseline_name, base, label, machine="", **fields):
    """One JSON line of the benchmarks' format: `ms` against `base` (ms) measured in the same run,
    with the date, the machine (default: host, arch, Python) and the exact command."""
    return dict(bench=bench, metric=metric, value=round(ms / base, 4), unit="ratio",
                measured_value=round(ms, 4), measured_unit="ms", baseline_name=baseline_name,
                baseline_value=round(base, 4), **fields, python=platform.python_version(),
                label=label, machine=machine or "%s (%s, Python %s)" % (
                    platform.node(), platform.machine(), platform.python_version()),
                date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                command=" ".join(shlex.quote(a) for a in [sys.executable] + sys.argv))


def append_line(path, line):
    """Appends `line` to the JSON-lines file `path` (nothing without a path)."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(line) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    rng = random.Random(1)
    tokens = [rng.randrange(128256) for _ in range(args.tokens)]  # Llama 3's vocabulary
    if tutti.chain_keys(tokens, args.block_tokens) != per_token(tokens, args.block_tokens):
        print("chain_keys_bench: tutti.chain_keys differs from the scheme's definition",
              file=sys.stderr)
        return 1
    base = best_ms(per_token, tokens, args.block_tokens, args.runs, args.reps)
    ms = best_ms(tutti.chain_keys, tokens, args.block_tokens, args.runs, args.reps)
    line = ratio_line("chain_keys", "chain_keys_ms_vs_per_token", ms, "per_token", base,
                      args.label, tokens=args.tokens, block_tokens=args.block_tokens,
                      path="c" if tutti._hash._native is not None else "python")
    print("chain_keys: %.3f ms against %.3f ms one token at a time (%.3f) for %d tokens" % (
        ms, base, ms / base, args.tokens))
    append_line(args.out, line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

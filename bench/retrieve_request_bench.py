"""What building a Retrieve's request costs in the Python client, between the Lookup's answer and
the request leaving: the blocks encoded as bytes (tutti._transfers._encoded_block_pairs, the
client's way since stop 60) against protobuf building --blocks BlockPairs and serializing the
message (the client's way before), on the same keys in the same run. Each: the best of --reps
timings of --runs builds. The two must parse to the same message (exit 1 if not).

    PYTHONPATH=bazel-bin/client/python/site /usr/bin/python3 bench/retrieve_request_bench.py \\
        [--blocks 2007] [--out bench/results/retrieve_request.jsonl] [--label L] [--machine M]

Writes one JSON line per run (retrieve_request_ms_vs_protobuf: a ratio, lower is better). Not a
test.
"""

import argparse
import sys

import tutti
# Beside this file: the same timing (fn(a, b), the best of reps) and line format.
from chain_keys_bench import append_line, best_ms, ratio_line
from tutti import _transfers
from tutti.v1 import kvcache_pb2 as pb

FIELDS = dict(session_id=7, session_token=bytes(16), lease_id=5, layer_begin=0, layer_end=32,
              ticket=3)


def by_protobuf(keys, blocks):
    req = pb.RetrieveRequest(**FIELDS)
    for k, b in zip(keys, blocks):
        req.blocks.add(key=k, engine_block=int(b))
    return req.SerializeToString()


def encoded(keys, blocks):
    return pb.RetrieveRequest(**FIELDS).SerializeToString() + \
        _transfers._encoded_block_pairs(keys, blocks)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=2007)  # a 32K prompt, 98% cached, 16 a block
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--label", default="")
    ap.add_argument("--machine", default="")
    args = ap.parse_args(argv)
    keys = tutti.chain_keys(list(range(16 * args.blocks)), 16)
    blocks = list(range(5000, 5000 + args.blocks))  # two-byte varints, as in a large cache
    if pb.RetrieveRequest.FromString(encoded(keys, blocks)) != \
            pb.RetrieveRequest.FromString(by_protobuf(keys, blocks)):
        print("retrieve_request_bench: the encoded request differs from protobuf's",
              file=sys.stderr)
        return 1
    base = best_ms(by_protobuf, keys, blocks, args.runs, args.reps)
    ms = best_ms(encoded, keys, blocks, args.runs, args.reps)
    line = ratio_line("retrieve_request", "retrieve_request_ms_vs_protobuf", ms,
                      "protobuf_build_and_serialize", base, args.label, args.machine,
                      blocks=args.blocks)
    print("Retrieve request of %d blocks: %.3f ms encoded against %.3f ms by protobuf (%.3f)" % (
        args.blocks, ms, base, ms / base))
    append_line(args.out, line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

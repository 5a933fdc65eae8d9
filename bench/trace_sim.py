"""trace_sim: a pure-Python cache simulation of a Mooncake-format trace (issue 23), the
independent count the replay (trace_replay.py) is checked against, and the admission table of
section 2.

    python3 bench/trace_sim.py TRACE [--capacities 0.05,0.2,0.5,1] [--policies ...]
                               [--block-tokens 512] [--out bench/results/trace_admission.jsonl]

Per request, as an engine drives tuttid: Lookup of its chain (trace_format.chain) -> prefix hits;
Store of the blocks after the hits in calls of at most --chunk blocks, each call offering the
blocks not cached when it arrives (tuttid answers the others "already present"). The policy
(trace_policies.py) decides which offered blocks are written and what is evicted. Counted:
block references, prefix hits, blocks written, declined, evicted.

Capacity: a share of the trace's unique blocks (or --capacity-blocks). Each policy's figures go
to --out as JSON lines: `trace_hit_ratio_vs_best_rule` (its hit ratio / the better of store-all
LRU and second-sight admission at the same capacity) and `trace_bytes_written_vs_store_all`
(its blocks written / store-all's), with fields trace, capacity_share, policy, and the counts.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
from dataclasses import asdict, dataclass
from typing import Dict, List, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_format  # noqa: E402
import trace_policies  # noqa: E402

DEFAULT_CHUNK = 512


@dataclass
class SimCounts:
    requests: int = 0
    blocks: int = 0         # block references (every request's chain)
    hits: int = 0           # prefix hits
    missed_lookups: int = 0  # requests whose chain stopped short
    offered: int = 0        # blocks offered to Store (not cached when the call came)
    written: int = 0
    declined: int = 0
    evicted: int = 0
    # dram_front: DRAM hits written to the SSD at a Lookup (counted in written too), blocks in
    # DRAM written at a new offer (in written too), and blocks dropped from DRAM unpromoted.
    promoted: int = 0
    promoted_on_offer: int = 0
    dram_dropped: int = 0

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.blocks if self.blocks else 0.0


def chunks(seq: Sequence, n: int):
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


def simulate(requests: Sequence[trace_format.Request], policy: trace_policies.Policy,
             block_tokens: int = trace_format.TRACE_BLOCK_TOKENS,
             chunk: int = DEFAULT_CHUNK) -> SimCounts:
    """Runs `requests` through `policy`'s cache; chunk must not exceed its capacity (a Store
    call larger than the cache would evict its own blocks, which tuttid cannot)."""
    if chunk > policy.cache.capacity:
        chunk = policy.cache.capacity
    c = SimCounts()
    if hasattr(policy, "prepare"):
        policy.prepare(trace_format.chain(r, block_tokens) for r in requests)
    for req in requests:
        blocks = trace_format.chain(req, block_tokens)
        hits = policy.lookup(blocks)
        c.requests += 1
        c.blocks += len(blocks)
        c.hits += hits
        c.missed_lookups += hits < len(blocks)
        partial = req.input_length % block_tokens != 0
        ctx = trace_policies.StoreContext(hits, len(blocks), partial)
        rest = blocks[hits:]
        for call in chunks(rest, chunk):
            offered = [b for b in call if b not in policy.cache]
            ends = bool(offered) and offered[-1] == blocks[-1]
            written = policy.store(offered, ctx, ends)
            c.offered += len(offered)
            c.written += len(written)
            c.declined += len(offered) - len(written)
    c.evicted = policy.cache.evictions
    c.promoted = getattr(policy, "promoted", 0)
    c.written += c.promoted  # DRAM hits written to the SSD by tuttid
    c.promoted_on_offer = getattr(policy, "promoted_on_offer", 0)
    dram = getattr(policy, "dram", None)
    # Declined blocks neither promoted nor in DRAM at the end: evicted, or never inserted (a
    # call declining more than DRAM holds).
    c.dram_dropped = (c.declined - c.promoted - c.promoted_on_offer - len(dram)
                      if dram is not None else 0)
    return c


# --- the admission table ----------------------------------------------------------------------

# name -> (policy class name, its keyword arguments; "capacity" in a value is a factor of it).
VARIANTS = {
    "store_all": ("store_all", {}),
    "second_sight": ("second_sight", {}),
    "store_all_tail_first": ("store_all", {"recency": "tail_first"}),
    "second_sight_ghost1x": ("second_sight", {"ghost_blocks": ("capacity", 1)}),
    "continuation_ghost1x": ("continuation", {"ghost_blocks": ("capacity", 1)}),
    "continuation_ghost1x_tail_first": ("continuation", {"ghost_blocks": ("capacity", 1),
                                                         "recency": "tail_first"}),
    "continuation_ghost2x_tail_first": ("continuation", {"ghost_blocks": ("capacity", 2),
                                                         "recency": "tail_first"}),
    "continuation_ghost2x_tail_first_nopartial": (
        "continuation", {"ghost_blocks": ("capacity", 2), "recency": "tail_first",
                         "skip_partial_tail": True}),
    "dram10_front": ("dram_front", {"dram_blocks": ("capacity", 0.1),
                                    "ghost_blocks": ("capacity", 4)}),
    "dram10_front_tail_first": ("dram_front", {"dram_blocks": ("capacity", 0.1),
                                               "ghost_blocks": ("capacity", 4),
                                               "recency": "tail_first"}),
    "dram25_front_tail_first": ("dram_front", {"dram_blocks": ("capacity", 0.25),
                                               "ghost_blocks": ("capacity", 4),
                                               "recency": "tail_first"}),
    # References for the DRAM-front policies: store-all on an SSD as large as SSD + DRAM.
    "store_all_ssd_plus_dram10": ("store_all", {"capacity_factor": 1.1}),
    "store_all_ssd_plus_dram25": ("store_all", {"capacity_factor": 1.25}),
    "oracle_reuse": ("oracle_reuse", {}),
    "tinylfu": ("tinylfu", {}),
    "tinylfu_tail_first": ("tinylfu", {"recency": "tail_first"}),
}
RULES = ("store_all", "second_sight")


def make_policy(variant: str, capacity: int) -> trace_policies.Policy:
    if variant not in VARIANTS:
        raise ValueError("unknown policy %r; known: %s" % (variant, ", ".join(VARIANTS)))
    cls_name, kwargs = VARIANTS[variant]
    args = {k: (int(v[1] * capacity) if isinstance(v, tuple) else v) for k, v in kwargs.items()}
    capacity = int(capacity * args.pop("capacity_factor", 1))
    return trace_policies.POLICIES[cls_name](capacity, **args)


def table(requests, capacities: Dict[float, int], variants: Sequence[str], block_tokens: int,
          chunk: int, log=print) -> List[dict]:
    """One row per (capacity share, variant): the counts and both ratios."""
    rows = []
    for share, cap in capacities.items():
        counts = {}
        for v in list(RULES) + [v for v in variants if v not in RULES]:
            counts[v] = simulate(requests, make_policy(v, cap), block_tokens, chunk)
            log("  %5.0f%% %-44s hit %.3f written %7d" % (100 * share, v, counts[v].hit_ratio,
                                                        counts[v].written))
        best = max(counts[r].hit_ratio for r in RULES)
        for v, c in counts.items():
            rows.append(dict(capacity_share=share, capacity_blocks=cap, policy=v,
                             hit_ratio=c.hit_ratio, best_rule_hit_ratio=best,
                             hit_ratio_vs_best_rule=c.hit_ratio / best if best else 0.0,
                             written_vs_store_all=c.written / counts["store_all"].written,
                             goal_met=bool(c.hit_ratio >= best - 0.01 and
                                           c.written <= 0.5 * counts["store_all"].written),
                             counts=asdict(c)))
    return rows


def result_lines(rows, trace_name, block_tokens, command) -> List[dict]:
    base = dict(bench="trace_sim", trace=trace_name, block_tokens=block_tokens,
                machine=platform.node(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command=command, unit="ratio")
    out = []
    for r in rows:
        common = dict(base, capacity_share=r["capacity_share"], policy=r["policy"],
                      capacity_blocks=r["capacity_blocks"], hit_ratio=r["hit_ratio"],
                      best_rule_hit_ratio=r["best_rule_hit_ratio"], goal_met=r["goal_met"],
                      **r["counts"])
        out.append(dict(common, metric="trace_hit_ratio_vs_best_rule",
                        value=r["hit_ratio_vs_best_rule"], baseline_name="best_rule_hit_ratio",
                        baseline_value=r["best_rule_hit_ratio"]))
        out.append(dict(common, metric="trace_bytes_written_vs_store_all",
                        value=r["written_vs_store_all"], baseline_name="store_all_written"))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--first", type=int, default=0, help="first request (0-based)")
    ap.add_argument("--count", type=int, default=0, help="requests (0: all)")
    ap.add_argument("--block-tokens", type=int, default=trace_format.TRACE_BLOCK_TOKENS)
    ap.add_argument("--capacities", default="0.05,0.2,0.5,1",
                    help="shares of the trace's unique blocks")
    ap.add_argument("--capacity-blocks", type=int, default=0, help="one capacity in blocks")
    ap.add_argument("--policies", default=",".join(VARIANTS))
    ap.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="blocks per Store call")
    ap.add_argument("--out", default="", help="append JSON lines here")
    args = ap.parse_args(argv)
    requests = trace_format.read_trace(args.trace, args.first, args.count)
    unique = trace_format.unique_blocks(requests, args.block_tokens)
    if args.capacity_blocks:
        caps = {args.capacity_blocks / unique: args.capacity_blocks}
    else:
        caps = {float(s): max(1, round(float(s) * unique)) for s in args.capacities.split(",")}
    print("%s: %d requests, %d unique blocks of %d tokens" % (args.trace, len(requests), unique,
                                                              args.block_tokens))
    rows = table(requests, caps, args.policies.split(","), args.block_tokens, args.chunk)
    if args.out:
        command = " ".join(shlex.quote(a) for a in [sys.argv[0]] + (argv or sys.argv[1:]))
        with open(args.out, "a") as f:
            for line in result_lines(rows, os.path.basename(args.trace), args.block_tokens,
                                     command):
                f.write(json.dumps(line, sort_keys=True) + "\n")
    met = [r for r in rows if r["goal_met"]]
    print("goal met (hit >= best rule - 0.01, written <= 0.5 x store-all): %s" %
          (", ".join("%s@%g" % (r["policy"], r["capacity_share"]) for r in met) or "nowhere"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

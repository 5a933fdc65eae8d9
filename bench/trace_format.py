"""Mooncake-format request traces (../shared/traces/README.md): reading them, and the chain of
tutti blocks each request looks up and stores. Shared by the replay (trace_replay.py) and the
pure-Python cache simulation (trace_sim.py), so both count the very same blocks.

One JSON object a line: {"timestamp": ms, "input_length": tokens, "output_length": tokens,
"hash_ids": [one id per 512-token block of the input, chained like a prefix hash]}.

Blocks: one trace block (TRACE_BLOCK_TOKENS = 512 tokens) maps to 512 / block_tokens tutti
blocks (block_tokens must divide 512). A request's chain is, for each of its ids in order, the
sub-blocks j = 0, 1, ... that its input reaches (the last id of a prompt whose length is not a
multiple of block_tokens keeps the sub-blocks that hold at least one of its tokens). A block is
named (hash_id, j); its 16-byte key is derived from that name alone, so every engine, run and
tool makes the same key for it.
"""

import hashlib
import json
from dataclasses import dataclass
from typing import List, Sequence, Tuple

TRACE_BLOCK_TOKENS = 512
KEY_DOMAIN = b"tutti-trace-v1"

Block = Tuple[int, int]  # (hash_id, sub-block index)


class TraceError(ValueError):
    """A trace line that does not follow the format; the message names the line."""


@dataclass(frozen=True)
class Request:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: Tuple[int, ...]


def parse_line(text: str, where: str) -> Request:
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise TraceError("%s: not JSON: %s" % (where, e)) from None
    if not isinstance(obj, dict):
        raise TraceError("%s: not a JSON object" % where)
    for name in ("timestamp", "input_length", "hash_ids"):
        if name not in obj:
            raise TraceError("%s: no %r field" % (where, name))
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
        raise TraceError("%s: hash_ids must be a list of non-negative integers" % where)
    ts, n_in = obj["timestamp"], obj["input_length"]
    if not isinstance(ts, (int, float)) or ts < 0:
        raise TraceError("%s: timestamp must be a non-negative number of ms" % where)
    if not isinstance(n_in, int) or n_in < 0:
        raise TraceError("%s: input_length must be a non-negative integer" % where)
    if n_in > len(ids) * TRACE_BLOCK_TOKENS:
        raise TraceError("%s: input_length %d needs more than its %d hash_ids of %d tokens" %
                         (where, n_in, len(ids), TRACE_BLOCK_TOKENS))
    return Request(int(ts), n_in, int(obj.get("output_length", 0)), tuple(ids))


def read_trace(path: str, first: int = 0, count: int = 0) -> List[Request]:
    """Requests [first, first + count) of the trace at `path` (count 0: to the end), in file
    order. Raises TraceError naming the bad line, OSError when the file cannot be read."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f):
            if n < first or not line.strip():
                continue
            if count and len(out) >= count:
                break
            out.append(parse_line(line, "%s:%d" % (path, n + 1)))
    return out


def check_block_tokens(block_tokens: int) -> int:
    if block_tokens <= 0 or TRACE_BLOCK_TOKENS % block_tokens:
        raise ValueError("block_tokens = %d: must divide %d (one trace block)" %
                         (block_tokens, TRACE_BLOCK_TOKENS))
    return TRACE_BLOCK_TOKENS // block_tokens


def chain(req: Request, block_tokens: int = TRACE_BLOCK_TOKENS) -> List[Block]:
    """The tutti blocks of `req`'s prompt, in prefix order (see the module comment)."""
    per_id = check_block_tokens(block_tokens)
    out = []
    for i, hid in enumerate(req.hash_ids):
        start = i * TRACE_BLOCK_TOKENS
        for j in range(per_id):
            # An id always keeps its first sub-block (the trace made it for some tokens).
            if j and start + j * block_tokens >= req.input_length:
                break
            out.append((hid, j))
    return out


def key_of(block: Block) -> bytes:
    """The 16-byte tutti key of a block: BLAKE2b of the domain, the id and the sub-block."""
    hid, j = block
    return hashlib.blake2b(KEY_DOMAIN + hid.to_bytes(8, "little") + j.to_bytes(2, "little"),
                           digest_size=16).digest()


def keys_of(blocks: Sequence[Block]) -> List[bytes]:
    return [key_of(b) for b in blocks]


def unique_blocks(requests: Sequence[Request], block_tokens: int) -> int:
    return len({b for r in requests for b in chain(r, block_tokens)})


def span_seconds(requests: Sequence[Request]) -> float:
    """The trace's duration: first to last arrival (at least 1 ms)."""
    if not requests:
        return 0.0
    return max(requests[-1].timestamp_ms - requests[0].timestamp_ms, 1) / 1000.0

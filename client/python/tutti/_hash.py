"""The chained block hash "tutti-sha256-v1" (the same bytes as the C++ library's ChainKeys).

For each full block i of `block_tokens` tokens:
    key[i] = SHA-256(key[i-1] || uint32le(block_tokens) || tokens of block i as uint32le)[0:16]
with key[-1] = `parent` (16 zero bytes for a plain prompt; set it to salt a chain, e.g. with a
LoRA adapter's id). A partial last block gets no key. The same tokens give the same keys in every
process, language and restart (unlike Python's hash(), which is salted per process).
"""

import hashlib
import struct
from typing import List, Sequence

HASH_SCHEME = "tutti-sha256-v1"
ZERO_PARENT = bytes(16)


def chain_keys(tokens: Sequence[int], block_tokens: int, parent: bytes = ZERO_PARENT) -> List[bytes]:
    """Keys (16 bytes each) of the full blocks of `tokens`, first block first."""
    if len(parent) != 16:
        raise ValueError("parent must be 16 bytes")
    if block_tokens <= 0:
        return []
    tokens = [int(t) & 0xFFFFFFFF for t in tokens]
    head = struct.pack("<I", block_tokens)
    fmt = "<%dI" % block_tokens
    keys = []
    prev = bytes(parent)
    for b in range(len(tokens) // block_tokens):
        block = tokens[b * block_tokens:(b + 1) * block_tokens]
        prev = hashlib.sha256(prev + head + struct.pack(fmt, *block)).digest()[:16]
        keys.append(prev)
    return keys

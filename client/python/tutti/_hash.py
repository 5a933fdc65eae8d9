"""The chained block hash "tutti-sha256-v1" (the same bytes as the C++ library's ChainKeys).

For each full block i of `block_tokens` tokens:
    key[i] = SHA-256(key[i-1] || uint32le(block_tokens) || tokens of block i as uint32le)[0:16]
with key[-1] = `parent` (16 zero bytes for a plain prompt; set it to salt a chain, e.g. with a
LoRA adapter's id). A partial last block gets no key. The same tokens give the same keys in every
process, language and restart (unlike Python's hash(), which is salted per process).
"""

import hashlib
import struct
import sys
from array import array
from typing import List, Sequence

HASH_SCHEME = "tutti-sha256-v1"
ZERO_PARENT = bytes(16)

try:  # the same chain in C (client/python/native/keychain.c, chain_v1); absent: in Python below
    from tutti import _keychain as _native
except ImportError:  # not built for this platform, or a Python without it
    _native = None


def _token_bytes(tokens: Sequence[int]) -> bytes:
    """The tokens as uint32le, each int(t) & 0xFFFFFFFF: converted in one call where every token
    is an int in [0, 2^32), masked one token at a time otherwise."""
    if isinstance(tokens, (bytes, bytearray, memoryview)):
        tokens = list(tokens)  # array() would take their raw bytes, not their items
    try:
        packed = array("I", tokens)
    except (OverflowError, TypeError):  # negative, 2^32 or more, or not an int (a float, say)
        packed = array("I", [int(t) & 0xFFFFFFFF for t in tokens])
    if packed.itemsize != 4:  # "I" is 4 bytes on every platform tutti runs on
        return struct.pack("<%dI" % len(packed), *packed)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def chain_keys(tokens: Sequence[int], block_tokens: int, parent: bytes = ZERO_PARENT) -> List[bytes]:
    """Keys (16 bytes each) of the full blocks of `tokens`, first block first."""
    if len(parent) != 16:
        raise ValueError("parent must be 16 bytes")
    if block_tokens <= 0:
        return []
    blocks = len(tokens) // block_tokens
    if blocks == 0:
        return []
    if _native is not None and isinstance(tokens, (list, tuple)):
        try:
            packed = _native.chain_v1(bytes(parent), tokens, block_tokens)
        except (ValueError, OverflowError):  # a token to mask (below), or block_tokens too large
            packed = None
        if packed is not None:
            return [packed[i:i + 16] for i in range(0, len(packed), 16)]
    return _chain_keys_py(tokens, block_tokens, parent, blocks)


def _chain_keys_py(tokens, block_tokens, parent, blocks):
    """chain_keys in Python: the reference, and the path of every input the C chain refuses."""
    data = _token_bytes(tokens[:blocks * block_tokens])
    head = struct.pack("<I", block_tokens)
    step = 4 * block_tokens
    sha256 = hashlib.sha256
    keys = []
    prev = bytes(parent)
    for off in range(0, blocks * step, step):
        prev = sha256(prev + head + data[off:off + step]).digest()[:16]
        keys.append(prev)
    return keys

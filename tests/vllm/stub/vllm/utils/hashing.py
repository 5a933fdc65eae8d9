"""vLLM's sha256_cbor (vllm/utils/hashing.py): SHA-256 of the canonical CBOR of the input. vLLM
uses cbor2; this stand-in encodes the only types a block hash holds (bytes, ints, tuples/lists,
None, str) canonically, byte for byte as cbor2.dumps(..., canonical=True)."""
import hashlib


def _head(major, n):
    if n < 24:
        return bytes([major << 5 | n])
    for extra, width in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * width):
            return bytes([major << 5 | extra]) + n.to_bytes(width, "big")
    raise ValueError("integer too large for CBOR")


def cbor_dumps(x) -> bytes:
    if x is None:
        return b"\xf6"
    if isinstance(x, bool):
        return b"\xf5" if x else b"\xf4"
    if isinstance(x, int):
        return _head(0, x) if x >= 0 else _head(1, -1 - x)
    if isinstance(x, (bytes, bytearray)):
        return _head(2, len(x)) + bytes(x)
    if isinstance(x, str):
        b = x.encode("utf-8")
        return _head(3, len(b)) + b
    if isinstance(x, (tuple, list)):
        return _head(4, len(x)) + b"".join(cbor_dumps(e) for e in x)
    raise TypeError("cannot CBOR-encode %r" % type(x))


def sha256_cbor(input) -> bytes:
    return hashlib.sha256(cbor_dumps(input)).digest()

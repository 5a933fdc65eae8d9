"""Keys and namespaces of the vLLM connector.

Keys: vLLM's own block hashes (Request.block_hashes: chained SHA-256 over CBOR of (parent hash,
block tokens, extra keys such as LoRA and multimodal hashes) with --prefix-caching-hash-algo
sha256_cbor), the first 16 bytes of each. They are the same in every process and after restarts;
vLLM's other algorithms are refused: "sha256" pickles its input (Python-version and
process dependent), "xxhash*" are not cryptographic (a collision would serve another prompt's KV).

Namespace: model_id "<model>@<revision>|kv=<dtype>|<format>:<in-block order>", the layout,
tp_rank/tp_size, hash_scheme "vllm-sha256_cbor@<vLLM version>". Engines share blocks only when
all of it is equal.
"""

from tutti.layout import Namespace

HASH_ALGO = "sha256_cbor"
try:  # vLLM always has numpy; without it packed_keys_of slices hash by hash
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

KEY_BYTES = 16
HASH_BYTES = 32  # a sha256_cbor block hash
MAX_MODEL_ID = 256


def check_hash_algo(cache_config):
    """Raises ValueError unless vLLM hashes blocks with sha256_cbor, with prefix caching on."""
    algo = getattr(cache_config, "prefix_caching_hash_algo", None)
    if algo != HASH_ALGO:
        raise ValueError("TuttiConnector needs reproducible block hashes: start vLLM with "
                         "--prefix-caching-hash-algo sha256_cbor (it is %r: its hashes differ "
                         "between processes or may collide)" % (algo,))
    if not getattr(cache_config, "enable_prefix_caching", True):
        raise ValueError("TuttiConnector needs vLLM's block hashes: start vLLM with "
                         "--enable-prefix-caching (it is off)")


def key_of(block_hash) -> bytes:
    """The tutti key of one vLLM block hash (bytes of at least 16)."""
    if not isinstance(block_hash, (bytes, bytearray)) or len(block_hash) < KEY_BYTES:
        raise ValueError("vLLM block hash %r is not a sha256_cbor digest (bytes of 32); start "
                         "vLLM with --prefix-caching-hash-algo sha256_cbor" % (block_hash,))
    return bytes(block_hash[:KEY_BYTES])


def keys_of(block_hashes):
    return [key_of(h) for h in block_hashes]


def packed_keys_of(block_hashes) -> bytes:
    """The keys of `block_hashes` concatenated (Client.lookup's packed form). sha256_cbor hashes
    are 32 bytes each: then the first 16 of each are taken in one numpy copy, no Python loop per
    block (the scheduler calls this for every waiting request on every step)."""
    if _np is not None and set(map(len, block_hashes)) == {HASH_BYTES}:  # all 32 bytes
        rows = _np.frombuffer(b"".join(block_hashes), dtype=_np.uint8).reshape(-1, HASH_BYTES)
        return _np.ascontiguousarray(rows[:, :KEY_BYTES]).tobytes()
    return b"".join(keys_of(block_hashes))  # empty, or other sizes: checked one by one


def unpack_keys(packed: bytes, begin: int, end: int):
    """Keys [begin, end) of a packed chain, as a list."""
    return [packed[i * KEY_BYTES:(i + 1) * KEY_BYTES] for i in range(begin, end)]


def hash_scheme(vllm_version: str) -> str:
    """"vllm-sha256_cbor@<version>" (tuttid takes at most 64 bytes: a longer version is cut)."""
    return ("vllm-%s@%s" % (HASH_ALGO, vllm_version))[:64]


def model_id(model_config, geometry) -> str:
    """The namespace's model_id: model, revision, KV dtype, format and in-block order."""
    model = str(getattr(model_config, "model", "") or "unknown-model")
    revision = getattr(model_config, "revision", None) or "main"
    mid = "%s@%s|kv=%s|%s:%s" % (model, revision, geometry.dtype, geometry.layout.format,
                                 geometry.in_block)
    if len(mid) > MAX_MODEL_ID:
        raise ValueError("namespace model_id %r is %d characters; at most %d (a shorter model "
                         "path?)" % (mid, len(mid), MAX_MODEL_ID))
    return mid


def namespace(model_config, geometry, tp_rank: int, tp_size: int, vllm_version: str) -> Namespace:
    return Namespace(model_id=model_id(model_config, geometry), layout=geometry.layout,
                     tp_rank=tp_rank, tp_size=tp_size, hash_scheme=hash_scheme(vllm_version))

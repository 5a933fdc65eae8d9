"""Keys and namespaces of the vLLM connector.

Keys are the connector's own, the same in every process whatever its environment: vLLM's block
hashes are not (vLLM seeds the first block's parent with os.urandom(32) unless PYTHONHASHSEED
is set: init_none_hash in vllm/v1/core/kv_cache_utils.py), so a restarted or second engine would
never hit. Block i of a request (tokens [i*B, (i+1)*B) of Request.all_token_ids), scheme
"tutti-vllm-keys-v2":

  digest_i = SHA-256(tokens as 4-byte little-endian unsigned ints | digest_{i-1} | encode(extra_i))
  digest_{-1} = SHA-256("tutti.vllm block keys v2")        key_i = digest_i[:16]

extra_i is what vLLM mixes into its own hash of that block (generate_block_hash_extra_keys:
LoRA name, multimodal identifiers and offsets, cache_salt on the first block, prompt-embeds
hashes), so requests vLLM keeps apart stay apart here; encode() is a fixed, typed encoding that
refuses types it does not know with a ValueError (a wrong key would serve another prompt's KV;
the scheduler then neither loads nor saves that request). A token id outside [0, 2^32) is a
ValueError too (vLLM's vocabularies are far smaller).

v1 (before) hashed SHA-256(digest_{i-1} | tokens as 8-byte ints | encode(extra_i)): three
compressions per 16-token block, all waiting for the previous digest. v2's message is 97 bytes
at block size 16 (two compressions), and its first 64 bytes, the block's tokens, do not depend
on the chain: the C chain compresses them beside the previous block's chained tail
(native/keychain.c). The two schemes' keys differ for every block; the namespace names the
scheme (hash_scheme), so a tuttid's v1 namespaces are never looked up with v2 keys.

Speed (the scheduler's first get_num_new_matched_tokens of a request derives its whole chain):
the chain runs in C (tutti._keychain: SHA-256 with the x86 SHA extensions where the CPU has
them) when that module loads, else in Python (_derive_py, the reference); both give the same
bytes. vLLM is asked for every block's extra keys only when the request has a
position-dependent source of them (multimodal features, prompt embeddings); otherwise three
blocks' answers stand for all (_uniform_extras).

Namespace: model_id "<model>@<revision>|kv=<dtype>|<format>:<in-block order>", the layout,
tp_rank/tp_size, hash_scheme "tutti-vllm-keys-v2@<vLLM version>" (the version: multimodal
identifiers are vLLM's). Engines share blocks only when all of it is equal.
"""

import hashlib
import operator
import struct
import sys
from array import array

from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys

# _native: the chain in C (tutti._keychain, client/python/native/keychain.c) as tutti.chain_keys
# loads it; None where it is not built: the same keys in Python.
from tutti._hash import _native
from tutti.layout import Namespace

KEY_BYTES = 16
KEY_SCHEME = "tutti-vllm-keys-v2"
MAX_MODEL_ID = 256
_ROOT = hashlib.sha256(b"tutti.vllm block keys v2").digest()
_U32 = next(t for t in "IL" if array(t).itemsize == 4)  # array's 4-byte unsigned typecode
_NO_EXTRA = b"\x00"  # encode_extra_keys(None)


def check_cache_config(cache_config):
    """Raises ValueError unless vLLM computes block hashes (prefix caching on): the KV events
    name blocks by vLLM's hashes. Any --prefix-caching-hash-algo works: keys are tutti's own."""
    if not getattr(cache_config, "enable_prefix_caching", True):
        raise ValueError("TuttiConnector needs vLLM's block hashes: start vLLM with "
                         "--enable-prefix-caching (it is off)")


def _encode(x, out):
    """Appends x's typed encoding to the bytearray `out`."""
    if x is None:
        out += b"\x00"
    elif isinstance(x, bool):
        out += b"\x01" + bytes([x])
    elif isinstance(x, int):
        b = str(x).encode()
        out += b"\x02" + struct.pack("<I", len(b)) + b
    elif isinstance(x, str):
        b = x.encode("utf-8")
        out += b"\x03" + struct.pack("<I", len(b)) + b
    elif isinstance(x, (bytes, bytearray)):
        out += b"\x04" + struct.pack("<I", len(x)) + bytes(x)
    elif isinstance(x, (tuple, list)):
        out += b"\x05" + struct.pack("<I", len(x))
        for e in x:
            _encode(e, out)
    else:
        raise ValueError("TuttiConnector cannot key a block whose vLLM extra key is a %s (%r); "
                         "known: None, bool, int, str, bytes, tuple, list" % (type(x).__name__, x))


def _token_bytes(tokens, first=0) -> bytes:
    """Token ids as 4-byte little-endian unsigned integers; ValueError naming a token that is
    not an integer in [0, 2^32) (`first`: the request's position of tokens[0])."""
    try:
        packed = array(_U32, tokens)
    except (OverflowError, TypeError):
        for i, t in enumerate(tokens):
            try:
                ok = 0 <= operator.index(t) < 1 << 32
            except TypeError:
                ok = False
            if not ok:
                raise ValueError("token %d is not an integer in [0, 2^32): %r"
                                 % (first + i, t)) from None
        raise
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def _derive_py(last, tokens, block_size, encoded, first=0):
    """The chain in Python (the reference; the fallback without tutti._keychain): (the
    blocks' keys concatenated, the last block's digest). `encoded`: each block's
    encode_extra_keys, or None when no block has extra keys; `first`: the request's position of
    tokens[0] (for errors)."""
    raw = _token_bytes(tokens, first)
    width, sha256, packed = 4 * block_size, hashlib.sha256, bytearray()
    for b in range(len(tokens) // block_size):
        extra = _NO_EXTRA if encoded is None else encoded[b]
        last = sha256(raw[b * width:(b + 1) * width] + last + extra).digest()
        packed += last[:KEY_BYTES]
    return bytes(packed), last


def _uniform_extras(request, block_size, begin, end, mm_idx):
    """(extra keys of block `begin`, of each later block) from vLLM, asked three times instead
    of once per block of [begin, end), or None (ask per block). Where a request has no
    position-dependent source (mm_features, prompt_embeds) vLLM's extra keys are the same for
    every block but block 0 (the LoRA name on every block, cache_salt on block 0 only): asked
    for the first, second and last block, the blocks between get the second's answer when it
    equals the last's. A Request without one of the attributes generate_block_hash_extra_keys
    reads is of another vLLM: None."""
    try:
        if request.mm_features or request.prompt_embeds is not None:
            return None
        request.lora_request, request.cache_salt  # the vLLM this knows
    except AttributeError:
        return None

    def ask(i):
        start = i * block_size
        return generate_block_hash_extra_keys(request, start, start + block_size, mm_idx)[0]

    first = ask(begin)
    if end - begin == 1:
        return first, None
    rest = ask(begin + 1)
    if (end - begin > 2 and ask(end - 1) != rest) or (begin > 0 and first != rest):
        return None
    return first, rest


def encode_extra_keys(extra) -> bytes:
    out = bytearray()
    _encode(extra, out)
    return bytes(out)


class KeyChain:
    """The keys of one request's full blocks, derived once each as they are first needed
    (tokens only ever get appended to a request, so derived keys stay valid, also across
    preemption). Not thread-safe: the scheduler's thread owns it."""

    def __init__(self, block_size: int):
        self._bs = block_size
        self._last = _ROOT
        self._packed = bytearray()  # KEY_BYTES per derived block
        self._mm_idx = 0
        self._extras = []           # vLLM's extra keys of each derived block

    def __len__(self):
        return len(self._packed) // KEY_BYTES

    def derive(self, request, n: int) -> int:
        """Derives the keys of blocks [0, n) (fewer when the request has fewer full blocks);
        returns how many of those n blocks have keys. ValueError (nothing derived) for a block
        that cannot be keyed."""
        bs, have = self._bs, len(self)
        tokens = request.all_token_ids
        n = min(n, len(tokens) // bs)
        if n <= have:
            return n
        mm_idx = self._mm_idx
        uniform = _uniform_extras(request, bs, have, n, mm_idx)
        if uniform is not None:
            first, rest = uniform
            extras = [first] + [rest] * (n - have - 1)
            encoded = None if first is None and rest is None else (
                [encode_extra_keys(first)] + [encode_extra_keys(rest)] * (n - have - 1))
        else:
            extras, encoded = [], []
            for i in range(have, n):
                start = i * bs
                extra, mm_idx = generate_block_hash_extra_keys(request, start, start + bs, mm_idx)
                extras.append(extra)
                encoded.append(_NO_EXTRA if extra is None else encode_extra_keys(extra))
        if _native is not None:
            # The C chain reads the blocks in place from the request's list (vLLM's
            # all_token_ids is a ConstantList over it): no slice of 32K items per long prompt.
            whole = getattr(tokens, "_x", tokens) if type(tokens).__name__ == "ConstantList" \
                else tokens
            if not isinstance(whole, (list, tuple)):
                whole = list(whole)
            packed, self._last = _native.derive(self._last, whole, bs, encoded, have * bs,
                                                n - have)
        else:
            raw = tokens[have * bs:n * bs]
            packed, self._last = _derive_py(self._last, raw, bs, encoded, have * bs)
        self._packed += packed
        self._extras.extend(extras)
        self._mm_idx = mm_idx
        return n

    def packed(self, begin: int, end: int) -> bytes:
        """Keys [begin, end) concatenated (Client.lookup's packed form); derive() first."""
        return bytes(self._packed[begin * KEY_BYTES:end * KEY_BYTES])

    def keys(self, begin: int, end: int):
        """Keys [begin, end) as a list; derive() first."""
        return unpack_keys(self._packed, begin, end)

    def extra_keys(self, i: int):
        """vLLM's extra keys of block i (None: none), as its BlockStored events carry them."""
        return self._extras[i]


def request_keys(request, block_size: int, n: int):
    """The keys of a request's first n full blocks (a fresh chain: tests and tools)."""
    chain = KeyChain(block_size)
    return chain.keys(0, chain.derive(request, n))


def unpack_keys(packed, begin: int, end: int):
    """Keys [begin, end) of a packed chain, as a list."""
    return [bytes(packed[i * KEY_BYTES:(i + 1) * KEY_BYTES]) for i in range(begin, end)]


def hash_scheme(vllm_version: str) -> str:
    """"tutti-vllm-keys-v2@<version>" (tuttid takes at most 64 bytes: a longer version is cut).
    The scheme's name is part of the namespace: keys of another scheme live in another one."""
    return ("%s@%s" % (KEY_SCHEME, vllm_version))[:64]


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

"""vLLM's chained block hashes (vllm/v1/core/kv_cache_utils.py): hash_block_tokens and the
request block hasher, with NONE_HASH (the first block's parent) from init_none_hash."""
import os

from vllm.utils.hashing import sha256_cbor

NONE_HASH = None


def init_none_hash(hash_fn):
    global NONE_HASH
    seed = os.getenv("PYTHONHASHSEED")
    NONE_HASH = hash_fn(seed) if seed is not None else hash_fn("vllm-none-hash")
    return NONE_HASH


def hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None):
    if not parent_block_hash:
        parent_block_hash = NONE_HASH
    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def get_request_block_hasher(block_size, caching_hash_fn):
    def request_block_hasher(request):
        start = len(request.block_hashes) * block_size
        prev = request.block_hashes[-1] if request.block_hashes else None
        out = []
        tokens = request.all_token_ids
        while start + block_size <= len(tokens):
            prev = hash_block_tokens(caching_hash_fn, prev, tokens[start:start + block_size])
            out.append(prev)
            start += block_size
        return out
    return request_block_hasher


init_none_hash(sha256_cbor)

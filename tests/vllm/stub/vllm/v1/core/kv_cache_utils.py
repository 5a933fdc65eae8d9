"""vLLM's chained block hashes (vllm/v1/core/kv_cache_utils.py): hash_block_tokens, the request
block hasher, the extra keys of a block (LoRA name, multimodal identifiers with their offset in
the block, cache_salt on the first block, prompt-embeds hashes), maybe_convert_block_hash of the
KV events, and NONE_HASH (the first block's parent) from init_none_hash: as in vLLM, random per
process (os.urandom(32)) unless PYTHONHASHSEED is set. vLLM's engine core calls init_none_hash
once at start-up; the fake engine does so per Engine (a fresh engine process)."""
import hashlib
import os

from vllm import envs
from vllm.utils.hashing import sha256_cbor

NONE_HASH = None


def init_none_hash(hash_fn):
    global NONE_HASH
    seed = os.getenv("PYTHONHASHSEED")
    NONE_HASH = os.urandom(32) if seed is None else hash_fn(seed)
    return NONE_HASH


def maybe_convert_block_hash(hash_bytes):
    if not envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES:
        return hash_bytes
    return int.from_bytes(hash_bytes, byteorder="big") & ((1 << 64) - 1)


def _mm_keys(request, start, end, mm_idx):
    features = getattr(request, "mm_features", None) or []
    keys = []
    if not features or mm_idx >= len(features):
        return keys, mm_idx
    if mm_idx < 0:  # the last multimodal input
        mm_idx = len(features) - 1
    while mm_idx < len(features):
        f = features[mm_idx]
        offset, length = f.mm_position.offset, f.mm_position.length
        if offset >= end:
            break
        if offset + length > start:
            keys.append((f.identifier, offset - start))
        if end < offset + length:
            break
        mm_idx += 1
    return keys, mm_idx


def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    mm, next_idx = _mm_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    lora = [request.lora_request.lora_name] if request.lora_request else []
    salt = [request.cache_salt] if start_token_idx == 0 and request.cache_salt else []
    embeds = []
    if getattr(request, "prompt_embeds", None) is not None:
        embeds = [hashlib.sha256(repr(request.prompt_embeds[start_token_idx:end_token_idx])
                                 .encode()).digest()]
    extra = lora + mm + salt + embeds
    return (tuple(extra) if extra else None), next_idx


def hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None):
    if not parent_block_hash:
        parent_block_hash = NONE_HASH
    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def get_request_block_hasher(block_size, caching_hash_fn):
    def request_block_hasher(request):
        start = len(request.block_hashes) * block_size
        prev = request.block_hashes[-1] if request.block_hashes else None
        mm_idx = -1 if start > 0 else 0
        out = []
        tokens = request.all_token_ids
        while start + block_size <= len(tokens):
            extra, mm_idx = generate_block_hash_extra_keys(request, start, start + block_size,
                                                           mm_idx)
            prev = hash_block_tokens(caching_hash_fn, prev, tokens[start:start + block_size],
                                     extra)
            out.append(prev)
            start += block_size
        return out
    return request_block_hasher


init_none_hash(sha256_cbor)

"""A hybrid model through tutti.vllm.TuttiConnector on the GPU machine: a Llama-architecture model
(tests/e2e/llama.py's weights, random) whose layers alternate sliding-window attention (128
tokens, even layers) and full attention (odd layers), with vLLM's hybrid KV cache layout: two KV
cache groups (SlidingWindowSpec, FullAttentionSpec), layer slot i of the cache shared by layer
2i (sliding) and 2i+1 (full), one block table per group, and the sliding group's blocks outside
the window null (block 0) as vLLM's hybrid manager frees them.

    python3 tests/e2e/vllm_hybrid_gpu.py --tuttid BIN --out DIR [--cpu-dry-run | --local]

Request A (the prefix) is computed and stored through the connector; B (prefix + suffix) in a
fresh engine loads the prefix through it (the full group every block, the sliding group the
window before the cut) and computes the suffix. B's logits are compared with the direct
computation: the same model computing B's suffix on top of A's K/V kept in GPU memory (no
connector). Then tuttid restarts and a fresh engine loads again: the hits remain.
JSON lines (DIR/vllm_hybrid.jsonl, and printed): hybrid_logits_max_abs_diff (expected 0.0: the
same bytes are read by the same kernels), the loaded tokens per run, the restart's, and the
deviation from a full recompute (bf16 noise, informational).
"""

import argparse
import json
import os
import platform
import random
import sys
import time
import traceback

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vllm", "stub"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tutti  # noqa: E402
import tutti.vllm as tutti_vllm  # noqa: E402
from tutti.testing import Tuttid  # noqa: E402
from llama import LlamaShape, PagedLlama, _rms_norm, _rotate_half, random_weights  # noqa: E402

from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import ForwardContext  # noqa: E402
from vllm.utils.hashing import sha256_cbor  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher  # noqa: E402
from vllm.v1.core.sched.output import (CachedRequestData, NewRequestData,  # noqa: E402
                                       SchedulerOutput)
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,  # noqa: E402
                                        KVCacheGroupSpec, SlidingWindowSpec)
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

BLOCK = 16
WINDOW = 128
DEV = "cuda"
_SHM = []


def log(*a):
    print(*a, flush=True)


def layer_name(l):
    return "model.layers.%d.self_attn.attn" % l


def group_of(l):
    return l % 2  # group 0: sliding (even layers), group 1: full (odd layers)


class HybridLlama(PagedLlama):
    """PagedLlama with per-group block tables and a sliding window on the even layers; the
    cache is [slots, 2, blocks, tokens, kv_heads, head_dim], slot l // 2 for layer l."""

    @torch.no_grad()
    def forward_hybrid(self, tokens, start, tables, cache, before_layer=None):
        s = self.shape
        tokens = torch.as_tensor(tokens, device=self.device)
        n = tokens.shape[0]
        end = start + n
        tables = [torch.as_tensor(t, device=self.device, dtype=torch.long) for t in tables]
        cos, sin = self._rope(torch.arange(start, end, device=self.device))
        h = self.w["model.embed_tokens.weight"][tokens]
        for l in range(s.layers):
            g = group_of(l)
            lo = max(0, start - WINDOW + 1) if g == 0 else 0
            new_b, new_o = self._slots(tables[g], start, end)
            all_b, all_o = self._slots(tables[g], lo, end)
            p = "model.layers.%d." % l
            x = _rms_norm(h, self.w[p + "input_layernorm.weight"], s.eps)
            q = (x @ self.w[p + "self_attn.q_proj.weight"].T).view(n, s.heads, s.head_dim)
            k = (x @ self.w[p + "self_attn.k_proj.weight"].T).view(n, s.kv_heads, s.head_dim)
            v = (x @ self.w[p + "self_attn.v_proj.weight"].T).view(n, s.kv_heads, s.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            layer_cache = cache[l // 2]
            layer_cache[0][new_b, new_o] = k
            layer_cache[1][new_b, new_o] = v
            if before_layer is not None:
                before_layer(l)
            k_all = layer_cache[0][all_b, all_o]
            v_all = layer_cache[1][all_b, all_o]
            qpos = torch.arange(start, end, device=self.device)[:, None]
            kpos = torch.arange(lo, end, device=self.device)[None, :]
            mask = kpos <= qpos
            if g == 0:
                mask = mask & (kpos > qpos - WINDOW)
            rep = s.heads // s.kv_heads
            qh = q.transpose(0, 1)
            kh = k_all.transpose(0, 1).repeat_interleave(rep, 0)
            vh = v_all.transpose(0, 1).repeat_interleave(rep, 0)
            if hasattr(F, "scaled_dot_product_attention"):
                out = F.scaled_dot_product_attention(qh[None], kh[None], vh[None],
                                                     attn_mask=mask)[0]
            else:  # an older torch (the build machine's)
                scores = (qh.float() @ kh.float().transpose(1, 2)) / (s.head_dim ** 0.5)
                scores.masked_fill_(~mask[None], float("-inf"))
                out = (scores.softmax(-1) @ vh.float()).to(q.dtype)
            attn = out.transpose(0, 1).reshape(n, s.heads * s.head_dim)
            h = h + attn @ self.w[p + "self_attn.o_proj.weight"].T
            x = _rms_norm(h, self.w[p + "post_attention_layernorm.weight"], s.eps)
            gate = x @ self.w[p + "mlp.gate_proj.weight"].T
            up = x @ self.w[p + "mlp.up_proj.weight"].T
            h = h + (F.silu(gate) * up) @ self.w[p + "mlp.down_proj.weight"].T
        h = _rms_norm(h, self.w["model.norm.weight"], s.eps)
        return (h @ self.w["lm_head.weight"].T).float()


def new_cache(model, num_blocks):
    s = model.shape
    shape = (s.layers // 2, 2, num_blocks, BLOCK, s.kv_heads, s.head_dim)
    if DEV == "cuda":
        return torch.zeros(shape, device="cuda", dtype=model.dtype)
    n = 1
    for d in shape:
        n *= d
    shm = tutti.SharedMemory(n * 4, "vllm-hybrid-dry")
    _SHM.append(shm)
    tutti_vllm.register_host_memory(shm)
    return torch.frombuffer(shm.buffer, dtype=torch.float32, count=n).view(shape)


class Engine:
    """vLLM's single-GPU EngineCore reduced to one request per step with its whole prompt, two
    KV cache groups, the connector's scheduler and worker roles in one process."""

    def __init__(self, model, cache, socket, model_id):
        self.model, self.cache = model, cache
        s = model.shape
        ktc = KVTransferConfig(kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm",
                               kv_role="kv_both",
                               kv_connector_extra_config={"sockets": [socket], "save": "end",
                                                          "lookup_timeout_ms": 5000})
        self.config = VllmConfig(model_config=ModelConfig(model=model_id, dtype=str(model.dtype)),
                                 cache_config=CacheConfig(block_size=BLOCK),
                                 kv_transfer_config=ktc)
        args = dict(block_size=BLOCK, num_kv_heads=s.kv_heads, head_size=s.head_dim,
                    dtype=model.dtype)
        kvc = KVCacheConfig(num_blocks=cache.shape[2], kv_cache_groups=[
            KVCacheGroupSpec([layer_name(l) for l in range(0, s.layers, 2)],
                             SlidingWindowSpec(sliding_window=WINDOW, **args)),
            KVCacheGroupSpec([layer_name(l) for l in range(1, s.layers, 2)],
                             FullAttentionSpec(**args))])
        self.worker = KVConnectorFactory.create_connector(self.config, KVConnectorRole.WORKER, kvc)
        self.worker.register_kv_caches({layer_name(l): cache[l // 2] for l in range(s.layers)})
        self.sched = KVConnectorFactory.create_connector(self.config, KVConnectorRole.SCHEDULER,
                                                         kvc)
        self.sched.set_xfer_handshake_metadata({0: self.worker.get_handshake_metadata()})
        self.free = list(range(1, cache.shape[2]))  # block 0: vLLM's null block
        self.hasher = get_request_block_hasher(BLOCK, sha256_cbor)
        self.n = 0

    def tables(self, ntokens, computed):
        """Per group the request's block table as vLLM's hybrid manager allocates it: the
        sliding group's blocks before max(0, computed - W + 1) tokens are the null block."""
        nb = -(-ntokens // BLOCK)
        full = [self.free.pop(0) for _ in range(nb)]
        skip = max(0, computed - WINDOW + 1) // BLOCK
        sliding = [0] * skip + [self.free.pop(0) for _ in range(nb - skip)]
        return [sliding, full]

    def run(self, tokens):
        self.n += 1
        req = Request("req-%d" % self.n, tokens, block_hasher=self.hasher)
        ext, _ = self.sched.get_num_new_matched_tokens(req, 0)
        ext = ext or 0
        tables = self.tables(len(tokens), ext)
        self.sched.update_state_after_alloc(req, KVCacheBlocks(tuple(tables)), ext)
        req.num_computed_tokens = ext
        out = SchedulerOutput(
            scheduled_new_reqs=[NewRequestData.from_request(req, tuple(tables))],
            scheduled_cached_reqs=CachedRequestData.make_empty(),
            num_scheduled_tokens={req.request_id: len(tokens) - ext},
            total_num_scheduled_tokens=len(tokens) - ext, scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={}, num_common_prefix_blocks=[0], finished_req_ids=set(),
            free_encoder_mm_hashes=[])
        out.kv_connector_metadata = self.sched.build_connector_meta(out)
        loads = {g: sum(len(spec.keys) for spec in out.kv_connector_metadata.loads
                        if spec.group == g) for g in (0, 1)}

        def before_layer(l):
            self.worker.wait_for_layer_load(layer_name(l))
            self.worker.save_kv_layer(layer_name(l), self.cache[l // 2], None)

        self.worker.bind_connector_metadata(out.kv_connector_metadata)
        self.worker.start_load_kv(ForwardContext(no_compile_layers={}, attn_metadata={}))
        logits = self.model.forward_hybrid(tokens[ext:], ext, tables, self.cache, before_layer)
        self.worker.wait_for_save()
        errors = set(self.worker.get_block_ids_with_load_errors())
        self.worker.get_finished(set())
        self.worker.clear_connector_metadata()
        if DEV == "cuda":
            torch.cuda.synchronize()
        self.sched.update_connector_output(KVConnectorOutput(invalid_block_ids=errors))
        req.num_computed_tokens = len(tokens)
        self.sched.request_finished_all_groups(req, tuple(tables))
        return dict(logits=logits, loaded=ext, errors=errors, tables=tables,
                    sliding_blocks_loaded=loads[0], full_blocks_loaded=loads[1])

    def close(self):
        self.worker.shutdown()
        self.sched.shutdown()


def wait_hits(eng, prompt, want, timeout=30.0):
    """A Lookup finds a block once it is durable (and after a restart once tuttid is back and
    the sessions re-attached): asks the engine's scheduler until `want` tokens hit; nothing is
    loaded (request_finished releases the leases)."""
    deadline = time.monotonic() + timeout
    while True:
        eng.n += 1
        req = Request("probe-%d" % eng.n, prompt, block_hasher=eng.hasher)
        got, _ = eng.sched.get_num_new_matched_tokens(req, 0)
        eng.sched.request_finished_all_groups(req, ([], []))
        if got >= want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def main():
    global DEV
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tuttid")
    ap.add_argument("--cpu-dry-run", action="store_true")
    ap.add_argument("--local", action="store_true", help="the same as --cpu-dry-run")
    args = ap.parse_args()
    dry = args.cpu_dry_run or args.local
    if dry:
        DEV = "cpu"
        shape, dtype = LlamaShape(vocab=512, hidden=256, layers=4, heads=4, kv_heads=2,
                                  head_dim=64, intermediate=512), torch.float32
        prefix, suffix = 320, 40
    else:
        shape, dtype = LlamaShape(vocab=32000, hidden=2048, layers=8, heads=16, kv_heads=8,
                                  head_dim=128, intermediate=5632), torch.bfloat16
        prefix, suffix = 4096, 256
    os.makedirs(args.out, exist_ok=True)
    model = HybridLlama(shape, random_weights(shape, seed=0, device=DEV, dtype=dtype), BLOCK)
    rng = random.Random(7)
    prompt = [rng.randrange(shape.vocab) for _ in range(prefix + suffix)]
    nb = 4 * (len(prompt) // BLOCK + 2)
    es = 2 if dtype == torch.bfloat16 else 4
    object_bytes = BLOCK * shape.kv_heads * shape.head_dim * es
    cap = max(4 * nb * shape.layers * object_bytes, 256 << 20)
    rows, ok = [], True
    daemon = Tuttid(binary=args.tuttid, object_bytes=object_bytes, max_objects=shape.layers,
                    capacity=cap, dram=cap, store_staging=min(cap, 2 << 30),
                    extra='gpu { mode: "cuda" }' if DEV == "cuda" else 'gpu { mode: "host" }')
    try:
        daemon.start()
        hit_blocks = prefix // BLOCK
        # A: the prefix, computed and stored (both groups).
        eng = Engine(model, new_cache(model, nb), daemon.socket, "hybrid-e2e")
        a = eng.run(prompt[:prefix])
        eng.close()
        want = hit_blocks * BLOCK
        # The direct computation: B's suffix over A's K/V kept on the GPU (no connector).
        ref_cache = new_cache(model, nb)
        ref_tables = [list(range(1, 1 + len(prompt) // BLOCK + 1)),
                      list(range(nb // 2, nb // 2 + len(prompt) // BLOCK + 1))]
        model.forward_hybrid(prompt[:prefix], 0, ref_tables, ref_cache)
        ref = model.forward_hybrid(prompt[prefix:], prefix, ref_tables, ref_cache)
        full = model.forward_hybrid(prompt, 0, ref_tables, new_cache(model, nb))[prefix:]

        def reference(cut):
            """The direct computation at a cut past the prefix (B stored its own blocks: a
            later run loads them): the same history (A, then B) kept on the GPU, then the
            tokens past the cut, as the loading engine computes them."""
            if cut == prefix:
                return ref
            return model.forward_hybrid(prompt[cut:], cut, ref_tables, ref_cache)

        def loaded_run(tag):
            e = Engine(model, new_cache(model, nb), daemon.socket, "hybrid-e2e")
            try:
                seen = wait_hits(e, prompt, want)
                b = e.run(prompt)
            finally:
                e.close()
            # B's blocks past the prefix were stored too: a later run may load more of it.
            m = b["logits"].shape[0]
            diff = float((b["logits"] - reference(b["loaded"])).abs().max())
            row = dict(part=tag, hybrid_logits_max_abs_diff=diff, loaded_tokens=b["loaded"],
                       want_tokens=want, load_errors=sorted(b["errors"]),
                       sliding_blocks_loaded=b["sliding_blocks_loaded"],
                       full_blocks_loaded=b["full_blocks_loaded"],
                       window_blocks=-(-(WINDOW - 1) // BLOCK),
                       max_abs_vs_full_recompute=float((b["logits"] - full[-m:]).abs().max()),
                       argmax_agree_vs_full=float((b["logits"].argmax(-1) ==
                                                   full[-m:].argmax(-1)).float().mean()))
            row["ok"] = bool(b["loaded"] >= want and not b["errors"] and diff == 0.0 and
                             b["sliding_blocks_loaded"] == row["window_blocks"] and
                             b["full_blocks_loaded"] == b["loaded"] // BLOCK)
            row["hits_seen"] = seen
            return row

        rows.append(dict(loaded_run("load"), a_loaded=a["loaded"]))
        daemon.restart()
        rows.append(loaded_run("after_restart"))
    except Exception:
        traceback.print_exc()
        ok = False
    finally:
        daemon.cleanup()
    meta = dict(date=time.strftime("%Y-%m-%d"), host=platform.node(),
                machine=("nvidia-h200 device machine (%s)" % torch.cuda.get_device_name(0))
                if DEV == "cuda" else "cpu dry run",
                command="python3 tests/e2e/vllm_hybrid_gpu.py%s" % (" --cpu-dry-run" if dry
                                                                    else ""),
                prefix=prefix, suffix=suffix, window=WINDOW, layers=shape.layers)
    with open(os.path.join(args.out, "vllm_hybrid.jsonl"), "a") as f:
        for r in rows:
            line = json.dumps(dict(meta, **r))
            f.write(line + "\n")
            print(line, flush=True)
    ok = ok and len(rows) == 2 and all(r["ok"] for r in rows)
    log("hybrid: %s" % ("ok" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

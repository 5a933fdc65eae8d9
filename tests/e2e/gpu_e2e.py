"""Prefix reuse through tuttid on the GPU machine (cuda mode, bf16), and the TTFT measurement.

    python3 tests/e2e/gpu_e2e.py --out DIR [--parts env,client,correct,ttft] [--tuttid BIN]

Parts (each runs on its own; a failure is reported and the next part runs):
  env      versions of torch, grpcio, protobuf, transformers; what torch's
           untyped_storage()._share_cuda_() returns; the generated protobuf code round-trips.
  client   the Python client in cuda mode: store, retrieve into other blocks while a stream waits
           per layer, tuttid killed mid-retrieve (the stream drains, the blocks are failed).
  correct  a Llama-architecture model (8 layers, hidden 2048, 16 query / 8 KV heads x 128, bf16,
           random weights) checked against transformers' LlamaForCausalLM with the same weights;
           then request A stores its prompt's KV, request B (A + a suffix) loads the prefix layer
           by layer from tuttid into other blocks and computes only the suffix; also after a
           tuttid restart, with a partly cached prefix, and with tuttid killed mid-load.
  ttft     Llama-3-8B's shape (32 layers, hidden 4096, 32/8 heads, vocab 128256, bf16, random
           weights): time to first token of B = prefix (4K, 16K, 32K tokens) + 512 new tokens,
           with the prefix loaded from tuttid's DRAM tier, from its SSD tier (restarted with the
           DRAM tier off: reads hit the pool files), and recomputed in full; JSON lines in
           DIR/e2e_ttft.jsonl.

bf16 tolerance (correct): B's logits with the prefix loaded (L) and recomputed in full (F) are
both compared with a float32 computation of the same model (R). Loading is exact (the loaded
blocks are bit-identical to what A computed), so L differs from F only because A computed the
prefix's K/V in a different batch (other GEMM tiling, other bf16 roundings). Pass when
max|L - R| <= 1.5 * max|F - R| + 0.02 * max|R| (the loaded path is as accurate as recomputing, up
to the noise of bf16 itself: unit roundoff 2^-8 = 0.4% per rounding, over 8 layers) and the
argmax tokens of L and F agree on at least 97% of positions.
"""

import argparse
import faulthandler
import json
import os
import platform
import random
import sys
import threading
import time
import traceback

# CUDA IPC exports cudaMalloc allocations; torch's expandable segments (cuMemCreate) have none.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")

import torch  # noqa: E402

import tutti  # noqa: E402
from tutti.testing import Tuttid  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine import Engine  # noqa: E402
from llama import LlamaShape, PagedLlama, random_weights  # noqa: E402

BLOCK = 16


def log(*a):
    print(*a, flush=True)


def layout_of(shape, dtype_bytes):
    return tutti.KvLayout(num_layers=shape.layers, kv_heads=shape.kv_heads,
                          head_dim=shape.head_dim, dtype_bytes=dtype_bytes, block_tokens=BLOCK)


DEV = "cuda"  # --cpu-dry-run: "cpu" (host mode over shared memory, float32, tiny shapes)
SCATTER = ""  # --scatter: tuttid's gpu.scatter ("": its default)
_SHM = {}


def new_cache(model, num_blocks):
    """The engine's paged cache: device memory (cuda mode), or shared memory (dry run)."""
    if DEV == "cuda":
        return model.new_cache(num_blocks)
    s = model.shape
    layout = layout_of(s, model.dtype.itemsize if hasattr(model.dtype, "itemsize") else 4)
    shm = tutti.SharedMemory(tutti.cache_bytes(layout, num_blocks), "gpu-e2e-dry")
    cache, _ = tutti.host_cache_tensor(layout, num_blocks, model.dtype, shm)
    _SHM[id(cache)] = shm
    return cache


def attach(cache, ns, daemon):
    per_layer = [cache[l] for l in range(cache.shape[0])]
    objects = tutti.objects_from_tensors(ns.layout, per_layer)
    if DEV == "cuda":
        return tutti.Client.attach(ns, cache.shape[2], objects, cuda_device=0,
                                   socket_path=daemon.socket, engine_id="gpu_e2e")
    return tutti.Client.attach(ns, cache.shape[2], objects,
                               host_regions=[_SHM[id(cache)].region()],
                               socket_path=daemon.socket, engine_id="gpu_e2e-dry-run")


def gpu_config():
    if DEV != "cuda":
        return 'gpu { mode: "host" }'
    return 'gpu { mode: "cuda"%s }' % (' scatter: "%s"' % SCATTER if SCATTER else "")


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


_DAEMONS = []  # the running fixtures, for the watchdog


def start_watchdog(seconds):
    """After `seconds`, prints every thread's stack and the tails of the running tuttids' logs,
    then exits with 3: a hang on the GPU machine leaves a diagnosis instead of a timeout."""
    def fire():
        log("watchdog: %.0f s passed; stacks:" % seconds)
        faulthandler.dump_traceback(all_threads=True)
        for d in list(_DAEMONS):
            log("watchdog: tuttid log tail:\n" + d.log_tail())
        sys.stdout.flush()
        os._exit(3)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def await_generation(client, gen, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.info["attached"] and client.info["generation"] >= gen:
            return
        time.sleep(0.02)
    raise RuntimeError("no re-attach within %.0f s" % timeout)


# --- env ---------------------------------------------------------------------------------------

def part_env(args):
    import grpc
    import google.protobuf
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "grpcio": grpc.__version__,
            "protobuf": google.protobuf.__version__}
    try:
        from google.protobuf.internal import api_implementation
        info["protobuf_impl"] = api_implementation.Type()
    except Exception:
        pass
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except Exception as e:
        info["transformers"] = "missing: %s" % e
    log(json.dumps(info))
    t = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    try:
        shared = t.untyped_storage()._share_cuda_()
        log("_share_cuda_() -> %d items: %s" % (len(shared), [
            (type(x).__name__, len(x) if isinstance(x, bytes) else x) for x in shared]))
    except Exception as e:
        log("_share_cuda_() failed: %r" % e)
    from tutti import _cuda
    base, size = _cuda.allocation_of(0, t.data_ptr())
    log("cuMemGetAddressRange: ptr 0x%x base 0x%x size %d; uuid %s" % (
        t.data_ptr(), base, size, _cuda.gpu_uuid(0)))
    from tutti.v1 import kvcache_pb2 as pb
    req = pb.AttachRequest(engine_id="x", num_blocks=3)
    req.regions.add().cuda_ipc.ipc_handle = b"h" * 64
    again = pb.AttachRequest.FromString(req.SerializeToString())
    assert again == req and again.regions[0].WhichOneof("kind") == "cuda_ipc"
    log("generated protobuf code (protoc 3.21) round-trips under protobuf %s" %
        google.protobuf.__version__)


# --- client ------------------------------------------------------------------------------------

def part_client(args):
    layout = tutti.KvLayout(num_layers=8, kv_heads=8, head_dim=128, dtype_bytes=2,
                            block_tokens=BLOCK)
    ns = tutti.Namespace("gpu-e2e-client", layout)
    nb = 512
    cache = torch.zeros(8, 2, nb, BLOCK, 8, 128, dtype=torch.bfloat16, device="cuda")
    with Tuttid(binary=args.tuttid, object_bytes=layout.object_bytes, max_objects=16,
                capacity=2 << 30, store_staging=256 << 20, extra=gpu_config()) as daemon:
        _DAEMONS[:] = [daemon]
        client = attach(cache, ns, daemon)
        assert client.info["mode"] == "cuda"
        keys = tutti.chain_keys(range(16 * 200), BLOCK)
        src = torch.randn(8, 2, 200, BLOCK, 8, 128, device="cuda").to(torch.bfloat16)
        cache[:, :, :200] = src
        out = client.store(keys, list(range(200)), wait_durable=True)
        assert out == ["durable"] * 200, out
        lease = client.lookup(keys)
        assert lease.hits == 200
        dst = list(range(300, 500))
        side = torch.cuda.Stream()
        r = client.retrieve(lease, keys, dst)
        copies = []
        with torch.cuda.stream(side):
            for layer in range(8):
                r.wait_layer(layer, side)
                copies.append(cache[layer, :, 300:500].clone())  # runs after the layer landed
        side.synchronize()
        res = r.wait()
        assert res.ok and not res.failed, res
        for layer in range(8):
            assert torch.equal(copies[layer], src[layer]), "layer %d differs" % layer
        log("client: 200 blocks x 8 layers retrieved with per-layer stream waits, byte-exact")
        # tuttid killed mid-retrieve: the stream drains, the blocks are reported failed.
        t0 = time.monotonic()
        code = daemon.stop()
        log("client: tuttid stopped (exit %s) in %.2f s" % (code, time.monotonic() - t0))
        daemon.start()
        await_generation(client, 2)
        log("client: re-attached %.2f s after the stop began" % (time.monotonic() - t0))
        lease = client.lookup(keys)
        r = client.retrieve(lease, keys, dst)
        with torch.cuda.stream(side):
            for layer in range(8):
                r.wait_layer(layer, side)
            # Engine work queued behind the waits (a first launch under lazy loading: the case
            # that stalls the whole context until the words are written; docs/gpu.md).
            torch.ones(1, device="cuda")
        daemon.kill()
        res = r.wait()
        log("client: retrieve ended after the kill: %s: %s" % (res.code, res.message))
        t0 = time.monotonic()
        side.synchronize()
        log("client: killed mid-retrieve: %d layers landed, %s, %d failed; stream drained in %.3f s"
            % (res.layers_done, res.code, len(res.failed), time.monotonic() - t0))
        assert res.ok or len(res.failed) == 200
        client.detach()
    _DAEMONS.clear()


# --- correct -----------------------------------------------------------------------------------

def max_abs(a, b):
    return float((a.float() - b.float()).abs().max())


def check_transformers(shape, weights):
    """Our paged model against transformers' LlamaForCausalLM with the same weights (bf16 and
    fp32): the model is a real Llama. Returns {dtype: max rel err}; logs, never raises."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden,
                          intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
                          num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                          head_dim=shape.head_dim, rms_norm_eps=shape.eps,
                          max_position_embeddings=8192, tie_word_embeddings=False,
                          attention_bias=False, mlp_bias=False, rope_theta=shape.rope_theta)
        cfg.rope_theta = shape.rope_theta
        if hasattr(cfg, "rope_parameters"):  # transformers 5 keeps RoPE settings here
            cfg.rope_parameters = {"rope_type": "default", "rope_theta": shape.rope_theta}
        tokens = torch.randint(0, shape.vocab, (700,), device=DEV)
        results = {}
        for dtype in (torch.float32, torch.bfloat16):
            with torch.device(DEV):
                hf = LlamaForCausalLM(cfg).to(dtype=dtype).eval()
            res = hf.load_state_dict({k: v.to(dtype) for k, v in weights.items()}, strict=False)
            if res.missing_keys:
                raise RuntimeError("weights not loaded: %s" % res.missing_keys[:4])
            with torch.no_grad():
                ref = hf(tokens[None]).logits[0].float()
            del hf
            model = PagedLlama(shape, {k: v.to(dtype) for k, v in weights.items()}, BLOCK)
            ours = Engine(model, model.new_cache(64)).prefill(tokens.tolist(),
                                                              use_cache=False).logits
            results[str(dtype)] = max_abs(ours, ref) / float(ref.abs().max())
        ok = results["torch.float32"] < 1e-3 and results["torch.bfloat16"] < 5e-2
        log("ours vs transformers LlamaForCausalLM, max rel err: %s -> %s" % (
            results, "MATCH" if ok else "MISMATCH"))
        return results
    except Exception as e:
        log("transformers cross-check not done: %r" % e)
        return None


def part_correct(args):
    shape = LlamaShape(vocab=32000, hidden=2048, layers=8, heads=16, kv_heads=8, head_dim=128,
                       intermediate=8192)
    low = torch.bfloat16
    if DEV == "cpu":
        shape, low = LlamaShape(vocab=512, hidden=256, layers=2, intermediate=512), torch.float32
    w32 = random_weights(shape, seed=3, device=DEV, dtype=torch.float32)
    if DEV == "cuda":
        check_transformers(shape, w32)
    model = PagedLlama(shape, {k: v.to(low) for k, v in w32.items()}, BLOCK)
    ref_model = PagedLlama(shape, w32, BLOCK)
    ref_engine = Engine(ref_model, ref_model.new_cache(400))
    full_engine = Engine(model, model.new_cache(400))
    layout = layout_of(shape, 2 if low == torch.bfloat16 else 4)
    ns = tutti.Namespace("gpu-e2e-correct-seed3", layout)
    rng = random.Random(7)
    prompt_a = [rng.randrange(shape.vocab) for _ in range(2000)]  # 125 blocks
    prompt_b = prompt_a + [rng.randrange(shape.vocab) for _ in range(300)]
    ref = ref_engine.prefill(prompt_b, use_cache=False).logits
    full = full_engine.prefill(prompt_b, use_cache=False).logits

    def check(name, res):
        n = res.logits.shape[0]
        r, f = ref[-n:], full[-n:]
        err_l, err_f = max_abs(res.logits, r), max_abs(f, r)
        agree = float((res.logits.argmax(-1) == f.argmax(-1)).float().mean())
        ok = (err_l <= 1.5 * err_f + 0.02 * float(r.abs().max()) and agree >= 0.97
              and bool(torch.isfinite(res.logits).all()))
        log("correct/%s: hits %d computed %d recomputed %s | max|L-R| %.4f max|F-R| %.4f "
            "max|R| %.2f argmax agree %.4f -> %s" % (name, res.hits, res.computed_tokens,
                                                     res.recomputed, err_l, err_f,
                                                     float(r.abs().max()), agree,
                                                     "PASS" if ok else "FAIL"))
        assert ok, name

    cache = new_cache(model, 400)
    with Tuttid(binary=args.tuttid, object_bytes=layout.object_bytes, max_objects=16,
                capacity=2 << 30, dram=1 << 30, extra=gpu_config()) as daemon:
        _DAEMONS[:] = [daemon]
        client = attach(cache, ns, daemon)
        eng = Engine(model, cache, client)
        a = eng.prefill(prompt_a, keep_blocks=True)
        assert a.stored == ["durable"] * 125, a.stored[:3]
        a_blocks = [cache[:, :, b].clone() for b in a.block_table[:125]]
        eng.free(a.block_table)
        b = eng.prefill(prompt_b, keep_blocks=True, store=False)
        assert b.hits == 125 and not set(b.block_table) & set(a.block_table)
        same = all(torch.equal(cache[:, :, b.block_table[i]], a_blocks[i]) for i in range(125))
        log("correct: the 125 loaded blocks are bit-identical to A's: %s" % same)
        assert same
        eng.free(b.block_table)
        check("loaded", b)
        daemon.restart()
        await_generation(client, 2)
        check("after_restart", eng.prefill(prompt_b, store=False))

        def kill0(layer):
            if layer == 0:
                daemon.kill()

        killed = eng.prefill(prompt_b, store=False, hook=kill0)
        check("killed_mid_load", killed)
        daemon.start()
        await_generation(client, 3)
        client.detach()
    cache2 = new_cache(model, 400)
    with Tuttid(binary=args.tuttid, object_bytes=layout.object_bytes, max_objects=16,
                capacity=2 << 30, extra=gpu_config()) as daemon:
        _DAEMONS[:] = [daemon]
        client = attach(cache2, ns, daemon)
        eng = Engine(model, cache2, client)
        eng.prefill(prompt_a, store_limit=50)
        part = eng.prefill(prompt_b, store=False)
        assert part.hits == 50
        check("partly_cached", part)
        client.detach()


# --- ttft --------------------------------------------------------------------------------------

def timed(fn):
    sync()
    t0 = time.perf_counter()
    res = fn()
    sync()
    return (time.perf_counter() - t0) * 1000.0, res


def part_ttft(args):
    shape, dtype = LlamaShape.llama3_8b(), torch.bfloat16
    if DEV == "cpu":
        shape, dtype = LlamaShape(vocab=512, hidden=256, layers=2, intermediate=512), torch.float32
    prefixes = [int(p) for p in args.prefixes.split(",")]
    suffix = args.suffix
    t0 = time.perf_counter()
    weights = random_weights(shape, seed=0, device=DEV, dtype=dtype)
    model = PagedLlama(shape, weights, BLOCK)
    log("ttft: %s weights in %.1f s" % (shape, time.perf_counter() - t0))
    layout = layout_of(shape, 2 if dtype == torch.bfloat16 else 4)
    ns = tutti.Namespace("gpu-e2e-ttft-llama3-8b-shape", layout)
    max_tokens = max(prefixes) + suffix
    nb = 2 * ((max_tokens + BLOCK - 1) // BLOCK) + 16
    cache = new_cache(model, nb)
    total_blocks = sum(p // BLOCK for p in prefixes)
    slot = 2 * shape.layers * layout.object_bytes + 8192  # a block's objects and its header
    cap = max(int((total_blocks + 128) * slot * 1.1), 256 << 20)
    rng = random.Random(11)
    prompts = {p: [rng.randrange(shape.vocab) for _ in range(p + suffix)] for p in prefixes}
    rows = {p: {} for p in prefixes}
    errs = {}
    with Tuttid(binary=args.tuttid, object_bytes=layout.object_bytes, max_objects=2 * shape.layers,
                capacity=cap, dram=cap, store_staging=512 << 20, retrieve_staging=1 << 30,
                max_blocks_per_call=4096, extra=gpu_config()) as daemon:
        _DAEMONS[:] = [daemon]
        client = attach(cache, ns, daemon)
        eng = Engine(model, cache, client, poison=False)
        for p in prefixes:
            a = eng.prefill(prompts[p][:p])
            assert all(o == "durable" for o in a.stored), set(a.stored)
            full_ms = []
            for _ in range(3):
                ms, res = timed(lambda: eng.prefill(prompts[p], use_cache=False, store=False))
                full_ms.append(ms)
            full_logits = res.logits
            dram_ms = []
            for _ in range(3):
                ms, res = timed(lambda: eng.prefill(prompts[p], store=False))
                assert res.hits == p // BLOCK and not res.recomputed, (res.hits, res.failed)
                dram_ms.append(ms)
            tail = full_logits[-res.logits.shape[0]:]
            errs[p] = max_abs(res.logits, tail) / float(tail.abs().max())
            rows[p]["full"] = full_ms[1:]
            rows[p]["dram"] = dram_ms[1:]
            log("ttft %5d+%d: full %s ms, dram tier %s ms (rel err vs full %.4f)" % (
                p, suffix, ["%.1f" % x for x in full_ms], ["%.1f" % x for x in dram_ms], errs[p]))
        daemon.stop()
        daemon.write_config(dram=0)
        daemon.start()
        await_generation(client, 2)
        for p in prefixes:
            ssd_ms = []
            for _ in range(2):
                ms, res = timed(lambda: eng.prefill(prompts[p], store=False))
                assert res.hits == p // BLOCK and not res.recomputed, (res.hits, res.failed)
                ssd_ms.append(ms)
            rows[p]["ssd"] = ssd_ms
            log("ttft %5d+%d: ssd tier %s ms" % (p, suffix, ["%.1f" % x for x in ssd_ms]))
        client.detach()
    write_ttft(args, rows, errs, suffix)


HOW = {
    "full": "min of runs 2-3 (run 1 is a warm-up), whole prompt recomputed",
    "dram": "min of runs 2-3 (run 1 is a warm-up), prefix from tuttid's DRAM tier",
    "ssd": "min of 2 runs, tuttid restarted with the DRAM tier off (reads hit the pool files)",
}


def write_ttft(args, rows, errs, suffix):
    date = time.strftime("%Y-%m-%d")
    gpu = torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu dry run"
    machine = "nvidia-h200 device machine (%s, Firecracker VM, pool on virtio disk)" % gpu
    command = "python3 tests/e2e/gpu_e2e.py --parts ttft --prefixes %s --suffix %d%s" % (
        args.prefixes, suffix, " --scatter " + SCATTER if SCATTER else "")
    path = os.path.join(args.out, "e2e_ttft.jsonl")
    with open(path, "a") as f:
        for p, r in rows.items():
            base = min(r["full"])
            for tier in ("full", "dram", "ssd"):
                if tier not in r:
                    continue
                value = min(r[tier])
                f.write(json.dumps({
                    "bench": "e2e_ttft",
                    "metric": "ttft_llama3_8b_shape_prefix%d_new%d_%s%s" % (
                        p, suffix, tier, "_scatter_" + SCATTER if SCATTER and tier != "full"
                        else ""),
                    "value": round(value, 2), "unit": "ms",
                    "baseline_name": "full_recompute", "baseline_value": round(base, 2),
                    "ratio": round(value / base, 4), "machine": machine, "date": date,
                    "command": command,
                    "note": "%s; runs %s ms; ratio = value / baseline; cached-vs-full logits "
                            "max rel err %.4f (bf16)" % (HOW[tier], [round(x, 1) for x in r[tier]],
                                                          errs.get(p, -1)),
                }) + "\n")
    log("wrote %s" % path)
    log("%-8s %10s %10s %10s %8s %8s" % ("prefix", "full ms", "dram ms", "ssd ms", "dram/f",
                                         "ssd/f"))
    for p, r in rows.items():
        f_ = min(r["full"])
        d = min(r.get("dram", [float("nan")]))
        s = min(r.get("ssd", [float("nan")]))
        log("%-8d %10.1f %10.1f %10.1f %8.3f %8.3f" % (p, f_, d, s, d / f_, s / f_))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--parts", default="env,client,correct,ttft")
    ap.add_argument("--tuttid", default=None)
    ap.add_argument("--prefixes", default="4096,16384,32768")
    ap.add_argument("--suffix", type=int, default=512)
    ap.add_argument("--watchdog", type=float, default=0,
                    help="seconds per part before stacks and tuttid logs are printed and the "
                    "run exits with 3 (0: none)")
    ap.add_argument("--scatter", default="",
                    help="tuttid's gpu.scatter (auto, staged, copy_engine, mapped; default: "
                    "tuttid's own)")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="run correct/ttft on the CPU in host mode with tiny shapes (logic only)")
    args = ap.parse_args()
    global DEV, SCATTER
    SCATTER = args.scatter
    if args.cpu_dry_run:
        DEV = "cpu"
    os.makedirs(args.out, exist_ok=True)
    failed = []
    for part in args.parts.split(","):
        t0 = time.perf_counter()
        log("=== %s" % part)
        dog = start_watchdog(args.watchdog) if args.watchdog > 0 else None
        try:
            globals()["part_" + part](args)
            log("=== %s: OK in %.1f s" % (part, time.perf_counter() - t0))
        except Exception:
            traceback.print_exc()
            failed.append(part)
            log("=== %s: FAILED in %.1f s" % (part, time.perf_counter() - t0))
        if dog is not None:
            dog.cancel()
        if DEV == "cuda":
            torch.cuda.empty_cache()
    log("parts failed: %s" % (failed or "none"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

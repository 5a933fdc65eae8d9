"""The vLLM connector with a real model on the GPU machine: tutti.vllm.TuttiConnector driven the
way vLLM's single-GPU engine drives it (EngineCore with the uniproc executor: the scheduler-role
and the worker-role connector in one process, built by vLLM's factory from the kv-transfer-config),
against the direct client path of tests/e2e/engine.py on the same tuttid.

    python3 tests/e2e/vllm_connector_gpu.py --out DIR --tuttid BIN [--parts correct,ttft,save]
        [--prefixes 4096,16384] [--suffix 512] [--cpu-dry-run]

vLLM's modules come from tests/vllm/stub (vLLM cannot be installed here); the connector only sees
vLLM's interface. Per step, as vLLM's scheduler and model runner call it:
get_num_new_matched_tokens -> allocate -> update_state_after_alloc -> build_connector_meta ->
bind_connector_metadata -> start_load_kv -> per layer: wait_for_layer_load, (the layer computes),
save_kv_layer -> wait_for_save -> get_block_ids_with_load_errors / get_finished ->
clear_connector_metadata -> update_connector_output; request_finished at the end.

Parts:
  correct  8 layers (hidden 2048, 16/8 heads x 128, bf16): request A stores its prompt through the
           connector, request B (A + suffix) loads the prefix through it; B's logits must equal the
           direct client's B logits (same weights, same prefix loaded by tutti.Client) and agree
           with a full recompute within the bf16 tolerance of gpu_e2e.py.
  ttft     Llama-3-8B's shape: B's time to first token through the connector vs the direct client,
           alternating, prefix from tuttid's DRAM tier; the host time spent in each
           wait_for_layer_load and when the host finished enqueueing the forward vs when the GPU
           finished it (a host wait per layer would make them equal).
  save     A's step time with save "end" (one Store after the forward) vs "layer" (save_kv_layer
           per layer), fresh prompts each.
  refused  A's 4096-token save (512 MiB) into tuttid's default 256 MiB of store staging: the
           refused blocks are retried until every block is stored (both save modes), then B
           loads the whole prefix.
JSON lines go to DIR/vllm_connector.jsonl.
"""

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
import traceback

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vllm", "stub"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import tutti  # noqa: E402
import tutti.vllm as tutti_vllm  # noqa: E402
from tutti.testing import Tuttid  # noqa: E402
from engine import Engine  # noqa: E402
from llama import LlamaShape, PagedLlama, random_weights  # noqa: E402

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
                                        KVCacheGroupSpec)
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

BLOCK = 16
DEV = "cuda"
_SHM = {}


def log(*a):
    print(*a, flush=True)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def layer_name(l):
    return "model.layers.%d.self_attn.attn" % l


def new_cache(model, num_blocks):
    """[layers, 2, blocks, tokens, heads, dim]: per layer vLLM's [2, blocks, tokens, heads, dim]
    (FlashAttention's layout). Dry run: over shared memory registered for the connector."""
    if DEV == "cuda":
        return model.new_cache(num_blocks)
    s = model.shape
    layout = tutti.KvLayout(s.layers, s.kv_heads, s.head_dim, 4, BLOCK)
    shm = tutti.SharedMemory(tutti.cache_bytes(layout, num_blocks), "vllm-gpu-dry")
    cache, _ = tutti.host_cache_tensor(layout, num_blocks, model.dtype, shm)
    _SHM[id(cache)] = shm
    tutti_vllm.register_host_memory(shm)
    return cache


class Blocks:
    def __init__(self, n):
        self.free = list(range(n))

    def take(self, n):
        out, self.free = self.free[:n], self.free[n:]
        if len(out) < n:
            raise RuntimeError("out of KV blocks")
        return out

    def give(self, blocks):
        self.free.extend(blocks)


class VllmEngine:
    """vLLM's EngineCore for one GPU, reduced to what the connector sees: one request per step,
    its whole prompt in that step (no chunking), no GPU prefix cache (every prefix is a GPU miss,
    as after vLLM evicted it)."""

    def __init__(self, model, cache, socket, save, model_id):
        self.model, self.cache = model, cache
        s = model.shape
        ktc = KVTransferConfig(kv_connector="TuttiConnector", kv_connector_module_path="tutti.vllm",
                               kv_role="kv_both",
                               kv_connector_extra_config={"sockets": [socket], "save": save})
        self.config = VllmConfig(model_config=ModelConfig(model=model_id, dtype=str(model.dtype)),
                                 cache_config=CacheConfig(block_size=BLOCK),
                                 kv_transfer_config=ktc)
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=s.kv_heads, head_size=s.head_dim,
                                 dtype=model.dtype)
        kvc = KVCacheConfig(num_blocks=cache.shape[2], kv_cache_groups=[
            KVCacheGroupSpec([layer_name(l) for l in range(s.layers)], spec)])
        self.worker = KVConnectorFactory.create_connector(self.config, KVConnectorRole.WORKER, kvc)
        self.worker.register_kv_caches({layer_name(l): cache[l] for l in range(s.layers)})
        self.sched = KVConnectorFactory.create_connector(self.config, KVConnectorRole.SCHEDULER,
                                                         kvc)
        # EngineCore: each worker's handshake metadata, merged by TP rank, to the scheduler's.
        self.sched.set_xfer_handshake_metadata({0: self.worker.get_handshake_metadata()})
        self.blocks = Blocks(cache.shape[2])
        self.hasher = get_request_block_hasher(BLOCK, sha256_cbor)
        self.n = 0
        self.seen = []

    def run(self, tokens, last_only=False):
        """One request's prefill step. A dict: logits, loaded tokens, errors, host timings."""
        self.n += 1
        req = Request("req-%d" % self.n, tokens, block_hasher=self.hasher)
        ext, is_async = self.sched.get_num_new_matched_tokens(req, 0)
        ext = ext or 0
        assert not is_async, "TuttiConnector loads synchronously (layer by layer)"
        blocks = self.blocks.take((len(tokens) + BLOCK - 1) // BLOCK)
        self.sched.update_state_after_alloc(req, KVCacheBlocks((blocks,)), ext)
        req.num_computed_tokens = ext
        out = SchedulerOutput(
            scheduled_new_reqs=[NewRequestData.from_request(req, (blocks,))],
            scheduled_cached_reqs=CachedRequestData.make_empty(),
            num_scheduled_tokens={req.request_id: len(tokens) - ext},
            total_num_scheduled_tokens=len(tokens) - ext, scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={}, num_common_prefix_blocks=[0], finished_req_ids=set(),
            free_encoder_mm_hashes=[])
        out.kv_connector_metadata = self.sched.build_connector_meta(out)
        waits = []

        def before_layer(l):  # the model wrote layer l's new K/V just before this
            t = time.perf_counter()
            self.worker.wait_for_layer_load(layer_name(l))
            waits.append(time.perf_counter() - t)
            self.worker.save_kv_layer(layer_name(l), self.cache[l], None)

        sync()
        t0 = time.perf_counter()
        self.worker.bind_connector_metadata(out.kv_connector_metadata)
        self.worker.start_load_kv(ForwardContext(no_compile_layers={}, attn_metadata={}))
        logits = self.model.forward(tokens[ext:], ext, blocks, self.cache, before_layer,
                                    last_only=last_only)
        enqueued = time.perf_counter()
        self.worker.wait_for_save()
        errors = self.worker.get_block_ids_with_load_errors()
        self.worker.get_finished(set())
        self.worker.clear_connector_metadata()
        sync()
        done = time.perf_counter()
        self.sched.update_connector_output(KVConnectorOutput(invalid_block_ids=set(errors)))
        req.num_computed_tokens = len(tokens)
        self.sched.request_finished(req, blocks)
        self.blocks.give(blocks)
        return dict(logits=logits, loaded=ext, errors=set(errors), ms=(done - t0) * 1e3,
                    enqueue_ms=(enqueued - t0) * 1e3, waits_ms=[w * 1e3 for w in waits])

    def events(self):
        got = list(self.sched.take_events())
        self.seen.extend(got)
        return got

    def wait_stored(self, blocks, timeout=30.0):
        """Waits until the BlockStored events (tuttid's stream through take_events) name
        `blocks` more blocks: a Lookup finds a block only once it is durable."""
        want = self.stored() + blocks
        deadline = time.monotonic() + timeout
        while self.stored() < want:
            if time.monotonic() > deadline:
                raise RuntimeError("only %d of %d blocks stored after %.0f s" % (
                    self.stored(), want, timeout))
            self.events()
            time.sleep(0.01)

    def stored(self):
        return sum(len(e.block_hashes) for e in self.seen if type(e).__name__ == "BlockStored")


def direct_engine(model, cache, daemon, ns):
    per_layer = [cache[l] for l in range(cache.shape[0])]
    objects = tutti.objects_from_tensors(ns.layout, per_layer)
    if DEV == "cuda":
        client = tutti.Client.attach(ns, cache.shape[2], objects, cuda_device=0,
                                     socket_path=daemon.socket, engine_id="direct")
    else:
        client = tutti.Client.attach(ns, cache.shape[2], objects,
                                     host_regions=[_SHM[id(cache)].region()],
                                     socket_path=daemon.socket, engine_id="direct")
    return Engine(model, cache, client, poison=False), client


def daemon_for(shape, layout, total_tokens, args, store_staging=None):
    slot = 2 * shape.layers * layout.object_bytes + 8192
    cap = max(int((total_tokens // BLOCK + 256) * slot * 1.2), 256 << 20)
    extra = 'gpu { mode: "cuda" }' if DEV == "cuda" else 'gpu { mode: "host" }'
    # Store staging big enough for a whole prompt's save in one step: these parts measure
    # loads; what a smaller staging does to saves is the connector's pending-save logic.
    staging = max(512 << 20, 2 * (total_tokens // BLOCK) * 2 * shape.layers * layout.object_bytes)
    return Tuttid(binary=args.tuttid, object_bytes=layout.object_bytes,
                  max_objects=2 * shape.layers, capacity=cap, dram=cap,
                  store_staging=store_staging or min(staging, 6 << 30), retrieve_staging=1 << 30, max_blocks_per_call=4096,
                  extra=extra)


def model_of(shape, dtype):
    weights = random_weights(shape, seed=0, device=DEV, dtype=dtype)
    return PagedLlama(shape, weights, BLOCK)


def shapes(big):
    if DEV == "cpu":
        return LlamaShape(vocab=512, hidden=256, layers=2, intermediate=512), torch.float32
    if big:
        return LlamaShape.llama3_8b(), torch.bfloat16
    return LlamaShape(vocab=32000, hidden=2048, layers=8, heads=16, kv_heads=8, head_dim=128,
                      intermediate=5632), torch.bfloat16


def layout_of(shape, dtype):
    return tutti.KvLayout(num_layers=shape.layers, kv_heads=shape.kv_heads,
                          head_dim=shape.head_dim, dtype_bytes=2 if dtype == torch.bfloat16 else 4,
                          block_tokens=BLOCK)


def max_abs(a, b):
    return float((a.float() - b.float()).abs().max())


def part_correct(args, rows):
    shape, dtype = shapes(False)
    model = model_of(shape, dtype)
    layout = layout_of(shape, dtype)
    rng = random.Random(5)
    prefix, suffix = (1024, 200) if DEV == "cuda" else (64, 20)
    prompt = [rng.randrange(shape.vocab) for _ in range(prefix + suffix)]
    nb = 2 * (len(prompt) // BLOCK + 2)
    with daemon_for(shape, layout, 4 * len(prompt), args) as daemon:
        eng = VllmEngine(model, new_cache(model, nb), daemon.socket, "end", "correct-8l")
        a = eng.run(prompt[:prefix])
        eng.wait_stored(prefix // BLOCK)
        b = eng.run(prompt)
        d_eng, client = direct_engine(model, new_cache(model, nb), daemon,
                                      tutti.Namespace("direct-8l", layout))
        d_eng.prefill(prompt[:prefix])
        d = d_eng.prefill(prompt, store=False)
        full = d_eng.prefill(prompt, use_cache=False, store=False)
        client.detach()
        eng.events()
    loaded_ok = b["loaded"] == (prefix // BLOCK) * BLOCK and not b["errors"]
    tail = full.logits[-b["logits"].shape[0]:]
    vs_direct = max_abs(b["logits"], d.logits[-b["logits"].shape[0]:])
    vs_full = max_abs(b["logits"], tail) / float(tail.abs().max())
    agree = float((b["logits"].argmax(-1) == tail.argmax(-1)).float().mean())
    stored = eng.stored()
    row = dict(part="correct", a_loaded=a["loaded"], b_loaded=b["loaded"],
               b_errors=sorted(b["errors"]), direct_hits=d.hits,
               max_abs_vs_direct=vs_direct, rel_err_vs_full=vs_full, argmax_agree_vs_full=agree,
               block_stored_events=stored,
               ok=bool(loaded_ok and vs_direct <= 1e-6 * max(1.0, float(tail.abs().max()))
                       and agree >= 0.97))
    rows.append(row)
    log("correct: %s" % json.dumps(row))


def part_ttft(args, rows):
    shape, dtype = shapes(True)
    model = model_of(shape, dtype)
    layout = layout_of(shape, dtype)
    rng = random.Random(7)
    modes = args.save_modes.split(",")
    for p in [int(x) for x in args.prefixes.split(",")]:
        prefix = [rng.randrange(shape.vocab) for _ in range(p)]
        nb = (p + args.suffix) // BLOCK + 8
        with daemon_for(shape, layout, (len(modes) + 1) * 3 * (p + args.suffix), args) as daemon:
            engines = {m: VllmEngine(model, new_cache(model, nb), daemon.socket, m, "ttft-" + m)
                       for m in modes}
            d_eng, client = direct_engine(model, new_cache(model, nb), daemon,
                                          tutti.Namespace("direct-8b-shape", layout))
            for eng in engines.values():
                eng.run(prefix)
                eng.wait_stored(p // BLOCK)
            d_eng.prefill(prefix)
            got = {m: dict(ms=[], waits=[], enq=[], diffs=[]) for m in modes}
            direct = []
            for rep in range(args.reps + 1):
                # A new suffix each time, so every path loads exactly the prefix, computes the
                # suffix and captures its full blocks (the connector saves them inside the step;
                # the direct engine stores them without waiting for the disk).
                prompt = prefix + [rng.randrange(shape.vocab) for _ in range(args.suffix)]
                runs = {m: eng.run(prompt, last_only=True) for m, eng in engines.items()}
                sync()
                t0 = time.perf_counter()
                d = d_eng.prefill(prompt, store=True, wait_durable=False, report=False)
                sync()
                d_ms = (time.perf_counter() - t0) * 1e3
                assert d.hits == p // BLOCK, d.hits
                for m, r in runs.items():
                    assert r["loaded"] == (p // BLOCK) * BLOCK and not r["errors"], (
                        m, r["loaded"], r["errors"])
                    g = got[m]
                    g["diffs"].append(max_abs(r["logits"][-1], d.logits[-1]))
                    if rep:  # rep 0 is a warm-up
                        g["ms"].append(r["ms"])
                        g["waits"].extend(r["waits_ms"])
                        g["enq"].append((r["enqueue_ms"], r["ms"]))
                if rep:
                    direct.append(d_ms)
            client.detach()
        for m, g in got.items():
            row = dict(part="ttft", save=m, prefix=p, suffix=args.suffix, reps=args.reps,
                       connector_ms=g["ms"], direct_ms=direct,
                       connector_median_ms=statistics.median(g["ms"]),
                       direct_median_ms=statistics.median(direct),
                       ttft_connector_vs_direct=statistics.median(g["ms"]) /
                       statistics.median(direct),
                       wait_for_layer_load_host_ms_max=max(g["waits"]),
                       wait_for_layer_load_host_ms_mean=statistics.mean(g["waits"]),
                       host_enqueue_done_ms=[e for e, _ in g["enq"]],
                       gpu_done_ms=[t for _, t in g["enq"]],
                       max_abs_logits_vs_direct=max(g["diffs"]))
            rows.append(row)
            log("ttft %d+%d save=%s: connector %.1f ms, direct %.1f ms, ratio %.3f; "
                "wait_for_layer_load host max %.3f ms; enqueue done %.1f of %.1f ms" % (
                    p, args.suffix, m, row["connector_median_ms"], row["direct_median_ms"],
                    row["ttft_connector_vs_direct"], row["wait_for_layer_load_host_ms_max"],
                    statistics.median(row["host_enqueue_done_ms"]),
                    statistics.median(row["gpu_done_ms"])))


def part_save(args, rows):
    shape, dtype = shapes(True)
    model = model_of(shape, dtype)
    layout = layout_of(shape, dtype)
    rng = random.Random(9)
    p = int(args.prefixes.split(",")[0])
    nb = p // BLOCK + 8
    with daemon_for(shape, layout, 2 * (args.reps + 1) * p + 4 * p, args) as daemon:
        engines = {m: VllmEngine(model, new_cache(model, nb), daemon.socket, m, "save-" + m)
                   for m in ("end", "layer")}
        times = {m: [] for m in engines}
        for rep in range(args.reps + 1):
            for m, eng in engines.items():
                r = eng.run([rng.randrange(shape.vocab) for _ in range(p)], last_only=True)
                if rep:
                    times[m].append(r["ms"])
        for eng in engines.values():
            eng.wait_stored(max(0, (args.reps + 1) * (p // BLOCK) - eng.stored()))
        stored = {m: eng.stored() for m, eng in engines.items()}
    row = dict(part="save", prompt_tokens=p, reps=args.reps, end_ms=times["end"],
               layer_ms=times["layer"],
               layer_vs_end=statistics.median(times["layer"]) / statistics.median(times["end"]),
               block_stored_events=stored)
    rows.append(row)
    log("save %d tokens: end %.1f ms, layer %.1f ms, layer/end %.3f" % (
        p, statistics.median(times["end"]), statistics.median(times["layer"]),
        row["layer_vs_end"]))


def part_refused(args, rows):
    """A 4096-token prompt saves 512 MiB in one step; with tuttid's default 256 MiB of store
    staging most of it is refused at first: the connector's retries (cuda mode: from a side
    stream) must get every block stored, in both save modes, and B then loads all of it."""
    shape, dtype = shapes(True)
    model = model_of(shape, dtype)
    layout = layout_of(shape, dtype)
    rng = random.Random(13)
    p = int(args.prefixes.split(",")[0])
    nb = (p + args.suffix) // BLOCK + 8
    for mode in ("end", "layer"):
        prefix = [rng.randrange(shape.vocab) for _ in range(p)]
        with daemon_for(shape, layout, 4 * p, args, store_staging=256 << 20) as daemon:
            eng = VllmEngine(model, new_cache(model, nb), daemon.socket, mode, "refused-" + mode)
            a = eng.run(prefix)
            t0 = time.perf_counter()
            eng.wait_stored(p // BLOCK, timeout=120.0)
            stored_s = time.perf_counter() - t0
            b = eng.run(prefix + [rng.randrange(shape.vocab) for _ in range(args.suffix)])
            stats = eng.worker._worker.save_stats() if hasattr(eng.worker, "_worker") else {}
        row = dict(part="refused", save=mode, prompt_tokens=p, store_staging_mib=256,
                   a_step_ms=a["ms"], all_stored_after_s=stored_s, b_loaded=b["loaded"],
                   b_errors=sorted(b["errors"]), save_stats=stats,
                   ok=b["loaded"] == (p // BLOCK) * BLOCK and not b["errors"])
        rows.append(row)
        log("refused %s: %s" % (mode, json.dumps(row)))


def main():
    global DEV
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tuttid")
    ap.add_argument("--parts", default="correct,ttft,save")
    ap.add_argument("--prefixes", default="4096,16384")
    ap.add_argument("--suffix", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--save-modes", default="end,layer", help="the ttft part's connector saves")
    ap.add_argument("--cpu-dry-run", action="store_true")
    args = ap.parse_args()
    if args.cpu_dry_run:
        DEV = "cpu"
        args.prefixes, args.suffix, args.reps = "64", 16, 2
    os.makedirs(args.out, exist_ok=True)
    rows, failed = [], []
    for part in args.parts.split(","):
        try:
            {"correct": part_correct, "ttft": part_ttft, "save": part_save,
             "refused": part_refused}[part](args, rows)
        except Exception:
            traceback.print_exc()
            failed.append(part)
    meta = dict(date=time.strftime("%Y-%m-%d"), host=platform.node(),
                machine=("nvidia-h200 device machine (%s)" % torch.cuda.get_device_name(0))
                if DEV == "cuda" else "cpu dry run",
                command="python3 tests/e2e/vllm_connector_gpu.py --parts %s --prefixes %s "
                        "--suffix %d --reps %d%s" % (args.parts, args.prefixes, args.suffix,
                                                    args.reps,
                                                    " --cpu-dry-run" if args.cpu_dry_run else ""))
    with open(os.path.join(args.out, "vllm_connector.jsonl"), "a") as f:
        for r in rows:
            f.write(json.dumps(dict(meta, **r)) + "\n")
    log("%-8s %s" % ("part", "result"))
    for r in rows:
        key = {"correct": "ok", "ttft": "ttft_connector_vs_direct", "save": "layer_vs_end",
               "refused": "ok"}
        log("%-8s %-6s %s=%s" % (r["part"], r.get("save", ""), key[r["part"]], r[key[r["part"]]]))
    if failed:
        log("FAILED parts: %s" % ",".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()

"""Where a Store call's time goes between the Python client and tuttid (issue 20; GPU machine).

Starts tuttid (tutti.testing.Tuttid: $TUTTID_BIN, the pool on one /dev/shm directory), attaches a
Llama-3-8B-shaped cache of 512 blocks (2 MiB each) in GPU memory, and stores them in calls of 64
blocks, three rounds under new keys per variant: through Client.store, through the generated stub
with a blocking call and with a future (the client's way), then Client.store again. Prints per
variant the client's median and mean call time against tuttid's own part (admin Stats captures,
capture_seconds, of it staging wait and gather), then cuStreamSynchronize as the client calls it
and a KeepAlive round trip, blocking and by future. A diagnostic: prints only, asserts nothing.

    TUTTID_BIN=$PWD/.bundle/tuttid.sh PYTHONPATH=.bundle/site python3 bench/store_call_overhead.py
"""
import os, sys, time, statistics
sys.path.insert(0, "tests/e2e")
import torch
import tutti
from tutti.testing import Tuttid
from tutti.v1 import kvcache_pb2 as pb
import admin_stats

LAYERS, OBJ = 32, 32 << 10
L = tutti.KvLayout(num_layers=LAYERS, kv_heads=8, head_dim=128, dtype_bytes=2, block_tokens=16)
NS = tutti.Namespace("overhead", L)
N, BATCH = 512, 64
cache = torch.empty((LAYERS, 2, N, OBJ), dtype=torch.uint8, device="cuda")
cache.random_(0, 256)
torch.cuda.synchronize()
objects = tutti.objects_from_tensors(L, [cache[l] for l in range(LAYERS)])
root = "/dev/shm/tovh"
os.system("rm -rf " + root)
with Tuttid(capacity=24 << 30, object_bytes=OBJ, max_objects=64, store_staging=1 << 30,
            retrieve_staging=256 << 20, max_blocks_per_call=2048, root=root) as d:
    c = tutti.Client.attach(NS, N, objects, cuda_device=0, socket_path=d.socket, engine_id="ovh")
    st = lambda: admin_stats.stats(d.admin_socket)
    def rnd(tag, fn, rounds=3):
        s0 = st(); times = []
        for r in range(rounds):
            keys = tutti.chain_keys(range(N * 16), 16, parent=os.urandom(16))
            for b in range(0, N, BATCH):
                t = time.perf_counter(); fn(keys[b:b + BATCH], list(range(b, b + BATCH)))
                times.append(time.perf_counter() - t)
            deadline = time.time() + 30
            while st().get("write_backlog_blocks", 0) and time.time() < deadline: time.sleep(0.01)
        s1 = st(); n = s1.get("captures", 0) - s0.get("captures", 0)
        per = lambda k: 1000 * (s1.get(k, 0) - s0.get(k, 0)) / max(n, 1)
        print("%-28s calls %3d  client median %.3f mean %.3f ms | tuttid %.3f (wait %.3f, gather %.3f)"
              % (tag, len(times), 1000 * statistics.median(times), 1000 * statistics.mean(times),
                 per("capture_seconds"), per("capture_wait_seconds"), per("capture_gather_seconds")))
    rnd("client.store", lambda k, b: c.store(k, b))
    sid, gen = c._current()
    stub = c._stub
    def raw(k, b, fut):
        req = pb.StoreRequest(**sid.fields(), ticket=c._next_ticket())
        for kk, bb in zip(k, b): req.blocks.add(key=kk, engine_block=bb)
        return stub.Store.future(req, timeout=30).result() if fut else stub.Store(req, timeout=30)
    rnd("stub.Store blocking", lambda k, b: raw(k, b, False))
    rnd("stub.Store future", lambda k, b: raw(k, b, True))
    rnd("client.store", lambda k, b: c.store(k, b))
    from tutti import _cuda
    from tutti._retrieval import _stream_handle
    t = time.perf_counter()
    for _ in range(200): _cuda.synchronize_stream(0, _stream_handle(None))
    print("synchronize_stream: %.3f ms" % (1000 * (time.perf_counter() - t) / 200))
    ka = pb.KeepAliveRequest(**sid.fields()) if hasattr(pb, "KeepAliveRequest") else None
    if ka is not None:
        for fut in (False, True):
            t = time.perf_counter()
            for _ in range(200):
                stub.KeepAlive.future(ka, timeout=5).result() if fut else stub.KeepAlive(ka, timeout=5)
            print("KeepAlive %s: %.3f ms" % ("future" if fut else "blocking", 1000 * (time.perf_counter() - t) / 200))
    c.detach()

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
import os
import shutil
import statistics
import sys
import time

sys.path.insert(0, "tests/e2e")
import torch  # noqa: E402

import admin_stats  # noqa: E402
import tutti  # noqa: E402
from tutti import _cuda  # noqa: E402
from tutti._retrieval import _stream_handle  # noqa: E402
from tutti.testing import Tuttid  # noqa: E402
from tutti.v1 import kvcache_pb2 as pb  # noqa: E402

LAYERS, OBJ = 32, 32 << 10
LAYOUT = tutti.KvLayout(num_layers=LAYERS, kv_heads=8, head_dim=128, dtype_bytes=2,
                        block_tokens=16)
NS = tutti.Namespace("overhead", LAYOUT)
N, BATCH, ROUNDS = 512, 64, 3
ROOT = "/dev/shm/tovh"


def per_ms(seconds, n):
    return 1000 * seconds / n


def timed_rounds(tag, daemon, store):
    """ROUNDS stores of all N blocks under new keys in calls of BATCH; prints the split."""
    s0 = admin_stats.stats(daemon.admin_socket)
    times = []
    for _ in range(ROUNDS):
        keys = tutti.chain_keys(range(N * 16), 16, parent=os.urandom(16))
        for b in range(0, N, BATCH):
            t = time.perf_counter()
            store(keys[b:b + BATCH], list(range(b, b + BATCH)))
            times.append(time.perf_counter() - t)
        deadline = time.time() + 30  # the backlog written before the next round
        while (admin_stats.stats(daemon.admin_socket).get("write_backlog_blocks", 0)
               and time.time() < deadline):
            time.sleep(0.01)
    s1 = admin_stats.stats(daemon.admin_socket)
    n = max(s1.get("captures", 0) - s0.get("captures", 0), 1)
    d = lambda k: per_ms(s1.get(k, 0) - s0.get(k, 0), n)
    print("%-28s calls %3d  client median %.3f mean %.3f ms | tuttid %.3f (wait %.3f, gather %.3f)"
          % (tag, len(times), 1000 * statistics.median(times), 1000 * statistics.mean(times),
             d("capture_seconds"), d("capture_wait_seconds"), d("capture_gather_seconds")))


def mean_ms(fn, reps=200):
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return per_ms(time.perf_counter() - t, reps)


def main():
    cache = torch.empty((LAYERS, 2, N, OBJ), dtype=torch.uint8, device="cuda")
    cache.random_(0, 256)
    torch.cuda.synchronize()
    objects = tutti.objects_from_tensors(LAYOUT, [cache[layer] for layer in range(LAYERS)])
    shutil.rmtree(ROOT, ignore_errors=True)
    with Tuttid(capacity=24 << 30, object_bytes=OBJ, max_objects=64, store_staging=1 << 30,
                retrieve_staging=256 << 20, max_blocks_per_call=2048, root=ROOT) as daemon:
        c = tutti.Client.attach(NS, N, objects, cuda_device=0, socket_path=daemon.socket,
                                engine_id="ovh")
        sid, _ = c._current()
        stub = c._stub

        def by_stub(keys, blocks, future):
            req = pb.StoreRequest(**sid.fields(), ticket=c._next_ticket())
            for k, b in zip(keys, blocks):
                req.blocks.add(key=k, engine_block=b)
            if future:
                return stub.Store.future(req, timeout=30).result()
            return stub.Store(req, timeout=30)

        timed_rounds("client.store", daemon, c.store)
        timed_rounds("stub.Store blocking", daemon, lambda k, b: by_stub(k, b, False))
        timed_rounds("stub.Store future", daemon, lambda k, b: by_stub(k, b, True))
        timed_rounds("client.store", daemon, c.store)
        print("synchronize_stream: %.3f ms" % mean_ms(
            lambda: _cuda.synchronize_stream(0, _stream_handle(None))))
        ka = pb.KeepAliveRequest(**sid.fields())
        print("KeepAlive blocking: %.3f ms" % mean_ms(lambda: stub.KeepAlive(ka, timeout=5)))
        print("KeepAlive future: %.3f ms" % mean_ms(
            lambda: stub.KeepAlive.future(ka, timeout=5).result()))
        c.detach()


if __name__ == "__main__":
    main()

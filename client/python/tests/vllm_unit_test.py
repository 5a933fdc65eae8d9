"""tutti.vllm without a tuttid: the geometry of every KV layout vLLM may hand a worker (the
physical orders of [layers, blocks, heads, tokens, content], the old fused layouts, MLA), the
connector's own keys (the same whatever vLLM's per-process seed, apart where vLLM's extra keys
differ), the events' translation, and the scheduler's lookups, loads and saves
against fake per-rank clients. Needs tests/vllm/stub first on sys.path (the BUILD does it)."""

import dataclasses
import itertools
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.environ.get("TEST_SRCDIR", ""), "tutti/tests/vllm/stub")
                if os.environ.get("TEST_SRCDIR") else
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../tests/vllm/stub"))

import torch  # noqa: E402

from vllm.config import CacheConfig
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                        MLAAttentionSpec)
from vllm.v1.request import Request
from vllm.utils.hashing import sha256_cbor

import tutti
from tutti.vllm import geometry as geo
from tutti.vllm import keys as vkeys
from tutti.vllm.events import BlockInfo, EventTranslator
from tutti.vllm.metadata import TuttiHandshake
from tutti.vllm.scheduler import TuttiScheduler

L, B, H, N, D = 3, 5, 2, 4, 8  # layers, blocks, kv heads, tokens per block, head_size
NAMES = ["model.layers.%d.self_attn.attn" % i for i in range(L)]


def config(spec, names=NAMES, num_blocks=B):
    return KVCacheConfig(num_blocks, [], [KVCacheGroupSpec(list(names), spec)])


SPEC = FullAttentionSpec(block_size=N, num_kv_heads=H, head_size=D, dtype=torch.float16)


def packed_caches(order):
    """Per-layer [blocks, heads, tokens, 2*D] views of one cache whose physical order is
    `order`, a permutation of "LBHNC" (outermost first)."""
    sizes = dict(L=L, B=B, H=H, N=N, C=2 * D)
    phys = torch.arange(L * B * H * N * 2 * D, dtype=torch.float16).view(
        [sizes[c] for c in order])
    logical = phys.permute([order.index(c) for c in "LBHNC"])
    return {NAMES[l]: logical[l] for l in range(L)}, logical


class GeometryTest(unittest.TestCase):
    def test_packed_orders(self):
        """Every order of [L, B, H, N] with content innermost, and content elsewhere: accepted
        (PACKED) exactly when one layer's block is contiguous, with its order and placements."""
        for perm in itertools.permutations("LBHN"):
            for cpos in range(5):
                order = "".join(perm[:cpos]) + "C" + "".join(perm[cpos:])
                caches, logical = packed_caches(order)
                contiguous = set(order[-3:]) == set("HNC")
                with self.subTest(order=order):
                    if not contiguous:
                        with self.assertRaisesRegex(ValueError, r"layer model\.layers\.\d.*"
                                                    r"shape \[5, 2, 4, 16\].*not contiguous"):
                            geo.derive(caches, config(SPEC))
                        continue
                    g = geo.derive(caches, config(SPEC))
                    self.assertEqual(g.layout.format, "packed")
                    self.assertEqual((g.layout.kv_heads, g.layout.head_dim,
                                      g.layout.block_tokens), (H, 2 * D, N))
                    self.assertEqual(g.order, order)
                    self.assertEqual(g.in_block, order[-3:])
                    self.assertEqual(len(g.objects), L)
                    es = 2
                    for l, o in enumerate(g.objects):
                        self.assertEqual(o.base, logical[l].data_ptr())
                        self.assertEqual(o.block_stride, logical.stride(1) * es)
                        # block b of layer l really is object_bytes from o.base + b * stride
                        blk = logical[l, 3]
                        self.assertEqual(blk.data_ptr(), o.base + 3 * o.block_stride)

    def test_default_order_is_lbnhc(self):
        caches, _ = packed_caches("LBNHC")
        g = geo.derive(caches)  # no config: shapes alone
        self.assertEqual((g.order, g.in_block, g.num_blocks), ("LBNHC", "NHC", B))

    def test_layer_names_sorted_by_index(self):
        caches, logical = packed_caches("LBNHC")
        shuffled = {NAMES[2]: caches[NAMES[2]], NAMES[0]: caches[NAMES[0]],
                    NAMES[1]: caches[NAMES[1]]}
        g = geo.derive(shuffled)
        self.assertEqual(g.layer_names, tuple(NAMES))
        self.assertEqual(g.objects[0].base, logical[0].data_ptr())
        self.assertEqual(g.layer_index(NAMES[2]), 2)

    def test_old_fused_kv_first(self):
        t = torch.zeros(L, 2, B, N, H, D, dtype=torch.bfloat16)
        g = geo.derive({NAMES[l]: t[l] for l in range(L)}, config(SPEC))
        self.assertEqual((g.layout.format, g.layout.head_dim, g.in_block), ("fused", D, "NHD"))
        self.assertEqual(g.order, "L2BNHD")
        self.assertEqual(len(g.objects), 2 * L)
        self.assertEqual(g.objects[1].base, t[0, 1].data_ptr())
        self.assertEqual(g.objects[0].block_stride, N * H * D * 2)
        self.assertEqual(g.dtype, "bfloat16")

    def test_old_fused_blocks_first(self):
        t = torch.zeros(L, B, 2, N, H, D, dtype=torch.float16)
        g = geo.derive({NAMES[l]: t[l] for l in range(L)}, config(SPEC))
        self.assertEqual((g.layout.format, g.order), ("fused", "LB2NHD"))
        k, v = g.objects[2], g.objects[3]  # layer 1
        self.assertEqual(k.base, t[1, 0, 0].data_ptr())
        self.assertEqual(v.base, t[1, 0, 1].data_ptr())
        self.assertEqual(k.block_stride, 2 * N * H * D * 2)

    def test_fused_two_blocks_needs_config(self):
        t = torch.zeros(L, 2, 2, N, H, D, dtype=torch.float16)  # [B=2, 2, ...]
        g = geo.derive({NAMES[l]: t[l] for l in range(L)}, config(SPEC, num_blocks=2))
        self.assertEqual(g.order, "L2BNHD")  # ambiguous: vLLM's KV-first default

    def test_fused_hnd(self):
        t = torch.zeros(L, 2, B, H, N, D, dtype=torch.float16)
        g = geo.derive({NAMES[l]: t[l] for l in range(L)}, config(SPEC))
        self.assertEqual(g.in_block, "HND")

    def test_mla(self):
        spec = MLAAttentionSpec(block_size=N, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
        t = torch.zeros(L, B, N, 576, dtype=torch.bfloat16)
        g = geo.derive({NAMES[l]: t[l] for l in range(L)}, config(spec))
        self.assertEqual((g.layout.format, g.layout.kv_heads, g.layout.head_dim), ("mla", 1, 576))
        self.assertEqual(g.layout.object_bytes, N * 576 * 2)

    def test_refusals(self):
        caches, _ = packed_caches("LBNHC")
        bad = FullAttentionSpec(block_size=N, num_kv_heads=H + 1, head_size=D, dtype=None)
        with self.assertRaisesRegex(ValueError, "spec says heads 3"):
            geo.derive(caches, config(bad))
        two = KVCacheConfig(B, [], [KVCacheGroupSpec(NAMES, SPEC), KVCacheGroupSpec([], SPEC)])
        with self.assertRaisesRegex(ValueError, "2 groups"):
            geo.derive(caches, two)
        with self.assertRaisesRegex(ValueError, "6 dims"):
            geo.derive({"x": torch.zeros(1, 1, 1, 1, 1, 1)})
        mixed = dict(caches)
        mixed[NAMES[1]] = caches[NAMES[1]].to(torch.float32)
        with self.assertRaisesRegex(ValueError, "every layer alike"):
            geo.derive(mixed)


class HybridGroupsTest(unittest.TestCase):
    """tutti.vllm.groups: the groups of a hybrid KVCacheConfig and the cut every group serves."""

    def present(self, have):
        """first_missing over {group: set of blocks held}; records the calls."""
        self.calls = []

        def first_missing(g, begin, end):
            self.calls.append((g, begin, end))
            return next((i for i in range(begin, end) if i not in have[g]), end)
        return first_missing

    def test_cut(self):
        from tutti.vllm.groups import cut
        every = set(range(100))
        # No sliding group: the full groups' hits.
        self.assertEqual(cut(0, 8, [], self.present({})), 8)
        # The window before the cut held: the full hits.
        self.assertEqual(cut(0, 8, [(1, 2)], self.present({1: {6, 7}})), 8)
        self.assertEqual(self.calls, [(1, 6, 8)])
        # Blocks 0..3 only: 8 -> 6 (block 6 missing) -> 4 (block 4 missing): window [2, 4).
        self.assertEqual(cut(0, 8, [(1, 2)], self.present({1: {0, 1, 2, 3}})), 4)
        self.assertEqual(self.calls, [(1, 6, 8), (1, 4, 6), (1, 2, 4)])
        # A hole in the window: the cut moves to the hole, which needs its own window.
        self.assertEqual(cut(0, 10, [(1, 3)], self.present({1: every - {8}})), 8)
        self.assertEqual(cut(0, 10, [(1, 3)], self.present({1: every - {9}})), 9)
        # Below the local (GPU) prefix nothing is needed: only [max(local, k - w), k).
        self.assertEqual(cut(5, 7, [(1, 4)], self.present({1: {5, 6}})), 7)
        self.assertEqual(self.calls, [(1, 5, 7)])
        # Nothing past the local prefix: the local prefix (a miss).
        self.assertEqual(cut(3, 8, [(1, 2)], self.present({1: set()})), 3)
        # Near the start a window needs every block from 0.
        self.assertEqual(cut(0, 1, [(1, 8)], self.present({1: {0}})), 1)
        # Two sliding groups: each moves the cut in turn.
        self.assertEqual(cut(0, 10, [(1, 2), (2, 4)],
                             self.present({1: every, 2: every - {7}})), 7)
        # Bounded rounds: a miss once they are spent.
        self.assertEqual(cut(0, 40, [(1, 1)], self.present({1: {0}}), max_rounds=3), 0)
        self.assertEqual(len(self.calls), 3)

    def test_window_and_skipped_blocks(self):
        from tutti.vllm import groups as kvg
        self.assertEqual(kvg.window_blocks(128, 16), 8)   # tokens [k*16 - 127, k*16)
        self.assertEqual(kvg.window_blocks(129, 16), 8)
        self.assertEqual(kvg.window_blocks(130, 16), 9)
        self.assertEqual(kvg.window_blocks(1, 16), 0)
        g = kvg.Group(0, kvg.SLIDING, (), None, 32, 2)
        # vLLM's get_num_skipped_tokens: max(0, c - W + 1); blocks wholly before it are freed.
        self.assertEqual([kvg.skipped_blocks(g, c, 16) for c in (0, 31, 47, 48, 64)],
                         [0, 0, 1, 1, 2])
        self.assertEqual(kvg.skipped_blocks(kvg.Group(0, kvg.FULL, (), None), 640, 16), 0)

    def test_groups_and_refusals(self):
        from vllm.v1.kv_cache_interface import MambaSpec, SlidingWindowSpec
        from tutti.vllm import groups as kvg
        sw = SlidingWindowSpec(block_size=N, num_kv_heads=H, head_size=D, dtype=torch.float16,
                               sliding_window=9)
        cfg = KVCacheConfig(B, [], [KVCacheGroupSpec(NAMES[:1], SPEC),
                                    KVCacheGroupSpec(NAMES[1:], sw)])
        gs = kvg.groups_of(cfg)
        self.assertEqual([(g.kind, g.window_tokens, g.window_blocks) for g in gs],
                         [("full", 0, 0), ("sliding", 9, 2)])
        self.assertTrue(kvg.is_hybrid(gs))
        self.assertFalse(kvg.is_hybrid(kvg.groups_of(config(SPEC))))
        mamba = KVCacheConfig(B, [], [KVCacheGroupSpec(NAMES[:2], SPEC),
                                      KVCacheGroupSpec(["model.layers.9.mixer"], MambaSpec(N))])
        with self.assertRaisesRegex(ValueError, r"KV cache group 1 \(MambaSpec; layers "
                                    r"model.layers.9.mixer\).*state at every block boundary"):
            kvg.groups_of(mamba)
        chunked = FullAttentionSpec(block_size=N, num_kv_heads=H, head_size=D, dtype=None,
                                    attention_chunk_size=8)
        with self.assertRaisesRegex(ValueError, "chunked local attention"):
            kvg.groups_of(config(chunked))
        other = SlidingWindowSpec(block_size=2 * N, num_kv_heads=H, head_size=D, dtype=None,
                                  sliding_window=9)
        with self.assertRaisesRegex(ValueError, "one block size"):
            kvg.groups_of(KVCacheConfig(B, [], [KVCacheGroupSpec(NAMES[:1], SPEC),
                                                KVCacheGroupSpec(NAMES[1:], other)]))

    def test_derive_groups_with_shared_tensors(self):
        """vLLM gives layer i of every group one tensor: each group is derived alone, and its
        namespace carries the group."""
        from vllm.config import ModelConfig
        from vllm.v1.kv_cache_interface import SlidingWindowSpec
        from tutti.vllm import groups as kvg
        sw = SlidingWindowSpec(block_size=N, num_kv_heads=H, head_size=D, dtype=torch.float16,
                               sliding_window=9)
        slots = torch.zeros(2, B, H, N, 2 * D, dtype=torch.float16)
        names = ["model.layers.%d.self_attn.attn" % i for i in range(4)]
        caches = {n: slots[i // 2] for i, n in enumerate(names)}
        cfg = KVCacheConfig(B, [], [KVCacheGroupSpec(names[0::2], sw),
                                    KVCacheGroupSpec(names[1::2], SPEC)])
        pairs = geo.derive_groups(caches, cfg)
        self.assertEqual([g.kind for g, _ in pairs], ["sliding", "full"])
        self.assertEqual([geom.layer_names for _, geom in pairs],
                         [tuple(names[0::2]), tuple(names[1::2])])
        self.assertEqual(pairs[0][1].objects[1].base, pairs[1][1].objects[1].base)
        ns = vkeys.namespace(ModelConfig(model="m"), pairs[0][1], 0, 1, "v")
        self.assertTrue(kvg.group_namespace(ns, pairs[0][0], 2).model_id.endswith(
            "|group=0/2:sliding_window=9"))
        self.assertIs(kvg.group_namespace(ns, pairs[1][0], 1), ns)
        with self.assertRaisesRegex(ValueError, "in no KV cache group"):
            geo.derive_groups(dict(caches, extra=slots[0]), cfg)


class KeysTest(unittest.TestCase):
    def test_cache_config(self):
        with self.assertRaisesRegex(ValueError, "--enable-prefix-caching"):
            vkeys.check_cache_config(CacheConfig(enable_prefix_caching=False))
        for algo in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
            vkeys.check_cache_config(CacheConfig(prefix_caching_hash_algo=algo))

    def test_keys_do_not_depend_on_vllms_seed(self):
        """vLLM's hashes change with its per-process seed (init_none_hash without
        PYTHONHASHSEED); the keys do not."""
        from vllm.v1.core import kv_cache_utils as kcu
        saved = kcu.NONE_HASH
        try:
            tokens = list(range(100, 100 + 4 * BS + 1))
            kcu.NONE_HASH = b"\x01" * 32
            a = Request("a", tokens, block_hasher=hasher)
            kcu.NONE_HASH = b"\x02" * 32
            b = Request("b", tokens, block_hasher=hasher)
            self.assertNotEqual(a.block_hashes, b.block_hashes)
            ka, kb = vkeys.request_keys(a, BS, 10), vkeys.request_keys(b, BS, 10)
            self.assertEqual(len(ka), 4)
            self.assertEqual(ka, kb)
            self.assertEqual(len(set(ka)), 4)
            # derived in steps (tokens appended) as at once
            c = Request("c", tokens[:2 * BS + 1], block_hasher=hasher)
            chain = vkeys.KeyChain(BS)
            self.assertEqual(chain.derive(c, 10), 2)
            c.append_output_token_ids(tokens[2 * BS + 1:])
            self.assertEqual(chain.derive(c, 10), 4)
            self.assertEqual(chain.keys(0, 4), ka)
        finally:
            kcu.NONE_HASH = saved

    def test_extra_keys_keep_requests_apart(self):
        tokens = list(range(3 * BS))

        class Lora:
            lora_name, lora_int_id = "adapter-a", 7

        class Pos:
            offset, length = 2, 3

        class Mm:
            identifier, mm_position = "img-hash-1", Pos

        plain = vkeys.request_keys(Request("p", tokens), BS, 3)
        salted = vkeys.request_keys(Request("s", tokens, cache_salt="salt"), BS, 3)
        lora = vkeys.request_keys(Request("l", tokens, lora_request=Lora()), BS, 3)
        mm = vkeys.request_keys(Request("m", tokens, mm_features=[Mm]), BS, 3)
        self.assertEqual(len({tuple(k) for k in (plain, salted, lora, mm)}), 4)
        self.assertTrue(all(len(set(k)) == 3 for k in (plain, salted, lora, mm)))
        self.assertEqual(vkeys.request_keys(Request("s2", tokens, cache_salt="salt"), BS, 3),
                         salted)

        class Odd:
            pass
        r = Request("o", tokens, cache_salt=Odd())
        with self.assertRaisesRegex(ValueError, "extra key is a Odd"):
            vkeys.request_keys(r, BS, 1)

    def test_namespace(self):
        caches, _ = packed_caches("LBNHC")
        g = geo.derive(caches)
        from vllm.config import ModelConfig
        ns = vkeys.namespace(ModelConfig(model="m/x", revision="r1"), g, 1, 2, "0.13.0")
        self.assertEqual(ns.model_id, "m/x@r1|kv=float16|packed:NHC")
        self.assertEqual(ns.hash_scheme, "tutti-vllm-keys-v2@0.13.0")
        self.assertEqual((ns.tp_rank, ns.tp_size), (1, 2))


def info(i):
    return BlockInfo(bytes([i]) * 32, bytes([i - 1]) * 32 if i else None, tuple(range(4)))


class EventsTest(unittest.TestCase):
    def setUp(self):
        self.t = EventTranslator(tp_size=2, block_size=4)
        for i in range(4):
            self.t.remember(bytes([i]) * 16, info(i))
        self.assertEqual(self.t.on_stream_start(0, 11, 100, 0, False), [])
        self.assertEqual(self.t.on_stream_start(1, 22, 200, 0, False), [])

    def test_stored_once_every_rank_has_it(self):
        k = bytes([1]) * 16
        self.assertEqual(self.t.on_events(0, [("stored", k)]), [])
        out = self.t.on_events(1, [("stored", k)])
        self.assertEqual(len(out), 1)
        e = out[0]
        self.assertIsInstance(e, BlockStored)
        self.assertEqual((e.block_hashes, e.parent_block_hash, e.medium, e.block_size),
                         ([bytes([1]) * 32], bytes([0]) * 32, "STORAGE", 4))
        self.assertEqual(e.locality, "LOCAL")
        self.assertEqual(e.token_ids, [0, 1, 2, 3])
        self.assertEqual(self.t.on_events(0, [("stored", k)]), [])  # once

    def test_removed_when_any_rank_removes(self):
        k = bytes([2]) * 16
        self.t.on_events(0, [("stored", k)])
        self.t.on_events(1, [("stored", k)])
        out = self.t.on_events(1, [("removed", k)])
        self.assertEqual(out, [BlockRemoved(block_hashes=[bytes([2]) * 32], medium="STORAGE",
                                            locality="LOCAL")])
        self.assertEqual(self.t.on_events(0, [("removed", k)]), [])
        self.assertEqual(self.t.on_events(1, [("stored", k)]), [])  # rank 0 no longer has it

    def announce(self, t, i):
        k = bytes([i]) * 16
        t.remember(k, info(i))
        t.on_stream_start(0, 11, 100, 0, False)
        stored = t.on_events(0, [("stored", k)])
        removed = t.on_events(0, [("removed", k)])
        self.assertEqual((len(stored), len(removed)), (1, 1))
        return stored[0], removed[0]

    def test_medium_and_locality_for_older_consumers(self):
        stored, removed = self.announce(EventTranslator(1, 4, medium="DISK", locality=""), 1)
        self.assertEqual((stored.medium, stored.locality), ("DISK", None))
        self.assertEqual((removed.medium, removed.locality), ("DISK", None))
        stored, removed = self.announce(EventTranslator(1, 4, locality="REMOTE"), 2)
        self.assertEqual((stored.medium, stored.locality, removed.locality),
                         ("STORAGE", "REMOTE", "REMOTE"))

    def test_no_locality_where_vllm_events_have_no_such_field(self):
        # vLLM before vllm#48281: the same events without `locality`
        @dataclasses.dataclass(frozen=True)
        class OldStored:
            block_hashes: list
            parent_block_hash: object
            token_ids: list
            block_size: int
            lora_id: object
            medium: object
            lora_name: object
            extra_keys: object = None

        @dataclasses.dataclass(frozen=True)
        class OldRemoved:
            block_hashes: list
            medium: object

        t = EventTranslator(1, 4, stored_type=OldStored, removed_type=OldRemoved)
        self.assertEqual(t.locality_published, "")
        stored, removed = self.announce(t, 3)
        self.assertEqual((type(stored), stored.medium, type(removed)),
                         (OldStored, "STORAGE", OldRemoved))

    def test_bad_medium_or_locality_is_refused(self):
        with self.assertRaisesRegex(ValueError, "events medium"):
            EventTranslator(1, 4, medium="")
        with self.assertRaisesRegex(ValueError, "events locality"):
            EventTranslator(1, 4, locality="NEARBY")

    def test_unknown_keys_are_skipped(self):
        self.assertEqual(self.t.on_events(0, [("stored", b"z" * 16)]), [])
        self.assertEqual(self.t.unknown_keys, 1)

    def test_restart_rules(self):
        k = bytes([3]) * 16
        self.t.on_events(0, [("stored", k)])
        self.t.on_events(1, [("stored", k)])
        self.assertEqual(self.t.on_stream_start(0, 11, 100, 0, True), [])     # resumed
        self.assertEqual(self.t.on_stream_start(0, 11, 101, 0, False), [])    # clean restart
        self.assertEqual(self.t.on_events(0, [("removed", k)])[0].block_hashes,
                         [bytes([3]) * 32])  # still announced after the clean restart
        self.assertEqual(self.t.on_stream_start(0, 11, 102, 5, False), [AllBlocksCleared()])
        self.assertEqual(self.t.on_stream_start(1, 23, 200, 0, False), [AllBlocksCleared()])
        self.assertEqual(self.t.on_stream_start(1, 23, 200, 0, False), [AllBlocksCleared()])

    def test_clear_forgets_the_wiped_rank(self):
        k = bytes([1]) * 16
        self.t.on_events(0, [("stored", k)])
        self.t.on_events(1, [("stored", k)])
        self.t.on_stream_start(1, 99, 201, 0, False)  # rank 1's pool is new
        self.assertEqual(self.t.on_events(0, [("removed", k)]), [])  # nothing announced now
        self.t.on_events(0, [("stored", k)])
        self.assertEqual(len(self.t.on_events(1, [("stored", k)])), 1)


class FakeClient:
    """One rank's tuttid: `have` keys are cached; lookup pins them under a new lease."""

    def __init__(self, have=(), load_blocks=None, fail=False, max_blocks_per_call=None):
        self.have = set(have)
        self.limit = max_blocks_per_call
        self.load_blocks = load_blocks
        self.fail = fail
        self.next_id = 1
        self.live = {}
        self.released = []
        self.lookups = 0
        self.info = {"attached": True, "max_blocks_per_call": max_blocks_per_call}

    def start_lookup(self, keys, prompt_tokens=None):
        """As tutti.Client: the answer comes with result() (the fake answers at once)."""
        outer = self

        class Pending:
            def result(self):
                return outer.lookup(keys, prompt_tokens)
        return Pending()

    def lookup(self, keys, prompt_tokens=None):
        self.lookups += 1
        if isinstance(keys, bytes):  # packed, as the connector sends them
            keys = [keys[i:i + 16] for i in range(0, len(keys), 16)]
        if self.fail:
            raise tutti.Unavailable("fake: away")
        if self.limit is not None and len(keys) > self.limit:
            raise tutti.InvalidArgument("keys: %d in one call, at most %d" % (len(keys),
                                                                               self.limit))
        hits = 0
        while hits < len(keys) and keys[hits] in self.have:
            hits += 1
        lb = hits if self.load_blocks is None else min(self.load_blocks, hits)
        lease = tutti.Lease(self.next_id if hits else 0, hits, 1000, 1, load_blocks=lb)
        if hits:
            self.live[lease.id] = lease
            self.next_id += 1
        return lease

    def release(self, lease):
        self.live.pop(lease.id, None)
        self.released.append(lease.id)

    def detach(self):
        pass


BS = 4
hasher = get_request_block_hasher(BS, sha256_cbor)


def request(rid, ntokens, start=0):
    return Request(rid, list(range(start, start + ntokens)), block_hasher=hasher)


def sched_with(clients, clock=None):
    shakes = {r: TuttiHandshake(r, "sock%d" % r, None, b"g" * 16) for r in range(len(clients))}
    s = TuttiScheduler(BS, len(clients), connect=lambda h: clients[h.tp_rank],
                       watch_events=False, clock=clock or (lambda: 0.0))
    s.set_handshakes(shakes)
    return s


def keys_of(req, n):
    return vkeys.request_keys(req, BS, n)


def output(new=(), cached=(), scheduled=None, preempted=None):
    c = CachedRequestData.make_empty()
    for rid, computed, new_blocks, resumed in cached:
        c.req_ids.append(rid)
        c.new_block_ids.append((new_blocks,) if new_blocks is not None else None)
        c.num_computed_tokens.append(computed)
        if resumed:
            c.resumed_req_ids.add(rid)
    so = SchedulerOutput.make_empty()
    so.scheduled_new_reqs = list(new)
    so.scheduled_cached_reqs = c
    so.num_scheduled_tokens = dict(scheduled or {})
    so.preempted_req_ids = set(preempted or ())
    return so


class SchedulerTest(unittest.TestCase):
    def test_min_over_ranks_and_limit(self):
        r = request("a", 21)  # 5 full blocks; at most (21-1)//4 = 5 to load
        r0 = FakeClient(keys_of(r, 5))
        r1 = FakeClient(keys_of(r, 3))
        s = sched_with([r0, r1])
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (12, False))
        r20 = request("b", 20)  # 5 full blocks, but at most (20-1)//4 = 4
        c = FakeClient(keys_of(r20, 5))
        s2 = sched_with([c])
        self.assertEqual(s2.get_num_new_matched_tokens(r20, 0), (16, False))
        self.assertEqual(s2.get_num_new_matched_tokens(r20, 8), (8, False))  # 2 local hits

    def test_load_blocks_advice_and_local_hits(self):
        r = request("a", 33)
        s = sched_with([FakeClient(keys_of(r, 8), load_blocks=3)])
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (12, False))
        self.assertEqual(s.get_num_new_matched_tokens(r, 12), (0, False))

    def test_repeat_calls_reuse_a_young_lease_else_release_it(self):
        r = request("a", 17)
        now = [0.0]
        c0, c1 = FakeClient(keys_of(r, 4)), FakeClient(keys_of(r, 4))
        s = sched_with([c0, c1], clock=lambda: now[0])
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (16, False))
        # allocation failed: vLLM asks again; the pins hold every hit: no new Lookup
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (16, False))
        self.assertEqual((c0.lookups, c1.lookups), (1, 1))
        self.assertEqual((c0.released, c1.released), ([], []))
        # a different local prefix: the old leases are released, a new Lookup is made
        self.assertEqual(s.get_num_new_matched_tokens(r, 4), (12, False))
        self.assertEqual((c0.lookups, c0.released, c1.released), (2, [1], [1]))
        # past half the lease's TTL (fake: 1000 ms): looked up again, the old one released
        now[0] = 0.6
        self.assertEqual(s.get_num_new_matched_tokens(r, 4), (12, False))
        self.assertEqual((c0.lookups, c0.released, c1.released), (3, [1, 2], [1, 2]))
        self.assertEqual((len(c0.live), len(c1.live)), (1, 1))
        self.assertEqual(s.request_finished(r, []), (False, None))  # no saves: blocks free now
        self.assertEqual((len(c0.live), len(c1.live)), (0, 0))

    def test_any_error_is_a_miss_with_backoff(self):
        r = request("a", 17)
        now = [0.0]
        c0, c1 = FakeClient(keys_of(r, 4)), FakeClient(keys_of(r, 4), fail=True)
        s = sched_with([c0, c1], clock=lambda: now[0])
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (0, False))
        self.assertEqual(c0.live, {})  # rank 0's pin released
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (0, False))
        self.assertEqual(c1.lookups, 1)  # backing off: not asked again
        c1.fail = False
        now[0] = 10.0
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (16, False))

    def test_long_chains_are_looked_up_in_chunks(self):
        r = request("a", 4 * 11 + 1)  # 11 blocks; tuttid takes 4 keys a Lookup
        c = FakeClient(keys_of(r, 10), max_blocks_per_call=4)
        s = sched_with([c])
        self.assertEqual(s.get_num_new_matched_tokens(r, 4), (9 * BS, False))  # 1 local hit
        self.assertEqual(c.lookups, 3)  # blocks 0-3, 4-7, 8-10 (2 of 3 hit)
        self.assertEqual(len(c.live), 3)
        blocks = list(range(20, 32))
        s.update_state_after_alloc(r, KVCacheBlocks((blocks,)), 9 * BS)
        meta = s.build_connector_meta(output(new=[NewRequestData.from_request(r, (blocks,))],
                                             scheduled={"a": 5}))
        self.assertEqual([ld.block_ids for ld in meta.loads],
                         [blocks[1:4], blocks[4:8], blocks[8:10]])
        self.assertEqual([ld.keys for ld in meta.loads],
                         [keys_of(r, 4)[1:], keys_of(r, 8)[4:], keys_of(r, 10)[8:]])
        self.assertEqual([ld.lease_ids for ld in meta.loads], [{0: 1}, {0: 2}, {0: 3}])
        # the next chunk is asked only while the previous one hit in full
        r2 = request("b", 4 * 11 + 1)
        c2 = FakeClient(keys_of(r2, 3), max_blocks_per_call=4)
        self.assertEqual(sched_with([c2]).get_num_new_matched_tokens(r2, 0), (3 * BS, False))
        self.assertEqual(c2.lookups, 1)

    def test_a_refused_lookup_is_a_miss_without_backoff(self):
        r = request("a", 4 * 9 + 1)
        c = FakeClient(keys_of(r, 9), max_blocks_per_call=4)
        s = sched_with([c])
        s._links[0].max_blocks_per_call = lambda: 100  # as if the limit were not known
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (0, False))  # INVALID_ARGUMENT
        r2 = request("b", 4 * 3 + 1)
        c.have.update(keys_of(r2, 3))
        self.assertEqual(s.get_num_new_matched_tokens(r2, 0), (3 * BS, False))  # no back-off

    def test_a_request_that_cannot_be_keyed_neither_loads_nor_saves(self):
        class Odd:
            pass
        r = Request("a", list(range(9)), cache_salt=Odd())
        s = sched_with([FakeClient()])
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (0, False))
        s.update_state_after_alloc(r, KVCacheBlocks(([1, 2, 3],)), 0)
        meta = s.build_connector_meta(output(new=[NewRequestData.from_request(r, ([1, 2, 3],))],
                                             scheduled={"a": 9}))
        self.assertEqual((meta.loads, meta.saves), ([], []))
        self.assertEqual(s.request_finished(r, [1, 2, 3]), (False, None))

    def test_no_handshake_no_lookup(self):
        s = TuttiScheduler(BS, 1, connect=lambda h: None, watch_events=False)
        self.assertEqual(s.get_num_new_matched_tokens(request("a", 17), 0), (0, False))

    def test_load_then_chunked_prefill_saves(self):
        r = request("a", 26)  # 6 full blocks, 2 cached on both ranks, 1 local hit
        c0, c1 = FakeClient(keys_of(r, 2)), FakeClient(keys_of(r, 3))
        s = sched_with([c0, c1])
        self.assertEqual(s.get_num_new_matched_tokens(r, 4), (4, False))
        blocks = [10, 11, 12, 13, 14, 15, 16]
        s.update_state_after_alloc(r, KVCacheBlocks((blocks,)), 4)
        r.num_computed_tokens = 8
        nr = NewRequestData.from_request(r, (blocks,))
        meta = s.build_connector_meta(output(new=[nr], scheduled={"a": 10}))
        self.assertEqual(len(meta.loads), 1)
        ld = meta.loads[0]
        self.assertEqual((ld.keys, ld.block_ids), (keys_of(r, 2)[1:], [11]))
        self.assertEqual(ld.lease_ids, {0: 1, 1: 1})
        self.assertEqual(len(meta.saves), 1)  # computed to 18: blocks 2, 3
        self.assertEqual((meta.saves[0].keys, meta.saves[0].block_ids),
                         (keys_of(r, 4)[2:], [12, 13]))
        # next chunk: 18 -> 26, blocks 4, 5 (the last 2 tokens are no full block)
        meta = s.build_connector_meta(output(cached=[("a", 18, None, False)],
                                             scheduled={"a": 8}))
        self.assertEqual(meta.loads, [])
        self.assertEqual(meta.saves[0].block_ids, [14, 15])
        meta = s.build_connector_meta(output(cached=[("a", 26, None, False)],
                                             scheduled={"a": 1}))
        self.assertEqual(meta.saves, [])
        # decode fills block 6: tokens 26, 27 generated
        r.append_output_token_ids([100, 101])
        meta = s.build_connector_meta(output(cached=[("a", 27, [17], False)],
                                             scheduled={"a": 1}))
        self.assertEqual((meta.saves[0].keys, meta.saves[0].block_ids),
                         (keys_of(r, 7)[6:], [16]))
        # it had saves: vLLM keeps its blocks until the workers report it finished_sending
        self.assertEqual(s.request_finished(r, [10, 11, 12, 13, 14, 15, 16, 17]), (True, None))

    def test_no_load_releases_leases(self):
        r = request("a", 17)
        c = FakeClient(keys_of(r, 4))
        s = sched_with([c])
        s.get_num_new_matched_tokens(r, 0)
        s.update_state_after_alloc(r, KVCacheBlocks(([1, 2, 3, 4, 5],)), 0)
        self.assertEqual(c.live, {})
        meta = s.build_connector_meta(output(new=[NewRequestData.from_request(r, ([1, 2, 3, 4,
                                                                                    5],))],
                                             scheduled={"a": 17}))
        self.assertEqual(meta.loads, [])
        self.assertEqual(meta.saves[0].block_ids, [1, 2, 3, 4])

    def test_preemption(self):
        r = request("a", 16)
        c = FakeClient()
        s = sched_with([c])
        s.get_num_new_matched_tokens(r, 0)
        s.update_state_after_alloc(r, KVCacheBlocks(([1, 2, 3, 4],)), 0)
        nr = NewRequestData.from_request(r, ([1, 2, 3, 4],))
        meta = s.build_connector_meta(output(new=[nr], scheduled={"a": 8}))
        self.assertEqual(meta.saves[0].block_ids, [1, 2])
        meta = s.build_connector_meta(output(preempted=["a"]))
        self.assertEqual(meta.saves, [])
        self.assertEqual(meta.preempted, ["a"])  # the workers drop its pending saves
        # resumed: tuttid has blocks 0, 1 now; vLLM reallocates other blocks
        c.have.update(keys_of(r, 2))
        r.num_computed_tokens = 0
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (8, False))
        s.update_state_after_alloc(r, KVCacheBlocks(([7, 8, 9, 6],)), 8)
        meta = s.build_connector_meta(output(cached=[("a", 8, [7, 8, 9, 6], True)],
                                             scheduled={"a": 8}))
        self.assertEqual(meta.loads[0].block_ids, [7, 8])
        self.assertEqual(meta.saves[0].block_ids, [9, 6])  # blocks 2, 3: never saved before

    def test_events_remembered_from_saves(self):
        r = request("a", 8)
        s = sched_with([FakeClient()])
        s.get_num_new_matched_tokens(r, 0)
        s.update_state_after_alloc(r, KVCacheBlocks(([1, 2],)), 0)
        s.build_connector_meta(output(new=[NewRequestData.from_request(r, ([1, 2],))],
                                      scheduled={"a": 8}))
        t = s.translator
        t.on_stream_start(0, 1, 1, 0, False)
        out = t.on_events(0, [("stored", keys_of(r, 2)[1])])
        # vLLM's hash as vLLM's GPU-tier events carry it: by default the low 64 bits as an int
        as_int = [int.from_bytes(h, "big") & (1 << 64) - 1 for h in r.block_hashes]
        self.assertEqual(out[0].block_hashes, [as_int[1]])
        self.assertEqual(out[0].parent_block_hash, as_int[0])
        self.assertEqual(out[0].token_ids, [4, 5, 6, 7])
        self.assertEqual(out[0].extra_keys, [None])

    def test_event_hashes_as_bytes_when_vllm_sends_bytes(self):
        os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "0"
        try:
            r = request("a", 9)
            r.cache_salt = "s"
            r.block_hashes.clear()
            r.block_hashes.extend(hasher(r))
            s = sched_with([FakeClient()])
            s.get_num_new_matched_tokens(r, 0)
            s.update_state_after_alloc(r, KVCacheBlocks(([1, 2, 3],)), 0)
            s.build_connector_meta(output(new=[NewRequestData.from_request(r, ([1, 2, 3],))],
                                          scheduled={"a": 9}))
            s.translator.on_stream_start(0, 1, 1, 0, False)
            out = s.translator.on_events(0, [("stored", k) for k in keys_of(r, 2)])
        finally:
            del os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"]
        self.assertEqual([e.block_hashes for e in out], [[h] for h in r.block_hashes[:2]])
        self.assertEqual([e.extra_keys for e in out], [[("s",)], [None]])  # salt: block 0


def capped(rid, ntokens, **params):
    r = request(rid, ntokens)
    r.kv_transfer_params = dict(params)
    return r


def new_step(r, blocks, computed, scheduled):
    """The step that first schedules r: `computed` tokens (GPU prefix + loaded), `scheduled`
    more."""
    r.num_computed_tokens = computed
    return output(new=[NewRequestData.from_request(r, (blocks,))],
                  scheduled={r.request_id: scheduled})


class CapsTest(unittest.TestCase):
    """kv_transfer_params max_load_tokens / max_offload_tokens (a router's per-request caps)."""

    def test_max_load_tokens_zero_looks_nothing_up_and_loads_nothing(self):
        r = capped("a", 33, max_load_tokens=0)  # 8 blocks, all in tuttid
        c = FakeClient(keys_of(r, 8))
        s = sched_with([c])
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (0, False))
        self.assertEqual((c.lookups, c.live), (0, {}))
        blocks = list(range(1, 10))
        s.update_state_after_alloc(r, KVCacheBlocks((blocks,)), 0)
        meta = s.build_connector_meta(new_step(r, blocks, 0, 33))
        self.assertEqual(meta.loads, [])
        self.assertEqual(len(meta.saves[0].keys), 8, "computed, so saved (only loads are capped)")

    def test_max_load_tokens_caps_the_load_in_whole_blocks(self):
        r = capped("a", 33, max_load_tokens=3 * BS + 2)  # 3.5 blocks: 3
        c = FakeClient(keys_of(r, 8))
        s = sched_with([c])
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (3 * BS, False))
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (3 * BS, False))  # repeated
        self.assertEqual(c.lookups, 1)
        blocks = list(range(1, 10))
        s.update_state_after_alloc(r, KVCacheBlocks((blocks,)), 3 * BS)
        meta = s.build_connector_meta(new_step(r, blocks, 3 * BS, 33 - 3 * BS))
        self.assertEqual([(ld.keys, ld.block_ids) for ld in meta.loads],
                         [(keys_of(r, 3), [1, 2, 3])])
        self.assertEqual(meta.saves[0].block_ids, [4, 5, 6, 7, 8])  # the rest, computed
        # beyond the GPU prefix: 2 local blocks + at most 9 tokens = 2 more blocks
        r2 = capped("b", 33, max_load_tokens=9)
        c2 = FakeClient(keys_of(r2, 8))
        s2 = sched_with([c2])
        self.assertEqual(s2.get_num_new_matched_tokens(r2, 2 * BS), (2 * BS, False))
        s2.update_state_after_alloc(r2, KVCacheBlocks((blocks,)), 2 * BS)
        meta = s2.build_connector_meta(new_step(r2, blocks, 4 * BS, 33 - 4 * BS))
        self.assertEqual([(ld.keys, ld.block_ids) for ld in meta.loads],
                         [(keys_of(r2, 4)[2:], [3, 4])])
        # less than a block past the GPU prefix: nothing, no Lookup
        r3 = capped("c", 33, max_load_tokens=BS - 1)
        c3 = FakeClient(keys_of(r3, 8))
        self.assertEqual(sched_with([c3]).get_num_new_matched_tokens(r3, 2 * BS), (0, False))
        self.assertEqual(c3.lookups, 0)
        # a cap past the hits changes nothing
        r4 = capped("d", 33, max_load_tokens=1000)
        self.assertEqual(sched_with([FakeClient(keys_of(r4, 5))]).get_num_new_matched_tokens(
            r4, 0), (5 * BS, False))

    def test_the_smaller_of_advice_and_cap_wins(self):
        for cap, want in ((5 * BS, 3), (2 * BS, 2), (3 * BS, 3)):
            with self.subTest(cap=cap):
                r = capped("a", 33, max_load_tokens=cap)
                s = sched_with([FakeClient(keys_of(r, 8), load_blocks=3)])
                self.assertEqual(s.get_num_new_matched_tokens(r, 0), (want * BS, False))
                # and the minimum over ranks still applies
                r = capped("b", 33, max_load_tokens=cap)
                s = sched_with([FakeClient(keys_of(r, 8)), FakeClient(keys_of(r, 8),
                                                                      load_blocks=3)])
                self.assertEqual(s.get_num_new_matched_tokens(r, 0), (want * BS, False))

    def test_a_capped_chunked_lookup_asks_and_holds_nothing_past_the_cap(self):
        r = capped("a", 4 * 11 + 1, max_load_tokens=5 * BS)  # 11 blocks; 4 keys a Lookup
        c = FakeClient(keys_of(r, 11), max_blocks_per_call=4)
        s = sched_with([c])
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (5 * BS, False))
        self.assertEqual(c.lookups, 2, "blocks 0-3 and 4-7; 8-10 are past the cap")
        blocks = list(range(20, 32))
        s.update_state_after_alloc(r, KVCacheBlocks((blocks,)), 5 * BS)
        meta = s.build_connector_meta(new_step(r, blocks, 5 * BS, 45 - 5 * BS))
        self.assertEqual([ld.block_ids for ld in meta.loads], [blocks[0:4], blocks[4:5]])
        self.assertEqual(sum(len(ld.keys) for ld in meta.loads), 5)
        # the cut chunk's lease (pins of blocks 5-7 too) ends with the worker's Retrieve
        self.assertEqual(sorted(c.live), [1, 2])
        # not loaded after all (vLLM allocated nothing): every pin released
        r2 = capped("b", 4 * 11 + 1, max_load_tokens=6 * BS)
        c2 = FakeClient(keys_of(r2, 11), max_blocks_per_call=4)
        s2 = sched_with([c2])
        self.assertEqual(s2.get_num_new_matched_tokens(r2, 0), (6 * BS, False))
        self.assertEqual(len(c2.live), 2)
        self.assertEqual(s2.request_finished(r2, []), (False, None))
        self.assertEqual(c2.live, {})

    def test_max_offload_tokens_saves_only_whole_blocks_inside_the_first_n(self):
        r = capped("a", 26, max_offload_tokens=11)  # blocks 0, 1 (tokens 0-7); 2 ends at 12
        s = sched_with([FakeClient()])
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (0, False))
        blocks = [10, 11, 12, 13, 14, 15, 16]
        s.update_state_after_alloc(r, KVCacheBlocks((blocks,)), 0)
        meta = s.build_connector_meta(new_step(r, blocks, 0, 6))  # chunked prefill: block 0
        self.assertEqual(meta.saves[0].block_ids, [10])
        meta = s.build_connector_meta(output(cached=[("a", 6, None, False)],
                                             scheduled={"a": 20}))
        self.assertEqual((meta.saves[0].keys, meta.saves[0].block_ids),
                         (keys_of(r, 2)[1:], [11]))
        r.append_output_token_ids([100, 101])  # decode fills block 6: not saved either
        meta = s.build_connector_meta(output(cached=[("a", 27, [17], False)],
                                             scheduled={"a": 1}))
        self.assertEqual(meta.saves, [])
        self.assertEqual(s.request_finished(r, blocks), (True, None))
        # 0: nothing saved, so vLLM frees the blocks at once
        r0 = capped("b", 26, max_offload_tokens=0)
        s.get_num_new_matched_tokens(r0, 0)
        s.update_state_after_alloc(r0, KVCacheBlocks((blocks,)), 0)
        meta = s.build_connector_meta(new_step(r0, blocks, 0, 26))
        self.assertEqual(meta.saves, [])
        self.assertEqual(s.request_finished(r0, blocks), (False, None))

    def test_both_caps_together(self):
        r = capped("a", 33, max_load_tokens=2 * BS, max_offload_tokens=6 * BS)
        s = sched_with([FakeClient(keys_of(r, 4))])
        self.assertEqual(s.get_num_new_matched_tokens(r, 0), (2 * BS, False))
        blocks = list(range(1, 10))
        s.update_state_after_alloc(r, KVCacheBlocks((blocks,)), 2 * BS)
        meta = s.build_connector_meta(new_step(r, blocks, 2 * BS, 33 - 2 * BS))
        self.assertEqual([ld.block_ids for ld in meta.loads], [[1, 2]])
        self.assertEqual(meta.saves[0].block_ids, [3, 4, 5, 6])  # blocks 2-5

    def test_bad_values_are_ignored_with_a_warning(self):
        for bad in (-1, 2.5, 16.0, True, False, "16", [16]):
            with self.subTest(bad=bad):
                r = capped("req-%r" % (bad,), 17, max_load_tokens=bad, max_offload_tokens=bad)
                s = sched_with([FakeClient(keys_of(r, 4))])
                with self.assertLogs("tutti.vllm", "WARNING") as cm:
                    self.assertEqual(s.get_num_new_matched_tokens(r, 0), (4 * BS, False))
                self.assertEqual(len(cm.output), 2, cm.output)  # one per key
                for line, name in zip(cm.output, ("max_load_tokens", "max_offload_tokens")):
                    self.assertIn(r.request_id, line)
                    self.assertIn("%s = %r" % (name, bad), line)
        # a bad cap is ignored, the good one still applies; warned once per request
        r = capped("mixed", 17, max_load_tokens=-5, max_offload_tokens=BS)
        s = sched_with([FakeClient()])
        with self.assertLogs("tutti.vllm", "WARNING") as cm:
            s.get_num_new_matched_tokens(r, 0)
            s.get_num_new_matched_tokens(r, 0)
            s.update_state_after_alloc(r, KVCacheBlocks(([1, 2, 3, 4, 5],)), 0)
            meta = s.build_connector_meta(new_step(r, [1, 2, 3, 4, 5], 0, 17))
        self.assertEqual(len(cm.output), 1, cm.output)
        self.assertEqual(meta.saves[0].block_ids, [1])

    def test_no_params_none_values_or_other_params_mean_no_caps(self):
        for params in (None, {}, {"max_load_tokens": None, "max_offload_tokens": None},
                       {"do_remote_prefill": True}, "not a dict"):
            with self.subTest(params=params):
                r = request("a", 17)
                r.kv_transfer_params = params
                s = sched_with([FakeClient(keys_of(r, 4))])
                with self.assertNoLogs("tutti.vllm", "WARNING"):
                    self.assertEqual(s.get_num_new_matched_tokens(r, 0), (4 * BS, False))


class LoadsTest(unittest.TestCase):
    """tutti.vllm.loads: a step's LoadSpecs in Retrieves within tuttid's bounds."""

    class Part:
        def __init__(self, keys, blocks, leases, broken=False):
            self.keys, self.blocks, self.leases, self.broken = keys, blocks, leases, broken
            self.waited = []

        def wait_layer(self, layer, stream=None):
            self.waited.append(layer)
            if self.broken:
                raise tutti.TuttiError("broke", "ABORTED")

        def wait(self, timeout=None):
            from tutti.client import RetrieveOutcome
            if self.broken:
                return RetrieveOutcome("UNAVAILABLE", "gone", list(range(len(self.keys))))
            return RetrieveOutcome(failed=[0])

    class Client:
        def __init__(self, broken=()):
            self.parts, self.broken = [], set(broken)

        def retrieve(self, lease, keys, blocks, more_leases=()):
            p = LoadsTest.Part(keys, blocks, list(more_leases), len(self.parts) in self.broken)
            self.parts.append(p)
            return p

    def specs(self):
        from tutti.vllm.metadata import LoadSpec
        return [LoadSpec("a", [b"a%d" % i for i in range(4)], [1, 2, 3, 4], {0: 7}),
                LoadSpec("a", [b"b"], [5], {0: 8}),
                LoadSpec("b", [b"c"] * 2, [6, 9], {1: 9}),      # no lease on rank 0
                LoadSpec("c", [b"d"] * 6, list(range(10, 16)), {0: 10}),  # past one Retrieve
                LoadSpec("d", [b"e"] * 3, [20, 21, 22], {0: 11})]

    def test_batches_within_the_bounds(self):
        from tutti.vllm import loads
        c = self.Client()
        rs, loading, refused = loads.start(c, self.specs(), 0, 5)
        self.assertEqual([(p.blocks, p.leases) for p in c.parts],
                         [([1, 2, 3, 4, 5], [7, 8]), ([20, 21, 22], [11])])
        self.assertEqual(loading, [1, 2, 3, 4, 5, 20, 21, 22])
        self.assertEqual(refused, {6, 9} | set(range(10, 16)))
        self.assertEqual(rs.wait().failed, [0, 5])  # each part's index 0, over the step
        self.assertIsNone(loads.start(c, [], 0, 5)[0])

    def test_a_broken_part_does_not_skip_the_others_waits(self):
        from tutti.vllm import loads
        c = self.Client(broken={0})
        rs, loading, _ = loads.start(c, self.specs(), 0, 5)
        with self.assertRaises(tutti.TuttiError):
            rs.wait_layer(2)
        self.assertEqual([p.waited for p in c.parts], [[2], [2]])
        out = rs.wait()
        self.assertEqual((out.code, out.failed), ("UNAVAILABLE", [0, 1, 2, 3, 4, 5]))


if __name__ == "__main__":
    unittest.main()

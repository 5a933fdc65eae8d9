"""tutti.vllm's keys, derived the fast way (tutti._keychain in C, vLLM asked for every block's
extra keys only where a request has a position-dependent source), are bit for bit the keys of
the reference derivation: the formula of keys.py's docstring written out here with hashlib and
struct, and vLLM's extra keys asked block by block (key scheme v2). Random token ids (the whole
uint32 range), block sizes, extra keys (cache_salt, LoRA, multimodal features), requests keyed in steps; the C
chain with the SHA extensions and in portable C; the Python fallback; keys pinned from before
v2; blocks read in place from the request's list (a vLLM ConstantList too); the same keys in
fresh interpreters whatever PYTHONHASHSEED says. And the
first call's Lookups: every rank's from one Client.lookup_many call, or (a client without it)
the last rank's on the scheduler's thread (Client.lookup_inline); the same misses on errors. Needs tests/vllm/stub first on sys.path (the
BUILD does it)."""

import collections.abc
import hashlib
import os
import random
import struct
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.environ.get("TEST_SRCDIR", ""), "tutti/tests/vllm/stub")
                if os.environ.get("TEST_SRCDIR") else
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../tests/vllm/stub"))

from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

import tutti  # noqa: E402
from tutti.vllm import keys as vkeys  # noqa: E402
from tutti.vllm.metadata import TuttiHandshake  # noqa: E402
from tutti.vllm.scheduler import TuttiScheduler  # noqa: E402


def reference(request, block_size):
    """(keys, vLLM's extra keys) of every full block of `request`, straight from the formula
    (keys.py's docstring, scheme v2: the block's tokens as uint32 LE, the previous digest, the
    encoded extra keys)."""
    last = hashlib.sha256(b"tutti.vllm block keys v2").digest()
    tokens = list(request.all_token_ids)
    out, extras, mm_idx = [], [], 0
    for i in range(len(tokens) // block_size):
        start = i * block_size
        extra, mm_idx = generate_block_hash_extra_keys(request, start, start + block_size, mm_idx)
        block = tokens[start:start + block_size]
        last = hashlib.sha256(struct.pack("<%dI" % block_size, *block) + last +
                              vkeys.encode_extra_keys(extra)).digest()
        out.append(last[:16])
        extras.append(extra)
    return out, extras


def reference_keys(request, block_size):
    return reference(request, block_size)[0]


class Lora:
    def __init__(self, name):
        self.lora_name, self.lora_int_id = name, 7


class Pos:
    def __init__(self, offset, length):
        self.offset, self.length = offset, length


class Mm:
    def __init__(self, identifier, offset, length):
        self.identifier, self.mm_position = identifier, Pos(offset, length)


def random_request(rng, rid):
    bs = rng.choice([1, 2, 3, 15, 16, 16, 17, 32, 64, 100])
    blocks = rng.randrange(0, 48)
    ntok = blocks * bs + rng.randrange(bs)
    pick = rng.random()
    if pick < 0.3:
        tokens = [rng.randrange(1 << 32) for _ in range(ntok)]
    elif pick < 0.4:
        tokens = [rng.choice([0, 1, (1 << 32) - 1, (1 << 31), 255, 256]) for _ in range(ntok)]
    else:
        tokens = [rng.randrange(200000) for _ in range(ntok)]
    kw = {}
    if rng.random() < 0.25:
        kw["cache_salt"] = rng.choice(["salt", "sälz", "", "x" * 300])
    if rng.random() < 0.2:
        kw["lora_request"] = Lora(rng.choice(["adapter-a", "b"]))
    if rng.random() < 0.25 and ntok:
        mms = [Mm("img-%d-%d" % (rid, j), rng.randrange(ntok), rng.randrange(1, 3 * bs + 2))
               for j in range(rng.randrange(1, 4))]
        kw["mm_features"] = sorted(mms, key=lambda m: m.mm_position.offset)
    return Request("r%d" % rid, tokens, **kw), bs


# Keys of fixed requests, pinned when scheme v2 came in (from the reference formula above): the
# number of keys, the first key, SHA-256 of all keys concatenated. A change here changes every
# key a tuttid holds: a new scheme name, never an edit of these.
PINNED_TOKENS = [(i * 7919) % 32000 for i in range(64 * 16 + 5)]
PINNED = [
    ({}, "ef898bb50da2ba978759ea991c0e2001",
     "fc7d548be059216b59c1c7b07dc4d71eb897cc10e318d8693927cc12294b4943"),
    ({"cache_salt": "salt"}, "65c5ff8d66ea75b8c861254302ef8811",
     "53c4ad7b81c806609fd8f1abde885f251c015c2c07c56e497c5067d67649b6ec"),
    ({"lora_request": Lora("adapter-a")}, "243193003cc332a30475e2595987df3c",
     "1690c84e7f17c4f312643a3d6a4fafbe6b46dc7ee9a06c28193d02a36362b657"),
    ({"mm_features": [Mm("img-hash-1", 20, 30)]}, "ef898bb50da2ba978759ea991c0e2001",
     "1d53cd9b729904430ddc0e8d237c655f605d06e5b07e9441d92b96422db05340"),
]


class KeyEqualityTest(unittest.TestCase):
    def test_the_c_chain_is_built_and_loads(self):
        """The build ships tutti._keychain: the equality tests below test the C chain."""
        self.assertIsNotNone(vkeys._native, "tutti._keychain did not load")
        self.assertIn(vkeys._native.implementation(), ("sha-ni", "portable"))

    def test_sha256_matches_hashlib_every_length(self):
        native = vkeys._native
        rng = random.Random(5)
        try:
            for portable in (False, True):
                native.use_portable(portable)
                for n in list(range(0, 300)) + [1000, 4096, 4097, 65536 + 3]:
                    data = bytes(rng.randrange(256) for _ in range(n))
                    self.assertEqual(native.sha256(data), hashlib.sha256(data).digest(),
                                     (portable, n))
        finally:
            native.use_portable(False)

    def check_random_requests(self, seed, count):
        rng = random.Random(seed)
        for rid in range(count):
            req, bs = random_request(rng, rid)
            want, extras = reference(req, bs)
            self.assertEqual(vkeys.request_keys(req, bs, 1 << 20), want, (seed, rid, bs))
            # keyed in steps, as the scheduler derives (lookups, then saves as blocks fill)
            chain = vkeys.KeyChain(bs)
            n = 0
            while n < len(want):
                n = min(len(want), n + rng.randrange(1, 9))
                self.assertEqual(chain.derive(req, n), n)
            self.assertEqual(chain.keys(0, len(want)), want, (seed, rid, bs))
            self.assertEqual(chain.packed(0, len(want)), b"".join(want))
            # vLLM's extra keys of each block (the events carry them)
            self.assertEqual([chain.extra_keys(i) for i in range(len(want))], extras)

    def test_random_requests_sha_extensions(self):
        self.check_random_requests(1, 400)

    def test_random_requests_portable_c(self):
        vkeys._native.use_portable(True)
        try:
            self.check_random_requests(2, 200)
        finally:
            vkeys._native.use_portable(False)

    def test_random_requests_python_fallback(self):
        with mock.patch.object(vkeys, "_native", None):
            self.check_random_requests(3, 200)

    def test_tokens_appended_after_keys(self):
        """A request that grows (decode, preemption) keeps its keys and extends them."""
        rng = random.Random(4)
        tokens = [rng.randrange(1 << 32) for _ in range(40 * 16)]
        req = Request("g", tokens[:5 * 16 + 3], cache_salt="s")
        chain = vkeys.KeyChain(16)
        self.assertEqual(chain.derive(req, 100), 5)
        req.append_output_token_ids(tokens[5 * 16 + 3:])
        self.assertEqual(chain.derive(req, 100), 40)
        self.assertEqual(chain.keys(0, 40), reference_keys(Request("h", tokens, cache_salt="s"),
                                                           16))

    def test_pinned_keys(self):
        for kw, first, digest in PINNED:
            keys = vkeys.request_keys(Request("p", PINNED_TOKENS, **kw), 16, 1000)
            self.assertEqual(len(keys), 64)
            self.assertEqual(keys[0].hex(), first, kw)
            self.assertEqual(hashlib.sha256(b"".join(keys)).hexdigest(), digest, kw)

    def test_the_same_keys_in_fresh_interpreters_whatever_pythonhashseed(self):
        """Fresh interpreters with PYTHONHASHSEED unset, "random", 0 and 1 (vLLM's own hashes
        differ between them: init_none_hash), through the C chain and the Python fallback:
        every one derives the pinned keys."""
        import subprocess
        code = ("import hashlib, sys\n"
                "from vllm.v1.request import Request\n"
                "from tutti.vllm import keys\n"
                "if sys.argv[1] == 'py':\n"
                "    keys._native = None\n"
                "tokens = [(i * 7919) % 32000 for i in range(64 * 16 + 5)]\n"
                "k = keys.request_keys(Request('p', tokens, cache_salt='salt'), 16, 1000)\n"
                "print(len(k), k[0].hex(), hashlib.sha256(b''.join(k)).hexdigest(),\n"
                "      keys._native is not None)\n")
        _, first, digest = PINNED[1]
        for seed in (None, "random", "0", "1"):
            for chain in ("c", "py"):
                env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
                env.pop("PYTHONHASHSEED", None)
                if seed is not None:
                    env["PYTHONHASHSEED"] = seed
                out = subprocess.run([sys.executable, "-c", code, chain], env=env, check=True,
                                     capture_output=True, text=True).stdout.split()
                self.assertEqual(out, ["64", first, digest, str(chain == "c")], (seed, chain))

    def test_extra_keys_vllm_gives_without_a_known_source(self):
        """A vLLM whose extra keys come from a source _uniform_extras does not know (on every
        block, or only on the first): the keys are still vLLM's block by block."""
        tokens = list(range(6 * 16))
        for first_only in (False, True):
            def extra(request, start, end, mm_idx, first_only=first_only):
                return (None if first_only and start else ("new-source",)), mm_idx
            with mock.patch.object(vkeys, "generate_block_hash_extra_keys", extra):
                keys = vkeys.request_keys(Request("n", tokens), 16, 6)
                chain = vkeys.KeyChain(16)
                chain.derive(Request("n", tokens), 6)
                self.assertEqual(chain.extra_keys(0), ("new-source",))
            self.assertNotEqual(keys, vkeys.request_keys(Request("p", tokens), 16, 6))
            last, want = hashlib.sha256(b"tutti.vllm block keys v2").digest(), []
            for i in range(6):
                e = None if first_only and i else ("new-source",)
                last = hashlib.sha256(struct.pack("<16I", *tokens[i * 16:(i + 1) * 16]) + last
                                      + vkeys.encode_extra_keys(e)).digest()
                want.append(last[:16])
            self.assertEqual(keys, want)

    def test_vllm_asked_three_times_without_position_dependent_sources(self):
        """A request without multimodal features or prompt embeddings (LoRA and cache_salt
        included): vLLM is asked for blocks 0, 1 and the last, not for each; with them, for
        each block."""
        tokens = list(range(100 * 16))
        for kw, want in (({}, [0, 16, 99 * 16]),
                         ({"cache_salt": "s", "lora_request": Lora("a")}, [0, 16, 99 * 16]),
                         ({"mm_features": [Mm("i", 3, 4)]}, [16 * i for i in range(100)])):
            calls = []

            def extra(request, start, end, mm_idx):
                calls.append(start)
                return generate_block_hash_extra_keys(request, start, end, mm_idx)
            req = Request("c", tokens, **kw)
            with mock.patch.object(vkeys, "generate_block_hash_extra_keys", extra):
                keys = vkeys.request_keys(req, 16, 100)
            self.assertEqual(calls, want, kw)
            self.assertEqual(keys, reference_keys(req, 16))

    def test_a_request_of_another_vllm_is_asked_per_block(self):
        """No mm_features attribute (an older vLLM): vLLM is asked for every block."""
        req = Request("o", list(range(4 * 16)))
        del req.mm_features
        calls = []

        def extra(request, start, end, mm_idx):
            calls.append(start)
            return None, mm_idx
        with mock.patch.object(vkeys, "generate_block_hash_extra_keys", extra):
            vkeys.request_keys(req, 16, 4)
        self.assertEqual(calls, [0, 16, 32, 48])

    def test_blocks_read_in_place(self):
        """derive(..., first, nblocks) reads tokens[first:first + nblocks * bs] of the whole
        list (KeyChain's form: no slice) and gives the keys of that slice; a request whose
        all_token_ids is a vLLM ConstantList (a Sequence over a list in _x) keys the same."""
        rng = random.Random(5)
        tokens = [rng.randrange(1 << 32) for _ in range(16 * 9 + 5)]
        for first_block, n in ((0, 9), (3, 6), (8, 1), (9, 0)):
            root = hashlib.sha256(b"r%d" % first_block).digest()
            first = 16 * first_block
            self.assertEqual(
                vkeys._native.derive(root, tokens, 16, None, first, n),
                vkeys._native.derive(root, tokens[first:first + 16 * n], 16, None, first))
            extras = [bytes([i % 3]) + b"x" * (i % 4) for i in range(n)]  # any bytes
            self.assertEqual(
                vkeys._native.derive(root, tokens, 16, extras, first, n),
                vkeys._native.derive(root, tokens[first:first + 16 * n], 16, extras, first))

        class ConstantList(collections.abc.Sequence):  # vLLM's: a Sequence over a list in _x
            def __init__(self, x):
                self._x = x

            def __getitem__(self, i):
                return self._x[i]

            def __len__(self):
                return len(self._x)
        req = Request("c", tokens)
        want = reference_keys(req, 16)
        req._all_token_ids = ConstantList(list(tokens))  # the stub's all_token_ids returns it
        for native in (vkeys._native, None):
            with mock.patch.object(vkeys, "_native", native):
                chain = vkeys.KeyChain(16)
                self.assertEqual(chain.derive(req, 4), 4)
                self.assertEqual(chain.derive(req, 9), 9)
                self.assertEqual(chain.keys(0, 9), want)

    def test_bad_tokens_are_value_errors(self):
        for native in (vkeys._native, None):
            with mock.patch.object(vkeys, "_native", native):
                for bad in ((1 << 32), -1, -(1 << 63) - 1, (1 << 64), "7", 1.5, None):
                    req = Request("b", [1] * 16 + [3, bad] + [2] * 15)
                    chain = vkeys.KeyChain(16)
                    self.assertEqual(chain.derive(req, 1), 1)  # block 0 is fine
                    with self.assertRaisesRegex(ValueError,
                                                r"token 17 is not an integer in \[0, 2\^32\)"):
                        chain.derive(req, 2)
                    self.assertEqual(len(chain), 1)  # nothing of the failed derive was kept
        for args, err in (((b"x" * 31, [], 16, None), ValueError),
                          ((b"x" * 32, [1] * 17, 16, None), ValueError),
                          ((b"x" * 32, [1] * 32, 16, None, 17, 1), ValueError),  # past the end
                          ((b"x" * 32, [1] * 32, 16, None, -1, 1), ValueError),
                          ((b"x" * 32, [1] * 32, 16, None, 0, 3), ValueError),
                          ((b"x" * 32, [1] * 32, 0, None, 0, 1), ValueError),
                          ((b"x" * 32, [1] * 16, 16, [b"\x00", b"\x00"]), ValueError),
                          ((b"x" * 32, [1] * 16, 16, ["str"]), TypeError),
                          ((b"x" * 32, iter([1] * 16), 16, None), TypeError)):
            with self.assertRaises(err):
                vkeys._native.derive(*args)

    def test_scheduler_skips_a_request_with_a_bad_token(self):
        """The scheduler logs it and neither loads nor saves it; no exception reaches vLLM."""
        sched = TuttiScheduler(16, 1, connect=lambda h: None, watch_events=False)
        req = Request("b", [1] * 16 + ["x"] * 16 + [2])
        self.assertEqual(sched._derive(req, 2), 0)
        self.assertIn("b", sched._unkeyable)


class RankClient:
    """One rank's tuttid holding every key: start_lookup (in flight) and lookup_inline (on the
    caller's thread), as tutti.Client; `fail` makes both raise it."""

    def __init__(self, fail=None):
        self.fail, self.calls, self.live, self.next_id = fail, [], {}, 1
        self.info = {"attached": True, "max_blocks_per_call": None}

    def _answer(self, keys):
        if self.fail is not None:
            raise self.fail
        hits = len(keys) // 16
        lease = tutti.Lease(self.next_id, hits, 1000, 1, load_blocks=hits)
        self.live[lease.id] = lease
        self.next_id += 1
        return lease

    def start_lookup(self, keys, prompt_tokens=None):
        self.calls.append("start_lookup")
        lease = self._answer(keys)

        class Pending:
            def result(self):
                return lease
        return Pending()

    def lookup_inline(self, keys, prompt_tokens=None):
        self.calls.append("lookup_inline")
        return self._answer(keys)

    def release(self, lease):
        self.live.pop(lease.id, None)

    def detach(self):
        pass


class ManyClient(RankClient):
    """A rank client with lookup_many and release_many, as tutti.Client: every rank's Lookup
    (Release) from one call."""
    batches = []
    release_batches = []

    @staticmethod
    def release_many(releases):
        ManyClient.release_batches.append(len(releases))
        for client, lease in releases:
            client.release(lease)
        return [None] * len(releases)

    @staticmethod
    def lookup_many(lookups):
        ManyClient.batches.append(len(lookups))
        out = []
        for client, keys, prompt_tokens in lookups:
            client.calls.append("lookup_many")
            try:
                out.append(client._answer(keys))
            except Exception as e:  # as tutti.Client: the error in the rank's place
                out.append(e)
        return out


class SchedulerLookupTest(unittest.TestCase):
    """The first call's Lookups: every rank but the last in flight (start_lookup), the last on
    the scheduler's thread (lookup_inline); errors of either kind are the same misses."""

    def sched(self, clients):
        s = TuttiScheduler(16, len(clients), connect=lambda h: clients[h.tp_rank],
                           watch_events=False, clock=lambda: 0.0)
        s.set_handshakes({r: TuttiHandshake(r, "sock%d" % r, None, b"g" * 16)
                          for r in range(len(clients))})
        return s

    def test_last_rank_inline(self):
        for tp in (1, 2, 4):
            clients = [RankClient() for _ in range(tp)]
            s = self.sched(clients)
            req = Request("r", list(range(8 * 16 + 1)))
            self.assertEqual(s.get_num_new_matched_tokens(req, 0), (8 * 16, False))
            self.assertEqual([c.calls for c in clients],
                             [["start_lookup"]] * (tp - 1) + [["lookup_inline"]])
            s.request_finished(req, [])
            self.assertEqual([c.live for c in clients], [{}] * tp)

    def test_inline_errors_are_misses(self):
        """UNAVAILABLE from the last rank: a miss, that rank backs off, the other rank's pins
        released; another error: a miss without back-off."""
        for err, backs_off in ((tutti.Unavailable("away"), True),
                               (tutti.InvalidArgument("bad"), False)):
            clients = [RankClient(), RankClient(fail=err)]
            s = self.sched(clients)
            req = Request("r", list(range(8 * 16 + 1)))
            self.assertEqual(s.get_num_new_matched_tokens(req, 0), (0, False))
            self.assertEqual(clients[0].live, {})
            self.assertEqual(s._links[1].client() is None, backs_off)
            self.assertIsNotNone(s._links[0].client())

    def test_every_rank_in_one_lookup_many(self):
        """tutti.Client's lookup_many: one call for every rank's Lookup (through tutti._lookup
        where it loads); the same answers, and the same misses and back-off on errors."""
        for tp in (1, 2, 4):
            ManyClient.batches, ManyClient.release_batches = [], []
            clients = [ManyClient() for _ in range(tp)]
            s = self.sched(clients)
            req = Request("r", list(range(8 * 16 + 1)))
            self.assertEqual(s.get_num_new_matched_tokens(req, 0), (8 * 16, False))
            self.assertEqual(ManyClient.batches, [tp])
            self.assertEqual([c.calls for c in clients], [["lookup_many"]] * tp)
            s.request_finished(req, [])
            self.assertEqual([c.live for c in clients], [{}] * tp)
            self.assertEqual(ManyClient.release_batches, [tp])  # every rank's in one call
        for err, backs_off in ((tutti.Unavailable("away"), True),
                               (tutti.InvalidArgument("bad"), False)):
            clients = [ManyClient(), ManyClient(fail=err)]
            s = self.sched(clients)
            req = Request("r", list(range(8 * 16 + 1)))
            self.assertEqual(s.get_num_new_matched_tokens(req, 0), (0, False))
            self.assertEqual(clients[0].live, {})  # the other rank's pins released
            self.assertEqual(s._links[1].client() is None, backs_off)
            self.assertIsNotNone(s._links[0].client())

    def test_a_broken_lookup_many_is_a_miss(self):
        """lookup_many raising (a bug, a broken native module): a miss, nothing held."""
        class Broken(ManyClient):
            @staticmethod
            def lookup_many(lookups):
                raise RuntimeError("broken")
        s = self.sched([Broken(), Broken()])
        with self.assertLogs("tutti.vllm", "WARNING"):
            self.assertEqual(s.get_num_new_matched_tokens(Request("r", list(range(33))), 0),
                             (0, False))

    def test_a_client_without_lookup_inline(self):
        """A rank client with start_lookup only (an older tutti.Client, a fake): in flight."""
        c = RankClient()
        c.lookup_inline = None
        s = self.sched([c])
        self.assertEqual(s.get_num_new_matched_tokens(Request("r", list(range(33))), 0),
                         (32, False))
        self.assertEqual(c.calls, ["start_lookup"])


if __name__ == "__main__":
    unittest.main()

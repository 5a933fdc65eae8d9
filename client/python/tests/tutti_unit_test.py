"""Unit tests of the tutti Python package that need no daemon: the chain hash (the same bytes as
the C++ library's ChainKeys), placements from torch tensors, attach requests (host regions; cuda
regions grouped by allocation, with a fake driver), and the transfer state machine (layer waits,
failed blocks, a broken transfer releasing every wait)."""

import hashlib
import random
import struct
import threading
import time
import unittest

import torch

import tutti
from tutti import client as tc


class ChainKeysTest(unittest.TestCase):
    def test_same_bytes_as_the_cpp_library(self):
        # The same vectors as client/cpp/chain_keys_test.cc.
        keys = tutti.chain_keys(list(range(40)), 16)
        self.assertEqual([k.hex() for k in keys],
                         ["955cfe76acfc9fd031300d3413d1c1ec", "0480330e1c71b2c2d1f428549c284cc3"])
        salted = tutti.chain_keys([7] * 16, 16, bytes(range(16)))
        self.assertEqual(salted[0].hex(), "2192d613a4f6fde3c575a5d8f4efeea7")

    def test_prefix_and_change(self):
        tokens = list(range(100, 164))
        full = tutti.chain_keys(tokens, 16)
        self.assertEqual(tutti.chain_keys(tokens[:40], 16), full[:2])
        tokens[20] = 9
        changed = tutti.chain_keys(tokens, 16)
        self.assertEqual(changed[0], full[0])
        self.assertTrue(all(changed[b] != full[b] for b in range(1, 4)))
        self.assertEqual(tutti.chain_keys(torch.arange(100, 164).tolist(), 16), full)

    def test_tokens_of_any_kind_hash_as_uint32le(self):
        # The scheme's definition, one token at a time (the module packs them in one call where
        # it can): every kind of token sequence must give these bytes.
        def spec(tokens, block_tokens, parent=bytes(16)):
            words = [int(t) & 0xFFFFFFFF for t in tokens]
            keys, prev = [], parent
            for b in range(len(words) // block_tokens):
                block = words[b * block_tokens:(b + 1) * block_tokens]
                prev = hashlib.sha256(prev + struct.pack("<I", block_tokens) +
                                      struct.pack("<%dI" % block_tokens, *block)).digest()[:16]
                keys.append(prev)
            return keys

        cases = {
            "masked (negative, 2^32 and past)": [-1, -5, 2**32, 2**33 + 7] * 8,
            "largest uint32": [2**32 - 1] * 16,
            "floats": [3.0, 7.0] * 9,
            "bools": [True, False] * 16,
            "tuple, partial last block": tuple(range(100)),
            "bytes (items, not raw bytes)": bytes(range(48)),
            "bytearray": bytearray(range(32)),
            "tensor": torch.arange(100, 164),
            "negative tensor": torch.full((32,), -3),
        }
        for name, tokens in cases.items():
            for block_tokens in (1, 4, 16):
                with self.subTest(name, block_tokens=block_tokens):
                    self.assertEqual(tutti.chain_keys(tokens, block_tokens),
                                     spec(tokens, block_tokens))
        self.assertEqual(tutti.chain_keys(list(range(15)), 16), [])
        self.assertEqual(tutti.chain_keys(list(range(32)), 0), [])

    def test_the_c_chain_gives_the_same_keys(self):
        # The build ships tutti._keychain, so lists and tuples of ints go through its chain_v1;
        # it must give the Python reference's keys with either SHA-256 compressor, and refuse
        # (ValueError) the tokens the reference masks, so that those take the Python path.
        native = tutti._hash._native
        self.assertIsNotNone(native, "tutti._keychain did not load")
        rng = random.Random(7)
        try:
            for portable in (False, True):
                native.use_portable(portable)
                for block_tokens in (1, 3, 16, 17, 256):
                    tokens = [rng.randrange(2**32) for _ in range(block_tokens * 9 + 5)]
                    parent = bytes(rng.randrange(256) for _ in range(16))
                    with self.subTest(portable=portable, block_tokens=block_tokens):
                        want = tutti._hash._chain_keys_py(tokens, block_tokens, parent,
                                                          len(tokens) // block_tokens)
                        packed = native.chain_v1(parent, tokens, block_tokens)
                        self.assertEqual([packed[i:i + 16] for i in range(0, len(packed), 16)],
                                         want)
                        self.assertEqual(tutti.chain_keys(tuple(tokens), block_tokens, parent),
                                         want)
        finally:
            native.use_portable(False)
        for bad in ([1, -1], [1, 2**32], [1, 2.0]):
            with self.assertRaises(ValueError):
                native.chain_v1(bytes(16), bad, 1)


class RetrieveRequestTest(unittest.TestCase):
    def test_encoded_blocks_parse_as_protobufs_own(self):
        # The client sends the blocks of a Retrieve and of a Store encoded by hand
        # (_transfers._encoded_block_pairs):
        # they must parse as the BlockPairs protobuf builds, for every varint size of a block
        # and for keys of any length (tuttid refuses those not of 16 bytes itself).
        from tutti import _transfers
        from tutti.v1 import kvcache_pb2 as pb
        keys = [bytes([i]) * 16 for i in range(9)] + [b"", b"short", bytes(40)]
        blocks = [0, 1, 127, 128, 16383, 16384, 2**21, 2**32 - 1, 5, 6, 300, 7]
        head = pb.RetrieveRequest(session_id=3, lease_id=9, layer_begin=1, layer_end=4,
                                  ticket=2, lease_ids=[5, 6], session_token=bytes(16))
        want = pb.RetrieveRequest()
        want.CopyFrom(head)
        for k, b in zip(keys, blocks):
            want.blocks.add(key=k, engine_block=b)
        got = pb.RetrieveRequest.FromString(
            head.SerializeToString() + _transfers._encoded_block_pairs(keys, blocks))
        self.assertEqual(got, want)
        # A Store's blocks are field 2 of its request.
        store_head = pb.StoreRequest(session_id=3, layer_begin=1, wait_durable=True, ticket=4,
                                     session_token=bytes(16), staging_wait_ms=10)
        want = pb.StoreRequest()
        want.CopyFrom(store_head)
        for k, b in zip(keys, blocks):
            want.blocks.add(key=k, engine_block=b)
        got = pb.StoreRequest.FromString(store_head.SerializeToString() +
                                         _transfers._encoded_block_pairs(keys, blocks,
                                                                         _transfers.STORE_BLOCKS))
        self.assertEqual(got, want)
        with self.assertRaises(tutti.InvalidArgument):
            _transfers._encoded_block_pairs([bytes(16)], [-1])
        with self.assertRaises(tutti.InvalidArgument):
            _transfers._encoded_block_pairs([bytes(16)], [2**32])
        with self.assertRaises(tutti.InvalidArgument):
            _transfers._encoded_block_pairs(["0123456789abcdef"], [1])


LAYOUT = tutti.KvLayout(num_layers=2, kv_heads=2, head_dim=64, dtype_bytes=2, block_tokens=16)
NS = tutti.Namespace(model_id="m", layout=LAYOUT)


class PlacementTest(unittest.TestCase):
    def test_host_cache_over_shared_memory(self):
        shm = tutti.SharedMemory(tutti.cache_bytes(LAYOUT, 8), prefix="tutti-unit")
        try:
            cache, per_layer = tutti.host_cache_tensor(LAYOUT, 8, torch.float16, shm)
            self.assertEqual(tuple(cache.shape), (2, 2, 8, 16, 2, 64))
            objs = tutti.objects_from_tensors(LAYOUT, per_layer)
            self.assertEqual(len(objs), 4)
            for i, o in enumerate(objs):
                self.assertEqual(o.base, shm.address + i * 8 * 4096)
                self.assertEqual(o.block_stride, 4096)
            req = tc.build_host_attach("e", NS, 8, objs, [shm.region()])
            self.assertEqual(req.regions[0].host_shm.name, shm.name)
            self.assertEqual(req.regions[0].host_shm.fd_index, 0)
            self.assertEqual(req.credential, b"")  # the Client adds one per Attach
            self.assertEqual([p.offset for p in req.placements], [i * 8 * 4096 for i in range(4)])
            self.assertEqual(req.namespace.hash_scheme, "tutti-sha256-v1")
            self.assertEqual(req.namespace.layout.format, 2)
            # Writes through the tensor land in the shared memory.
            cache[1, 1, 7].fill_(1.5)
            again = torch.frombuffer(shm.buffer, dtype=torch.float16)
            self.assertEqual(float(again[-1]), 1.5)
            del cache, per_layer, again
        finally:
            shm.close()

    def test_errors_name_the_object(self):
        shm = tutti.SharedMemory(tutti.cache_bytes(LAYOUT, 8), prefix="tutti-unit")
        try:
            _, per_layer = tutti.host_cache_tensor(LAYOUT, 8, torch.float16, shm)
            objs = tutti.objects_from_tensors(LAYOUT, per_layer)
            name, addr, size = shm.region()
            with self.assertRaisesRegex(tutti.InvalidArgument, r"objects\[3\]"):
                tc.build_host_attach("e", NS, 8, objs, [(name, addr, size - 1)])
            with self.assertRaisesRegex(tutti.InvalidArgument, "3 entries"):
                tc.build_host_attach("e", NS, 8, objs[:3], [shm.region()])
            with self.assertRaisesRegex(tutti.InvalidArgument, "host_regions"):
                tc.build_host_attach("e", NS, 8, objs, [])
            with self.assertRaises(ValueError):
                tutti.objects_from_tensors(LAYOUT, per_layer[:1])
            del per_layer
        finally:
            shm.close()


class FakeCuda:
    """Allocations of a fake device: base -> size."""

    def __init__(self, allocs):
        self.allocs = allocs
        self.exported = []

    def gpu_uuid(self, device):
        return "GPU-fake"

    def allocation_of(self, device, ptr):
        for base, size in self.allocs.items():
            if base <= ptr < base + size:
                return base, size
        raise RuntimeError("not device memory")

    def ipc_handle(self, device, base):
        self.exported.append(base)
        return bytes([len(self.exported)]) * 64


class FakeWords:
    count = 3

    def __init__(self):
        self.waits, self.released = [], []

    def export(self):
        return b"w" * 64, 12, "GPU-fake"

    def wait(self, stream, index, ticket):
        self.waits.append((stream, index, ticket))

    def force_release(self, ticket):
        self.released.append(ticket)


class CudaAttachTest(unittest.TestCase):
    def test_objects_grouped_by_allocation(self):
        a, b = 0x7F0000000000, 0x7F0001000000
        cuda = FakeCuda({a: 2 << 20, b: 2 << 20})
        layer = 2 * 8 * 4096
        objs = [tutti.ObjectTensor(a, 4096), tutti.ObjectTensor(a + layer // 2, 4096),
                tutti.ObjectTensor(b + 4096, 4096), tutti.ObjectTensor(b + 4096 + layer // 2, 4096)]
        req = tc.build_cuda_attach("e", NS, 8, objs, 0, FakeWords(), cuda)
        self.assertEqual(cuda.exported, [a, b])
        self.assertEqual([(p.region, p.offset) for p in req.placements],
                         [(0, 0), (0, layer // 2), (1, 4096), (1, 4096 + layer // 2)])
        self.assertEqual(req.regions[1].cuda_ipc.size_bytes, 2 << 20)
        self.assertEqual(req.regions[1].cuda_ipc.gpu_uuid, "GPU-fake")
        self.assertEqual(req.ready_words.count, 3)
        self.assertGreater(req.engine_pid, 0)

    def test_object_past_its_allocation(self):
        a = 0x7F0000000000
        cuda = FakeCuda({a: 4 * 8 * 4096 - 1})
        objs = [tutti.ObjectTensor(a + i * 8 * 4096, 4096) for i in range(4)]
        with self.assertRaisesRegex(tutti.InvalidArgument, r"objects\[3\]"):
            tc.build_cuda_attach("e", NS, 8, objs, 0, FakeWords(), cuda)


class TransferTest(unittest.TestCase):
    def test_layers_land_and_a_failed_block_is_reported(self):
        r = tc.Retrieval(3, 0, 4, 7, None)
        r._on_progress(0, [])
        r._on_progress(1, [1])
        r._on_progress(2, [])
        r._on_progress(3, [])
        r._on_end("OK", "")
        out = r.wait()
        self.assertTrue(out.ok)
        self.assertEqual(out.failed, [1])
        self.assertEqual(out.layers_done, 4)

    def test_host_wait_blocks_until_the_layer_lands(self):
        r = tc.Retrieval(2, 0, 3, 1, None)
        landed = []
        t = threading.Thread(target=lambda: [r.wait_layer(l) or landed.append(l)
                                             for l in range(3)])
        t.start()
        time.sleep(0.05)
        self.assertEqual(landed, [])
        r._on_progress(0, [])
        time.sleep(0.05)
        self.assertEqual(landed, [0])
        r._on_progress(1, [])
        r._on_progress(2, [])
        t.join()
        self.assertEqual(landed, [0, 1, 2])

    def test_broken_transfer_releases_waiters_and_fails_every_block(self):
        r = tc.Retrieval(4, 0, 4, 9, None)
        r._on_progress(0, [])
        errors = []

        def engine():
            try:
                r.wait_layer(2)
            except tutti.TuttiError as e:
                errors.append(e)

        t = threading.Thread(target=engine)
        t.start()
        time.sleep(0.02)
        r._on_end("UNAVAILABLE", "socket closed")
        t.join()
        self.assertEqual(errors[0].code, "ABORTED")
        self.assertIn("UNAVAILABLE", str(errors[0]))
        out = r.wait()
        self.assertEqual((out.code, out.failed, out.layers_done), ("UNAVAILABLE", [0, 1, 2, 3], 1))

    def test_cuda_waits_go_to_the_words_and_a_break_force_releases(self):
        words = FakeWords()
        r = tc.Retrieval(2, 1, 4, 42, words)
        r.wait_layer(1, 1234)
        r.wait_layer(3, 1234)
        with self.assertRaises(tutti.InvalidArgument):
            r.wait_layer(0, 1234)
        self.assertEqual(words.waits, [(1234, 1, 42), (1234, 3, 42)])
        r._on_progress(1, [])
        r._on_end("UNAVAILABLE", "tuttid died")
        self.assertEqual(words.released, [42])
        self.assertEqual(r.wait().failed, [0, 1])

    def test_missing_layers_are_an_error_and_release(self):
        words = FakeWords()
        r = tc.Retrieval(1, 0, 3, 5, words)
        r._on_progress(0, [])
        r._on_end("OK", "")
        self.assertEqual(r.wait().code, "INTERNAL")
        self.assertEqual(words.released, [5])
        done = tc.Retrieval(1, 0, 1, 6, words)
        done._on_progress(0, [])
        done._on_end("OK", "")
        self.assertEqual(words.released, [5])


class SharedMemoryTest(unittest.TestCase):
    def test_memfd_by_default_no_name_to_open(self):
        import os
        shm = tutti.SharedMemory(4096, prefix="tutti-unit")
        name, addr, size = region = shm.region()
        self.assertTrue(name.startswith("memfd:tutti-unit-"))
        self.assertEqual((addr, size), (shm.address, 4096))
        self.assertEqual(region.fd, shm.fd)
        self.assertEqual(os.fstat(shm.fd).st_size, 4096)
        self.assertEqual(os.readlink("/proc/self/fd/%d" % shm.fd).split(" ")[0],
                         "/" + name)  # the kernel's name for it: "/memfd:<label> (deleted)"
        self.assertFalse(os.path.exists("/dev/shm/" + name[len("memfd:"):]))
        fd = shm.fd
        shm.close()
        with self.assertRaises(OSError):
            os.fstat(fd)  # closed with it
        with self.assertRaises(ValueError):
            shm.region()
        shm.close()  # idempotent

    def test_named_mode_and_unlink(self):
        import os
        import stat
        shm = tutti.SharedMemory(4096, prefix="tutti-unit", named=True)
        path = "/dev/shm" + shm.name
        self.assertTrue(os.path.exists(path))
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)  # tuttid gets the fd
        shm.unlink()
        self.assertFalse(os.path.exists(path))
        self.assertEqual(os.fstat(shm.region().fd).st_size, 4096)  # still there to hand over
        shm.close()
        shm.close()  # idempotent
        with self.assertRaises(ValueError):
            tutti.SharedMemory(4096, prefix="bad/prefix")

    def test_region_descriptors_for_the_handoff(self):
        import os
        shm = tutti.SharedMemory(8192, prefix="tutti-unit", named=True)
        try:
            fds = tc.region_fds([shm.region(), (shm.name, shm.address, 4096)])
            try:
                inode = os.fstat(shm.fd).st_ino
                self.assertEqual([os.fstat(fd).st_ino for fd in fds], [inode, inode])
                self.assertNotIn(shm.fd, fds)  # the Client's own, closed at detach
            finally:
                for fd in fds:
                    os.close(fd)
            with self.assertRaisesRegex(tutti.InvalidArgument,
                                        r"host_regions\[0\] \(/tutti-no-such\): shm_open"):
                tc.region_fds([("/tutti-no-such", shm.address, 4096)])
        finally:
            shm.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)

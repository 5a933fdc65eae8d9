"""tutti.Client's transfers: a Retrieve (its request, the thread that reads its progress
stream into the Retrieval, waiting for the one in flight) and a Store (its request and
outcomes), each with a deadline sized to the bytes it moves (Timeouts.for_retrieve, for_store).

Transfers is mixed into Client over tutti._session.Session (its _current, _next_ticket, _call,
_error, _observe, _calls, _words and the layout it attached with); Client holds the Retrieve in
flight (_inflight). Client.retrieve and Client.store check the arguments and take the locks
(_retrieve_lock; _store_lock in cuda mode).
"""

import threading

import grpc

from tutti import errors
from tutti._lookups import _varint
from tutti._retrieval import Retrieval
from tutti._types import STORE_OUTCOMES, StoreOutcomes
from tutti.v1 import kvcache_pb2 as pb


# The `blocks` field of a RetrieveRequest (3) and of a StoreRequest (2), each entry a BlockPair
# {bytes key = 1; uint32 engine_block = 2}: the fields' tags, and the varints of engine blocks
# below 2^14 (one or two bytes), made once.
RETRIEVE_BLOCKS = b"\x1a"
STORE_BLOCKS = b"\x12"
_SMALL_VARINTS = [_varint(b) for b in range(1 << 14)]


def _encoded_block_pairs(keys, engine_blocks, tag=RETRIEVE_BLOCKS) -> bytes:
    """keys[i] -> engine_blocks[i] as the request's `blocks` field (`tag`), serialized: what
    protobuf parses as the same repeated BlockPair, in a fifth of the time protobuf takes to
    build and serialize them. InvalidArgument for a key that is not bytes or a block outside
    [0, 2^32)."""
    parts = []
    append = parts.append
    for i, (k, b) in enumerate(zip(keys, engine_blocks)):
        b = int(b)
        if 0 <= b < 1 << 14:
            v = _SMALL_VARINTS[b]
        elif 0 <= b < 1 << 32:
            v = _varint(b)
        else:
            raise errors.InvalidArgument("engine_blocks[%d] = %d: not in [0, 2^32)" % (i, b))
        if not isinstance(k, (bytes, bytearray)):
            raise errors.InvalidArgument("keys[%d]: a key is bytes, got %s" % (i, type(k).__name__))
        if len(k) == 16:
            append(b"".join((tag, bytes((19 + len(v),)), b"\x0a\x10", k, b"\x10", v)))
        else:  # tuttid answers INVALID_ARGUMENT for it, as for the message protobuf would build
            pair = b"".join((b"\x0a", _varint(len(k)), bytes(k), b"\x10", v))
            append(tag + _varint(len(pair)) + pair)
    return b"".join(parts)


class Transfers:
    """The Retrieve and Store helpers of one Client (see the module docstring)."""

    def _transfer_bytes(self, blocks, layer_begin, layer_end):
        layers = (layer_end or self._num_layers) - layer_begin
        with self._cv:
            object_bytes = self._attach_response.object_bytes
        return blocks * max(layers, 0) * self._parts * object_bytes

    def _start_retrieve(self, lease, keys, engine_blocks, layer_begin, layer_end, more_leases):
        """Client.retrieve once its arguments are checked, under _retrieve_lock: waits for the
        Retrieve in flight, then starts this one and its stream reader."""
        self._finish_inflight()
        sid, gen = self._current()
        if lease is not None and lease.generation != gen:
            raise errors.Unavailable("the lease is from before tuttid restarted (the client "
                                     "re-attached); look up again")
        ticket = self._next_ticket()
        # The fields but the blocks by protobuf, the blocks appended as bytes (a message's fields
        # may come in any order; repeated ones concatenate).
        req = pb.RetrieveRequest(**sid.fields(), lease_id=lease.id if lease else 0,
                                 layer_begin=layer_begin, layer_end=layer_end, ticket=ticket,
                                 lease_ids=more_leases).SerializeToString() + \
            _encoded_block_pairs(keys, engine_blocks)
        r = Retrieval(len(keys), layer_begin, layer_end, ticket, self._words)
        timeout, field_name = self._timeouts.for_retrieve(
            self._transfer_bytes(len(keys), layer_begin, layer_end))
        # The call starts here, on the caller's thread, so the request is on its way when
        # retrieve() returns; started by the reader thread, it left only once that thread got
        # the GIL from the engine's, which holds it while it enqueues its forward pass.
        stream, failed = None, None
        try:
            stream = self._retrieve_encoded(req, timeout=timeout)
        except Exception as e:  # reported as the transfer's end, by the reader thread
            failed = e
        else:
            self._calls.add(gen, stream)
        r._thread = threading.Thread(target=self._read_stream,
                                     args=(r, stream, failed, timeout, field_name, gen),
                                     name="tutti-retrieve", daemon=True)
        self._inflight = r
        r._thread.start()
        return r

    def _read_stream(self, r, stream, failed, timeout, field_name, generation):
        """Reads the progress of the Retrieve call `stream` into `r` until it ends; `failed`:
        instead, the exception starting the call raised (a call is an RpcError itself)."""
        code, message = "OK", ""
        try:
            if failed is not None:
                raise failed
            for progress in stream:
                r._on_progress(progress.layer, progress.failed)
        except grpc.RpcError as e:
            err = self._error("Retrieve", e, timeout, field_name, generation)
            self._observe(err, generation)
            code, message = err.code, err.message
        except Exception as e:  # never leave the engine waiting
            code, message = "INTERNAL", repr(e)
        finally:
            if stream is not None:
                self._calls.discard(generation, stream)
        r._on_end(code, message)

    def _finish_inflight(self):
        if self._inflight is not None:
            self._inflight.wait()
            self._inflight._thread.join()
            self._inflight = None

    def _store(self, keys, engine_blocks, wait_durable, layer_begin, layer_end, staging_wait_ms):
        sid, gen = self._current()
        # As a Retrieve's: the blocks appended as bytes to the other fields.
        req = pb.StoreRequest(**sid.fields(), layer_begin=layer_begin, layer_end=layer_end,
                              wait_durable=wait_durable, ticket=self._next_ticket(),
                              staging_wait_ms=staging_wait_ms).SerializeToString() + \
            _encoded_block_pairs(keys, engine_blocks, STORE_BLOCKS)
        timeout, field_name = self._timeouts.for_store(
            self._transfer_bytes(len(keys), layer_begin, layer_end), wait_durable)
        timeout += staging_wait_ms / 1000.0
        resp = self._call("Store", req, gen, timeout, field_name, method=self._store_encoded)
        if len(resp.outcomes) != len(keys):
            raise errors.TuttiError("tuttid answered Store with a wrong number of outcomes",
                                    "INTERNAL")
        out = StoreOutcomes(STORE_OUTCOMES.get(o, "unspecified") for o in resp.outcomes)
        out.rejected_why = resp.rejected_why
        return out

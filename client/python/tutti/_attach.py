"""Attach requests: the regions and placements of an engine's KV cache (host shared memory or
CUDA device memory), and the descriptors of its host regions that the handoff carries
(tutti._handoff). Used by tutti.client; the builders are public for tests and tools.
"""

import os

import _posixshmem

from tutti import errors
from tutti.layout import FORMATS, KvLayout, Namespace
from tutti.v1 import kvcache_pb2 as pb


def _namespace_proto(ns: Namespace):
    l = ns.layout
    return pb.Namespace(
        model_id=ns.model_id, tp_rank=ns.tp_rank, tp_size=ns.tp_size, hash_scheme=ns.hash_scheme,
        layout=pb.KvLayout(num_layers=l.num_layers, kv_heads=l.kv_heads, head_dim=l.head_dim,
                           dtype_bytes=l.dtype_bytes, block_tokens=l.block_tokens,
                           format=FORMATS[l.format]))


def _check_objects(layout: KvLayout, num_blocks, objects):
    layout.check()
    if num_blocks <= 0:
        raise errors.InvalidArgument("num_blocks must be at least 1")
    want = layout.num_layers * layout.parts
    if len(objects) != want:
        raise errors.InvalidArgument("objects: %d entries; the layout has %d (num_layers x %d "
                                     "parts, layer-major)" % (len(objects), want, layout.parts))
    for i, o in enumerate(objects):
        if not o.base:
            raise errors.InvalidArgument("objects[%d]: null" % i)
        if num_blocks > 1 and o.block_stride < layout.object_bytes:
            raise errors.InvalidArgument("objects[%d]: block_stride %d is smaller than an object "
                                         "(%d bytes)" % (i, o.block_stride, layout.object_bytes))


def _extent(layout, num_blocks, o):
    return (num_blocks - 1) * o.block_stride + layout.object_bytes


def _random_bytes(field, value, who):
    """`value` as bytes; raises InvalidArgument unless it is empty or 16 to 64 bytes."""
    if not isinstance(value, (bytes, bytearray)):
        raise errors.InvalidArgument("%s: bytes, not %s" % (field, type(value).__name__))
    if value and not 16 <= len(value) <= 64:
        raise errors.InvalidArgument("%s: %d bytes; give 16 to 64 (random, shared by %s) or none"
                                     % (field, len(value), who))
    return bytes(value)


def check_engine_group(engine_group):
    """Raises InvalidArgument unless `engine_group` is empty or 16 to 64 bytes."""
    return _random_bytes("engine_group", engine_group, "the engine's own processes")


def check_namespace_secret(secret):
    """Raises InvalidArgument unless `secret` is empty or 16 to 64 bytes."""
    return _random_bytes("namespace_secret", secret, "the engines that may share blocks")


def build_lookup_only_attach(engine_id, ns, engine_group):
    """The AttachRequest of a memory-less session (no regions, no placements, num_blocks 0),
    without its credential: it may Lookup, Release, ReportCompute and WatchEvents; workers of
    the same `engine_group` (16 to 64 bytes, required here) retrieve under its leases."""
    ns.layout.check()
    if not engine_group:
        raise errors.InvalidArgument("engine_group: a memory-less session needs one (16 to 64 "
                                     "bytes) for its leases to be of use")
    req = pb.AttachRequest(engine_id=engine_id, num_blocks=0, engine_pid=os.getpid(),
                           engine_group=check_engine_group(engine_group))
    req.namespace.CopyFrom(_namespace_proto(ns))
    return req


def build_host_attach(engine_id, ns, num_blocks, objects, host_regions, engine_group=b""):
    """The AttachRequest of a host-mode engine, without its credential; every object's blocks
    must lie in one of `host_regions` [(name, address, size)]. Region i is the handoff's
    descriptor i (see region_fds)."""
    _check_objects(ns.layout, num_blocks, objects)
    if not host_regions:
        raise errors.InvalidArgument("host mode needs host_regions (shared memory)")
    req = pb.AttachRequest(engine_id=engine_id, num_blocks=num_blocks, engine_pid=os.getpid(),
                           engine_group=check_engine_group(engine_group))
    req.namespace.CopyFrom(_namespace_proto(ns))
    for i, (name, _, size) in enumerate(host_regions):
        req.regions.add().host_shm.CopyFrom(pb.HostShmRegion(name=name, size_bytes=size,
                                                             fd_index=i))
    for i, o in enumerate(objects):
        extent = _extent(ns.layout, num_blocks, o)
        for r, (_, start, size) in enumerate(host_regions):
            if start <= o.base and o.base - start + extent <= size:
                req.placements.add(region=r, offset=o.base - start, block_stride=o.block_stride)
                break
        else:
            raise errors.InvalidArgument("objects[%d]: its %d blocks (%d bytes from its base) do "
                                         "not lie inside any of the host_regions" %
                                         (i, num_blocks, extent))
    return req


def build_cuda_attach(engine_id, ns, num_blocks, objects, device, words, cuda=None,
                      engine_group=b""):
    """The AttachRequest of a cuda-mode engine, without its credential (a handoff of no
    descriptors): one region per device allocation that holds objects, the ready words and this
    process's pid. `cuda` is the driver module (tests pass
    a fake)."""
    if cuda is None:
        from tutti import _cuda as cuda
    _check_objects(ns.layout, num_blocks, objects)
    req = pb.AttachRequest(engine_id=engine_id, num_blocks=num_blocks, engine_pid=os.getpid(),
                           engine_group=check_engine_group(engine_group))
    req.namespace.CopyFrom(_namespace_proto(ns))
    uuid = cuda.gpu_uuid(device)
    region_of = {}
    for i, o in enumerate(objects):
        base, size = cuda.allocation_of(device, o.base)
        offset = o.base - base
        if offset + _extent(ns.layout, num_blocks, o) > size:
            raise errors.InvalidArgument("objects[%d]: its blocks run past the end of the device "
                                         "allocation that holds its base" % i)
        if base not in region_of:
            region_of[base] = len(req.regions)
            req.regions.add().cuda_ipc.CopyFrom(pb.CudaIpcRegion(
                ipc_handle=cuda.ipc_handle(device, base), size_bytes=size, gpu_uuid=uuid))
        req.placements.add(region=region_of[base], offset=offset, block_stride=o.block_stride)
    handle, size, words_uuid = words.export()
    req.ready_words.region.CopyFrom(pb.CudaIpcRegion(ipc_handle=handle, size_bytes=size,
                                                     gpu_uuid=words_uuid))
    req.ready_words.count = words.count
    return req


def region_fds(host_regions):
    """One new descriptor per region of `host_regions`, in order, for the handoff; the caller owns
    (and closes) them. A region that carries one (SharedMemory.region(): a HostRegion with .fd)
    is dup'ed, so it works after its name was unlinked; a plain (name, address, size) is opened
    by name (shm_open, read-write) now, so it must exist until the Client is attached. Raises
    InvalidArgument naming the region and the errno."""
    fds = []
    try:
        for i, region in enumerate(host_regions):
            fds.append(_open_region(i, region))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _open_region(i, region):
    fd = getattr(region, "fd", None)
    try:
        if fd is not None:
            return os.dup(fd)
        return _posixshmem.shm_open(region[0], os.O_RDWR, mode=0)
    except OSError as e:
        raise errors.InvalidArgument("host_regions[%d] (%s): %s: %s" % (
            i, region[0], "dup" if fd is not None else "shm_open", e.strerror or e)) from None


def with_credential(request, credential):
    """A copy of AttachRequest `request` carrying the handoff's `credential`."""
    req = pb.AttachRequest()
    req.CopyFrom(request)
    req.credential = credential
    return req

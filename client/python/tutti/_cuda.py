"""The few CUDA driver calls the client needs in cuda mode, through ctypes on libcuda.so.1.

Nothing here needs a CUDA toolkit or torch: the calls work on any device pointer of this
process (torch's, CuPy's, raw cuMemAlloc) in the device's primary context, which is the one the
CUDA runtime (and so torch) uses. Streams are CUstream handles (torch: stream.cuda_stream).

- allocation_of(ptr): the allocation holding ptr (cuMemGetAddressRange), whose IPC handle
  (cuIpcGetMemHandle) tuttid opens. Memory from cuMemCreate (torch's expandable_segments) has no
  such handle: cuIpcGetMemHandle fails and attach says so.
- ReadyWords: the layer-ready words in a 2 MiB allocation of their own (an IPC handle exports a
  whole allocation), zeroed; wait() is cuStreamWaitValue32(>=, wrap-around safe) on the engine's
  stream; force_release() writes a ticket into every word from a private non-blocking stream.
"""

import ctypes
import threading

CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
CU_STREAM_NON_BLOCKING = 0x1
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_MEMORYTYPE_DEVICE = 2
READY_WORDS_BYTES = 2 << 20

_lib = None
_lib_lock = threading.Lock()


class CudaError(RuntimeError):
    pass


def _driver():
    global _lib
    with _lib_lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise CudaError("no CUDA driver (libcuda.so.1): %s" % e) from None
            rc = lib.cuInit(0)
            if rc != 0:
                raise CudaError("cuInit failed with CUDA error %d" % rc)
            _lib = lib
        return _lib


def _fn(*names):
    lib = _driver()
    for name in names:
        f = getattr(lib, name, None)
        if f is not None:
            return f
    raise CudaError("the CUDA driver lacks %s" % names[0])


def _check(rc, what):
    if rc == 0:
        return
    name = ctypes.c_char_p()
    try:
        _fn("cuGetErrorName")(rc, ctypes.byref(name))
        text = name.value.decode() if name.value else str(rc)
    except CudaError:
        text = str(rc)
    raise CudaError("%s: %s" % (what, text))


class _Context:
    """Makes the primary context of `device` current for a block of driver calls."""

    def __init__(self, device):
        dev = ctypes.c_int()
        _check(_fn("cuDeviceGet")(ctypes.byref(dev), device), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        _check(_fn("cuDevicePrimaryCtxRetain")(ctypes.byref(self.ctx), dev),
               "cuDevicePrimaryCtxRetain")
        self.device = device
        self.dev = dev

    def __enter__(self):
        _check(_fn("cuCtxPushCurrent_v2", "cuCtxPushCurrent")(self.ctx), "cuCtxPushCurrent")
        return self

    def __exit__(self, *exc):
        old = ctypes.c_void_p()
        _fn("cuCtxPopCurrent_v2", "cuCtxPopCurrent")(ctypes.byref(old))
        return False


def gpu_uuid(device):
    """'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx' as nvidia-smi prints it."""
    ctx = _Context(device)
    raw = (ctypes.c_ubyte * 16)()
    _check(_fn("cuDeviceGetUuid_v2", "cuDeviceGetUuid")(raw, ctx.dev), "cuDeviceGetUuid")
    h = bytes(raw).hex()
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def allocation_of(device, ptr):
    """(base, size) of the device allocation holding `ptr`; CudaError if it is not device memory."""
    with _Context(device):
        mem_type = ctypes.c_uint()
        rc = _fn("cuPointerGetAttribute")(ctypes.byref(mem_type), CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                          ctypes.c_uint64(ptr))
        if rc != 0 or mem_type.value != CU_MEMORYTYPE_DEVICE:
            raise CudaError("address 0x%x is not device memory of GPU %d" % (ptr, device))
        base = ctypes.c_uint64()
        size = ctypes.c_size_t()
        _check(_fn("cuMemGetAddressRange_v2", "cuMemGetAddressRange")(
            ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)), "cuMemGetAddressRange")
        return base.value, size.value


def ipc_handle(device, base):
    """The 64-byte cudaIpcMemHandle_t of the allocation starting at `base`."""
    with _Context(device):
        handle = (ctypes.c_ubyte * 64)()
        _check(_fn("cuIpcGetMemHandle")(handle, ctypes.c_uint64(base)),
               "cuIpcGetMemHandle (memory from cuMemCreate / torch expandable_segments cannot be "
               "shared this way)")
        return bytes(handle)


def synchronize_stream(device, stream):
    with _Context(device):
        _check(_fn("cuStreamSynchronize")(ctypes.c_void_p(stream)), "cuStreamSynchronize")


class ReadyWords:
    """`count` uint32 words on `device`, in an allocation of their own, zeroed."""

    def __init__(self, device, count):
        self.device = device
        self.count = count
        self._ctx = _Context(device)
        self.ptr = None
        with self._ctx:
            ptr = ctypes.c_uint64()
            _check(_fn("cuMemAlloc_v2", "cuMemAlloc")(ctypes.byref(ptr),
                                                      ctypes.c_size_t(READY_WORDS_BYTES)),
                   "cuMemAlloc(ready words)")
            self.ptr = ptr.value
            _check(_fn("cuMemsetD32_v2", "cuMemsetD32")(ctypes.c_uint64(self.ptr), 0,
                                                        ctypes.c_size_t(READY_WORDS_BYTES // 4)),
                   "cuMemsetD32(ready words)")
            _check(_fn("cuCtxSynchronize")(), "cuCtxSynchronize")
        self.uuid = gpu_uuid(device)

    def export(self):
        """(ipc_handle, size_bytes, gpu_uuid) for AttachRequest.ready_words."""
        return ipc_handle(self.device, self.ptr), 4 * self.count, self.uuid

    def wait(self, stream, index, ticket):
        """Enqueues on `stream` a wait until word `index` >= ticket; returns at once."""
        if not 0 <= index < self.count:
            raise ValueError("ready word %d of %d" % (index, self.count))
        with self._ctx:
            _check(_fn("cuStreamWaitValue32_v2", "cuStreamWaitValue32")(
                ctypes.c_void_p(stream), ctypes.c_uint64(self.ptr + 4 * index),
                ctypes.c_uint32(ticket), CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")

    def force_release(self, ticket):
        """Writes `ticket` into every word and returns once written."""
        with self._ctx:
            side = ctypes.c_void_p()
            _check(_fn("cuStreamCreate")(ctypes.byref(side), CU_STREAM_NON_BLOCKING),
                   "cuStreamCreate")
            try:
                write = _fn("cuStreamWriteValue32_v2", "cuStreamWriteValue32")
                for i in range(self.count):
                    _check(write(side, ctypes.c_uint64(self.ptr + 4 * i), ctypes.c_uint32(ticket),
                                 CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32")
                _check(_fn("cuStreamSynchronize")(side), "cuStreamSynchronize")
            finally:
                _fn("cuStreamDestroy_v2", "cuStreamDestroy")(side)

    def read(self):
        """The words' values (tests and diagnostics)."""
        with self._ctx:
            out = (ctypes.c_uint32 * self.count)()
            _check(_fn("cuMemcpyDtoH_v2", "cuMemcpyDtoH")(out, ctypes.c_uint64(self.ptr),
                                                          ctypes.c_size_t(4 * self.count)),
                   "cuMemcpyDtoH")
            return list(out)

    def close(self):
        if self.ptr is not None:
            with self._ctx:
                _fn("cuMemFree_v2", "cuMemFree")(ctypes.c_uint64(self.ptr))
            self.ptr = None

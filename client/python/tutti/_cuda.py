"""The few CUDA driver calls the client needs in cuda mode, through ctypes on libcuda.so.1.

Nothing here needs a CUDA toolkit or torch: the calls work on any device pointer of this
process (torch's, CuPy's, raw cuMemAlloc) in the device's primary context, which is the one the
CUDA runtime (and so torch) uses. Streams are CUstream handles (torch: stream.cuda_stream).

- allocation_of(ptr): the allocation holding ptr (cuMemGetAddressRange), whose IPC handle
  (cuIpcGetMemHandle) tuttid opens. Memory from cuMemCreate (torch's expandable_segments) has no
  such handle: cuIpcGetMemHandle fails and attach says so.
- ReadyWords: the layer-ready words in a 2 MiB allocation of their own (an IPC handle exports a
  whole allocation), zeroed; wait() is cuStreamWaitValue32(>=, wrap-around safe) on the engine's
  stream; force_release() writes a ticket into every word (see its docstring for how it avoids
  waiting behind the very streams it releases, from a helper process if it must: _release.py).
"""

import ctypes
import os
import subprocess
import sys
import threading
import time

CU_STREAM_WAIT_VALUE_GEQ = 0x0
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0
CU_STREAM_NON_BLOCKING = 0x1
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_MEMORYTYPE_DEVICE = 2
READY_WORDS_BYTES = 2 << 20
CUDA_ERROR_NOT_READY = 600


def work_queues():
    """Hardware work queues per context (CUDA_DEVICE_MAX_CONNECTIONS, default 8)."""
    try:
        n = int(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "8"))
    except ValueError:
        n = 8
    return min(max(n, 1), 32)

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
        # Taken now: force_release's helper needs it when this context may be stalled.
        self._handle = ipc_handle(device, self.ptr)

    def export(self):
        """(ipc_handle, size_bytes, gpu_uuid) for AttachRequest.ready_words."""
        return self._handle, 4 * self.count, self.uuid

    def wait(self, stream, index, ticket):
        """Enqueues on `stream` a wait until word `index` >= ticket; returns at once."""
        if not 0 <= index < self.count:
            raise ValueError("ready word %d of %d" % (index, self.count))
        with self._ctx:
            _check(_fn("cuStreamWaitValue32_v2", "cuStreamWaitValue32")(
                ctypes.c_void_p(stream), ctypes.c_uint64(self.ptr + 4 * index),
                ctypes.c_uint32(ticket), CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")

    def force_release(self, ticket, timeout=30.0):
        """Writes `ticket` into every word and returns once written (CudaError after `timeout`
        seconds). For when tuttid is gone and engine streams may be waiting on the words.

        Two writers at once. A helper process (tutti._release) opens the words' IPC handle and
        writes them from a CUDA context of its own, as tuttid would have: this context itself
        can be stalled while one of its streams waits (CUDA's lazy loading of a kernel launched
        behind a wait needs the context idle first; seen on the H200 with torch), and then no
        write of its own lands. And this context writes them on one new stream per hardware
        work queue (CUDA_DEVICE_MAX_CONNECTIONS): a stream sharing a queue with a blocked engine
        stream would wait behind it. Returns once both have finished, so that no late write of
        this ticket can land on a later Retrieve's words."""
        helper = self._start_helper(ticket)
        streams = []
        try:
            streams = self._write_on_new_streams(ticket)
            if not self._await_all(streams, timeout):
                raise CudaError("releasing the ready words: no write landed within %.0f s (%s)" %
                                (timeout, self._helper_outcome(helper, 0.1)))
        finally:
            self._helper_outcome(helper, timeout)
            destroy = _fn("cuStreamDestroy_v2", "cuStreamDestroy")
            for s in streams:
                destroy(s)

    def _start_helper(self, ticket):
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "tutti._release", str(self.device), self._handle.hex(),
               str(self.count), str(ticket)]
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    @staticmethod
    def _helper_outcome(helper, timeout):
        """Waits for the helper (killed after `timeout`); a line saying how it ended."""
        if getattr(helper, "tutti_outcome", None) is None:
            try:
                _, err = helper.communicate(timeout=timeout)
                err = err.decode(errors="replace")[-300:]
                helper.tutti_outcome = "helper exit %d%s" % (helper.returncode,
                                                             (": " + err) if err else "")
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.communicate()
                helper.tutti_outcome = "the helper process was killed after %.0f s" % timeout
        return helper.tutti_outcome

    def _write_on_new_streams(self, ticket):
        create = _fn("cuStreamCreate")
        write = _fn("cuStreamWriteValue32_v2", "cuStreamWriteValue32")
        streams = []
        with self._ctx:
            for _ in range(work_queues() + 1):
                s = ctypes.c_void_p()
                _check(create(ctypes.byref(s), CU_STREAM_NON_BLOCKING), "cuStreamCreate")
                streams.append(s)
                for i in range(self.count):
                    _check(write(s, ctypes.c_uint64(self.ptr + 4 * i), ctypes.c_uint32(ticket),
                                 CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32")
        return streams

    @staticmethod
    def _await_all(streams, seconds):
        query = _fn("cuStreamQuery")
        deadline = time.monotonic() + seconds
        pending = list(streams)
        while pending:
            rc = query(pending[-1])
            if rc == 0:
                pending.pop()
                continue
            if rc != CUDA_ERROR_NOT_READY:
                _check(rc, "cuStreamQuery")
            if time.monotonic() > deadline:
                return False
            time.sleep(0.0005)
        return True

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

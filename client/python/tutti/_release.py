"""Writes a ticket into an engine's ready words from a CUDA context of this process's own.

    python3 -m tutti._release DEVICE IPC_HANDLE_HEX COUNT TICKET

_cuda.ReadyWords.force_release runs this when writing the words from the engine's own context does
not land: a context can be stalled as a whole while one of its streams waits on the words (CUDA
lazy loading a kernel launched behind such a wait needs the context idle first), and then only a
write from another context, like tuttid's, releases it. Exit 0 once the words hold the ticket.
"""
import ctypes
import sys

from tutti import _cuda


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def release(device, handle, count, ticket):
    with _cuda._Context(device):
        open_handle = _cuda._fn("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle")
        open_handle.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
        raw = _IpcHandle()
        ctypes.memmove(raw.reserved, handle, 64)
        ptr = ctypes.c_uint64()
        _cuda._check(open_handle(ctypes.byref(ptr), raw, 1), "cuIpcOpenMemHandle(ready words)")
        stream = ctypes.c_void_p()
        try:
            _cuda._check(_cuda._fn("cuStreamCreate")(ctypes.byref(stream),
                                                     _cuda.CU_STREAM_NON_BLOCKING),
                         "cuStreamCreate")
            write = _cuda._fn("cuStreamWriteValue32_v2", "cuStreamWriteValue32")
            for i in range(count):
                _cuda._check(write(stream, ctypes.c_uint64(ptr.value + 4 * i),
                                   ctypes.c_uint32(ticket), _cuda.CU_STREAM_WRITE_VALUE_DEFAULT),
                             "cuStreamWriteValue32")
            _cuda._check(_cuda._fn("cuStreamSynchronize")(stream), "cuStreamSynchronize")
        finally:
            if stream.value:
                _cuda._fn("cuStreamDestroy_v2", "cuStreamDestroy")(stream)
            _cuda._fn("cuIpcCloseMemHandle")(ptr)


def main(argv):
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    release(int(argv[1]), bytes.fromhex(argv[2]), int(argv[3]), int(argv[4]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""POSIX shared memory for a host-mode KV cache, mapped read-write in this process.

Created with mode 0660 (tuttid's group may map it) under a unique name "/<prefix>-<pid>-<hex>".
The name stays until close() (so the client can re-attach after a tuttid restart) and is removed
at interpreter exit and on SIGTERM/SIGINT/SIGHUP (handlers are chained to any existing ones).
Python's multiprocessing.shared_memory is not used: it creates with mode 0600 and its resource
tracker may unlink the name behind our back.
"""

import atexit
import ctypes
import mmap
import os
import re
import secrets
import signal
import threading

import _posixshmem

_live = set()
_live_lock = threading.Lock()
_handlers_installed = False


def _unlink_all():
    with _live_lock:
        names = list(_live)
        _live.clear()
    for name in names:
        try:
            _posixshmem.shm_unlink(name)
        except OSError:
            pass


def _install_handlers():
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_unlink_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        previous = signal.getsignal(sig)

        def handler(signum, frame, previous=previous):
            _unlink_all()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)


class SharedMemory:
    """A new shared-memory object of `size` bytes, zero-filled and mapped."""

    def __init__(self, size: int, prefix: str = "tutti-py"):
        if size <= 0:
            raise ValueError("size must be positive")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", prefix):
            raise ValueError("prefix: 1..64 characters of [A-Za-z0-9_.-]")
        _install_handlers()
        self.name = "/%s-%d-%s" % (prefix, os.getpid(), secrets.token_hex(6))
        fd = _posixshmem.shm_open(self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o660)
        try:
            os.fchmod(fd, 0o660)  # the umask may have cleared group bits
            os.ftruncate(fd, size)
            self._mmap = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            _posixshmem.shm_unlink(self.name)
            raise
        os.close(fd)
        with _live_lock:
            _live.add(self.name)
        self.size = size
        self._anchor = ctypes.c_char.from_buffer(self._mmap)
        self.address = ctypes.addressof(self._anchor)

    @property
    def buffer(self):
        """The mapping (a writable buffer: torch.frombuffer / numpy.frombuffer take it)."""
        return self._mmap

    def region(self):
        """(shm_name, address, size) as Client.attach's host_regions want it."""
        return (self.name, self.address, self.size)

    def unlink(self):
        """Removes the name (the mapping stays). Idempotent."""
        with _live_lock:
            if self.name not in _live:
                return
            _live.discard(self.name)
        try:
            _posixshmem.shm_unlink(self.name)
        except FileNotFoundError:
            pass

    def close(self):
        """Removes the name and unmaps. Tensors over the buffer must be gone first."""
        self.unlink()
        if self._mmap is not None:
            del self._anchor
            try:
                self._mmap.close()
            except BufferError:
                pass  # still exported (a tensor lives): the mapping goes with the process
            self._mmap = None

"""Shared memory for a host-mode KV cache, mapped read-write in this process, whose descriptor
the client hands to tuttid (tutti._handoff): tuttid never opens memory by name.

By default an anonymous memfd (memfd_create): no name exists that another process could open, and
nothing is left behind when the process dies. With named=True, a POSIX shared-memory object
"/<prefix>-<pid>-<hex>", mode 0600, for engines that want a name other tools can see; the name
may be unlinked at any time (the descriptor, held until close(), keeps the memory and lets the
client re-attach after a tuttid restart) and is removed at interpreter exit and on
SIGTERM/SIGINT/SIGHUP (handlers are chained to any existing ones). Python's
multiprocessing.shared_memory is not used: its resource tracker may unlink the name behind our back.
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


class HostRegion(tuple):
    """(name, address, size), as Client.attach's host_regions take it, that also carries `fd`:
    the descriptor the client hands to tuttid (owned by the SharedMemory, which must outlive the
    Client). Unpacks as three values."""

    def __new__(cls, name, address, size, fd):
        r = super().__new__(cls, (name, address, size))
        r.fd = fd
        return r


class SharedMemory:
    """A new shared-memory object of `size` bytes, zero-filled and mapped; a memfd unless
    `named` (see the module's docstring). Raises ValueError for a bad size or prefix, OSError when
    the system refuses the memory."""

    def __init__(self, size: int, prefix: str = "tutti-py", named: bool = False):
        if size <= 0:
            raise ValueError("size must be positive")
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", prefix):
            raise ValueError("prefix: 1..64 characters of [A-Za-z0-9_.-]")
        label = "%s-%d-%s" % (prefix, os.getpid(), secrets.token_hex(6))
        self.named = named
        if named:
            _install_handlers()
            self.name = "/" + label
            fd = _posixshmem.shm_open(self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        else:
            self.name = "memfd:" + label  # what /proc/<pid>/fd shows; for messages only
            fd = os.memfd_create(label, os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            self._mmap = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            if named:
                _posixshmem.shm_unlink(self.name)
            raise
        if named:
            with _live_lock:
                _live.add(self.name)
        self.fd = fd
        self.size = size
        self._anchor = ctypes.c_char.from_buffer(self._mmap)
        self.address = ctypes.addressof(self._anchor)

    @property
    def buffer(self):
        """The mapping (a writable buffer: torch.frombuffer / numpy.frombuffer take it)."""
        return self._mmap

    def region(self):
        """A HostRegion (name, address, size) with its descriptor, for Client.attach."""
        if self.fd is None:
            raise ValueError("shared memory %s is closed" % self.name)
        return HostRegion(self.name, self.address, self.size, self.fd)

    def unlink(self):
        """Removes the name, if any (the mapping and the descriptor stay). Idempotent."""
        with _live_lock:
            if self.name not in _live:
                return
            _live.discard(self.name)
        try:
            _posixshmem.shm_unlink(self.name)
        except FileNotFoundError:
            pass

    def close(self):
        """Removes the name, closes the descriptor and unmaps. Tensors over the buffer and
        Clients attached with it must be gone first. Idempotent."""
        self.unlink()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self._mmap is not None:
            del self._anchor
            try:
                self._mmap.close()
            except BufferError:
                pass  # still exported (a tensor lives): the mapping goes with the process
            self._mmap = None

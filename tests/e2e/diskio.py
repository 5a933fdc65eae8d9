"""The disk side of the issue-10 measurements (tests/e2e/ttft_grid.py): raw O_DIRECT reads of a
pool's files, a process's CPU time, and a read-bandwidth throttle through cgroups. No torch.

- written_chunks(path, chunk): the chunk-aligned offsets of `path` that hold written data
  (FIEMAP; pool files are fallocated, and unwritten extents read as zeros without touching the
  device, so random reads must stay inside what was written).
- raw_read(files, qd, ...): random O_DIRECT reads of `io_bytes` at those offsets from `qd`
  threads (os.preadv releases the GIL), each with its own page-aligned buffer (anonymous mmap).
- cpu_seconds(pid): utime + stime of a process from /proc/<pid>/stat.
- IoThrottle: caps a process's read bytes/s on the block device under a path, with cgroup v2
  io.max, else cgroup v1 blkio.throttle.read_bps_device; raises ThrottleError saying why not.
"""

import fcntl
import mmap
import os
import random
import struct
import threading
import time

_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_FLAG_SYNC = 0x1
_FIEMAP_EXTENT_LAST = 0x1
_FIEMAP_EXTENT_UNWRITTEN = 0x800
_FIEMAP_HEADER = "=QQIIII"   # fm_start, fm_length, fm_flags, fm_mapped_extents, fm_extent_count
_FIEMAP_EXTENT = "=QQQQQIIII"  # logical, physical, length, 2 reserved, flags, 3 reserved


def written_extents(path, batch=512):
    """[(offset, length)] of the written (not unwritten, not hole) extents of `path`. Raises
    OSError when the filesystem has no FIEMAP."""
    out, start = [], 0
    head, ext = struct.calcsize(_FIEMAP_HEADER), struct.calcsize(_FIEMAP_EXTENT)
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            buf = bytearray(struct.pack(_FIEMAP_HEADER, start, (1 << 64) - 1 - start,
                                        _FIEMAP_FLAG_SYNC, 0, batch, 0) + bytes(batch * ext))
            fcntl.ioctl(fd, _FS_IOC_FIEMAP, buf, True)
            mapped = struct.unpack_from(_FIEMAP_HEADER, buf)[3]
            if mapped == 0:
                return out
            last = False
            for i in range(mapped):
                f = struct.unpack_from(_FIEMAP_EXTENT, buf, head + i * ext)
                logical, length, flags = f[0], f[2], f[5]
                if not flags & _FIEMAP_EXTENT_UNWRITTEN:
                    out.append((logical, length))
                start = logical + length
                last = last or bool(flags & _FIEMAP_EXTENT_LAST)
            if last:
                return out
    finally:
        os.close(fd)


def written_chunks(path, chunk=1 << 20):
    """Offsets of the `chunk`-aligned chunks of `path` that lie wholly in written extents."""
    offsets = []
    for off, length in written_extents(path):
        first = (off + chunk - 1) // chunk * chunk
        offsets.extend(range(first, off + length - chunk + 1, chunk))
    return offsets


def raw_read(targets, qd, io_bytes=1 << 20, seconds=3.0, max_bytes=None, seed=1):
    """Random O_DIRECT reads from `targets` ([(path, [offsets])]) by `qd` threads until `seconds`
    passed or `max_bytes` were read. Returns (bytes read, seconds). Raises OSError (the first
    failed read) or ValueError when there is nothing to read."""
    pool = [(p, o) for p, offs in targets for o in offs]
    if not pool:
        raise ValueError("no written %d-byte chunks to read in %s" % (io_bytes,
                                                                       [p for p, _ in targets]))
    paths = sorted({p for p, _ in pool})
    done = [0] * qd
    errors = []
    lock = threading.Lock()
    budget = [max_bytes if max_bytes is not None else 1 << 62]
    stop_at = time.perf_counter() + seconds

    def worker(i):
        rng = random.Random(seed * 1000 + i)
        fds = {p: os.open(p, os.O_RDONLY | os.O_DIRECT) for p in paths}
        buf = mmap.mmap(-1, io_bytes)  # page-aligned, as O_DIRECT wants
        try:
            while not errors and time.perf_counter() < stop_at:
                with lock:
                    if budget[0] < io_bytes:
                        return
                    budget[0] -= io_bytes
                path, off = pool[rng.randrange(len(pool))]
                n = os.preadv(fds[path], [buf], off)
                if n != io_bytes:
                    raise OSError("short O_DIRECT read of %s at %d: %d of %d bytes" % (
                        path, off, n, io_bytes))
                done[i] += n
        except OSError as e:
            errors.append(e)
        finally:
            for fd in fds.values():
                os.close(fd)
            buf.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(qd)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(done), elapsed


def cpu_seconds(pid):
    """utime + stime of process `pid` (all its threads), seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ThrottleError(RuntimeError):
    pass


def block_device_of(path):
    """'MAJ:MIN' of the whole disk under `path` (a partition maps to its disk: io.max takes
    disks only)."""
    st = os.stat(path)
    dev = "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))
    sys_dir = "/sys/dev/block/" + dev
    if not os.path.exists(sys_dir):
        raise ThrottleError("%s is on device %s, which is no block device (%s missing: overlay "
                            "or network filesystem?)" % (path, dev, sys_dir))
    if os.path.exists(os.path.join(sys_dir, "partition")):
        with open(os.path.join(os.path.realpath(sys_dir), "..", "dev")) as f:
            return f.read().strip()
    return dev


def _mounts(fstype):
    with open("/proc/mounts") as f:
        return [line.split() for line in f if line.split()[2] == fstype]


def _write(path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise ThrottleError("writing %r to %s: %s" % (text, path, e.strerror or e)) from None


class IoThrottle:
    """A cgroup of its own for one process, capping its reads from one disk. apply() moves the
    process in and sets the cap; remove() moves it back to the cgroup's parent (when it still
    runs) and deletes the cgroup. Not thread-safe."""

    def __init__(self, name="tutti-throttle-%d" % os.getpid()):
        self.name = name
        self.dir = None
        self.method = None

    def apply(self, pid, path, read_bytes_per_sec):
        """Returns how (a sentence). Raises ThrottleError naming each way tried and why it
        failed."""
        dev = block_device_of(path)
        why = []
        for method in (self._v2, self._v1):
            try:
                self.method = method(pid, dev, int(read_bytes_per_sec))
                return self.method
            except ThrottleError as e:
                why.append(str(e))
                self.remove()
        raise ThrottleError("; ".join(why))

    def _v2(self, pid, dev, bps):
        mounts = _mounts("cgroup2")
        if not mounts:
            raise ThrottleError("cgroup v2: not mounted")
        root = mounts[0][1]
        with open(os.path.join(root, "cgroup.controllers")) as f:
            if "io" not in f.read().split():
                raise ThrottleError("cgroup v2 at %s: no io controller (it is on v1, or the "
                                    "kernel lacks it)" % root)
        with open(os.path.join(root, "cgroup.subtree_control")) as f:
            if "io" not in f.read().split():
                _write(os.path.join(root, "cgroup.subtree_control"), "+io")
        self._make(root)
        _write(os.path.join(self.dir, "cgroup.procs"), str(pid))
        _write(os.path.join(self.dir, "io.max"), "%s rbps=%d" % (dev, bps))
        with open(os.path.join(self.dir, "io.max")) as f:
            got = f.read().strip()
        if "rbps=%d" % bps not in got:
            raise ThrottleError("cgroup v2: io.max reads back %r" % got)
        return "cgroup v2 %s/io.max: %s" % (self.dir, got)

    def _v1(self, pid, dev, bps):
        mounts = [m for m in _mounts("cgroup") if "blkio" in m[3].split(",")]
        if not mounts:
            raise ThrottleError("cgroup v1: no blkio hierarchy mounted")
        self._make(mounts[0][1])
        knob = os.path.join(self.dir, "blkio.throttle.read_bps_device")
        _write(knob, "%s %d" % (dev, bps))
        _write(os.path.join(self.dir, "cgroup.procs"), str(pid))
        with open(knob) as f:
            got = f.read().strip()
        return "cgroup v1 %s: %s" % (knob, got)

    def _make(self, root):
        self.dir = os.path.join(root, self.name)
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as e:
            self.dir = None
            raise ThrottleError("mkdir %s/%s: %s" % (root, self.name, e.strerror)) from None

    def remove(self):
        if self.dir is None:
            return
        parent = os.path.join(os.path.dirname(self.dir), "cgroup.procs")
        try:
            with open(os.path.join(self.dir, "cgroup.procs")) as f:
                for pid in f.read().split():
                    try:
                        _write(parent, pid)
                    except ThrottleError:
                        pass
            os.rmdir(self.dir)
        except OSError:
            pass
        self.dir = None

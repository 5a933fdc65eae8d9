"""ssd_array: tuttid's SSD tier against the raw rate of an emulated NVMe array, in one run
(issue 20 section 3). Runs on the GPU machine; --local runs it here in host mode.

    python3 bench/ssd_array.py --tuttid BIN [--rawio CMD] [--configs tmpfs:1,...,loop:4]
                               [--parts array,dram,ttft] [--gib 8] [--label before] [--out FILE]

The array is built by the script, one configuration at a time:
  tmpfs:N  N directories on --base (/dev/shm: tmpfs, which takes O_DIRECT there), one per device.
  loop:N   N loop devices over tmpfs image files, each ext4-formatted and mounted, in a cgroup
           whose io.max caps each device at --io-cap-gbps (default 2.5) for reads and for writes
           (cgroup v2; v1 blkio throttling where v2 has no io controller). tuttid and the raw tool
           enter that cgroup before they start (a `sh -c 'echo $$ > cgroup.procs; exec ...'`
           wrapper), so every read and write of theirs is capped.
These are emulations: tmpfs and loop devices over RAM, not NVMe.

Parts:
  array  per configuration: (e) raw baseline (bench/raw_array_io: one io_uring and thread per file,
         O_DIRECT, --io-kib requests at --qd each, random offsets over --gib of files on the same
         devices, each run moving as many bytes as tuttid's transfer, repeated for at least
         --raw-min-seconds, the best counting; tmpfs reads alternate plain runs and --async runs,
         each read on an io_uring worker as tuttid reads tmpfs), write then read before tuttid,
         read then write after it; (a) tuttid with
         pool.dirs on the devices, DRAM tier off, state on tmpfs; (b) --sessions sessions with a
         Llama-3-8B-shaped KV cache (32 layers x K,V objects of 16 tokens x 8 heads x 128 dims
         bf16 = 32 KiB, 2 MiB a block) in GPU memory (--local: shared host memory), random
         content; --gib of blocks stored and made durable, timed, --store-rounds times (the
         first into the fresh pool, each later one the same blocks under new keys into the full
         pool, evicting; the figures are the last round's); (c) every layer of every block
         retrieved into other blocks of the same cache (calls of at most max_blocks_per_call
         blocks, one Retrieve per session at a time, sessions at once), --retrieve-rounds times,
         and every retrieved byte compared with the stored one (a checker self-test first proves
         a flipped byte is caught); (d) tuttid's CPU over each phase from /proc: CPU seconds per
         GB, the busiest thread's share of a core (io_uring's iou-* workers reported apart);
         (e) from tuttid's admin Stats, where the phase went: per retrieve round the serving
         threads' planning and posting, waiting for reads and checks, and handing layers to the
         engine ("lead"), per store where each Store call went ("captures") and the write
         pipeline's phases ("writes"); (f) raw reads while a pinned copy to the GPU runs beside
         them ("raw_beside_copy": both rates). tuttid runs with limits.retrieve_staging_bytes =
         --retrieve-staging-mib (1 GiB on the GPU).
  dram   once: the same store and retrieve with the DRAM tier on and big enough (reads served
         from DRAM), against the contiguous pinned host-to-GPU copy rate (torch, 1 GiB), also
         measured once per run whenever array or dram runs.
  share  per configuration: a small Retrieve (--share-small-blocks, every layer) timed alone, the
         large session's alone, then the small one again while the large one Retrieves over and
         over: ssd_array_share_small_vs_fair (its GB/s beside / the lower of its GB/s alone and
         half the large one's alone). Retrieves at once should take turns at the devices.
  ttft   Llama-3-8B shape (random weights, bf16), T = --ttft-tokens (32768), --ttft-share (0.98)
         of it cached, load-all, prefix on an --ttft-emulation:--ttft-devices (tmpfs:8) array:
         TTFT from the SSD tier (DRAM tier off), recompute-all, from the DRAM tier; against the
         pipeline's limit: the prefix's bytes at the raw read rate of the same array in this
         run plus one layer's compute of the new tokens (CUDA events).

Results: one JSON line per figure appended to --out (bench, metric, value = ratio = measured /
baseline, unit "ratio", baseline_name, baseline_value, measured_value, measured_unit, n_devices,
emulation, tuttid_gbps, baseline_gbps, raw_gbps, cpu_s_per_gb, busiest_thread {name, share},
iou_workers, raw_cpu_s_per_gb_before_after (the raw process's CPU, its io_uring workers
included), label, machine, date, command, note, and the parameters), and a table at the end.
Metrics: ssd_array_read_vs_raw (tuttid retrieve GB/s / min(raw read GB/s, pinned copy GB/s)),
ssd_array_store_vs_raw_write (store-to-durable GB/s / raw write GB/s), ssd_array_dram_vs_copy
(DRAM-tier retrieve / pinned copy), ssd_array_ttft_vs_recompute (SSD-tier TTFT / recompute-all),
ssd_array_ttft_vs_limit (SSD-tier TTFT / (prefix bytes at the raw read rate + one layer's
compute)), ssd_array_ttft_dram_vs_recompute. Raw rates are the mean of the best before and the
best after tuttid (on loop configurations, of one run of --raw-sustained-seconds each, where the
cap binds; the short runs' best stays as burst_gbps); tuttid's retrieve is the best of
--retrieve-rounds. On loop configurations the cgroup's
own I/O counters must show tuttid's reads and writes on the capped devices (else the run fails).

Everything made is torn down (tuttid stopped, mounts unmounted, loop devices detached, cgroup
removed, files deleted) on success, failure, SIGTERM/SIGINT and --watchdog; leftovers of an
earlier run that was killed (its pid gone) are removed at start. Exit status: 0, 1 when a part
failed (the reason is printed), 2 for a bad setup (named before anything is built).
"""

import argparse
import faulthandler
import json
import os
import platform
import random
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
E2E = os.path.join(REPO, "tests", "e2e")
sys.path.insert(0, E2E)
from mps_state import mps_running  # noqa: E402
# CUDA IPC exports cudaMalloc allocations; torch's expandable segments (cuMemCreate) have none.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")

GB = 1e9
GiB = 1 << 30
MiB = 1 << 20
PREFIX = "tutti-ssd-array-"
# Llama-3-8B's KV shape: 32 layers x (K, V), 16 tokens x 8 KV heads x 128 dims, bf16.
LAYERS, KV_HEADS, HEAD_DIM, BLOCK_TOKENS, DTYPE_BYTES = 32, 8, 128, 16, 2
OBJECT_BYTES = BLOCK_TOKENS * KV_HEADS * HEAD_DIM * DTYPE_BYTES  # 32 KiB
BLOCK_BYTES = 2 * LAYERS * OBJECT_BYTES                          # 2 MiB
SLOT_BYTES = BLOCK_BYTES + 8192                                  # a pool slot: objects + header


class BenchError(RuntimeError):
    """A step that failed, with what to do about it."""


class SetupError(BenchError):
    """The machine or the arguments cannot run this benchmark (exit 2)."""


def log(*a):
    print(*a, flush=True)


# --- teardown ----------------------------------------------------------------------------------

class Teardown:
    """A stack of undo steps. run_to(mark) undoes everything pushed after `mark`, newest first;
    a failing step is logged and the rest still run. Safe to call from a signal handler or the
    watchdog thread (each step runs once)."""

    def __init__(self):
        self._steps = []
        self._lock = threading.RLock()

    def push(self, what, fn):
        with self._lock:
            self._steps.append((what, fn))

    def mark(self):
        with self._lock:
            return len(self._steps)

    def run_to(self, mark=0):
        failed = []
        while True:
            with self._lock:
                if len(self._steps) <= mark:
                    break
                what, fn = self._steps.pop()
            try:
                fn()
            except Exception as e:  # keep undoing the rest
                failed.append(what)
                log("teardown: %s failed: %r" % (what, e))
        return failed


TEARDOWN = Teardown()
CHILDREN = set()  # raw tools running (the watchdog kills them before it tears down)


def kill_children():
    for p in list(CHILDREN):
        try:
            p.kill()
        except OSError:
            pass


def unmount(mnt):
    """Unmounts `mnt`, waiting a little for a process that still holds it; lazily at last."""
    for attempt in range(20):
        try:
            run_cmd(["umount", mnt], "umount " + mnt)
            return
        except BenchError as e:
            if "busy" not in str(e):
                raise
            time.sleep(0.25)
    log("umount %s: still busy after 5 s; unmounting lazily" % mnt)
    run_cmd(["umount", "-l", mnt], "umount -l " + mnt)


def run_cmd(cmd, what, timeout=600, check=True):
    """Runs `cmd` (a list); returns stdout. Raises BenchError with its stderr when it fails."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=timeout)
    except FileNotFoundError:
        raise BenchError("%s: %s not found" % (what, cmd[0])) from None
    except subprocess.TimeoutExpired:
        raise BenchError("%s: `%s` took more than %d s" % (what, shlex.join(cmd), timeout)) \
            from None
    if check and p.returncode != 0:
        raise BenchError("%s: `%s` exited %d: %s" % (what, shlex.join(cmd), p.returncode,
                                                     (p.stderr or p.stdout).strip()[-2000:]))
    return p.stdout


# --- leftovers of a killed run -----------------------------------------------------------------

def _pid_alive(pid):
    return os.path.exists("/proc/%d" % pid)


def _stale(text):
    """True if `text` names a PREFIX<pid> path whose pid is gone (and not us)."""
    for m in re.finditer(re.escape(PREFIX) + r"(\d+)", text):
        pid = int(m.group(1))
        if pid != os.getpid() and not _pid_alive(pid):
            return True
    return False


def clean_stale(base):
    """Removes what an earlier run of this script left when it was killed: its tuttids and raw
    tools, mounts, loop devices, cgroups and files (recognised by PREFIX<dead pid>)."""
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if pid != os.getpid() and PREFIX in cmdline and _stale(cmdline):
            log("stale: killing pid %d (%s)" % (pid, cmdline[:120]))
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    time.sleep(0.2)
    with open("/proc/mounts") as f:
        mounts = [line.split()[1] for line in f]
    for mnt in reversed(mounts):
        if PREFIX in mnt and _stale(mnt):
            log("stale: unmounting %s" % mnt)
            run_cmd(["umount", "-l", mnt], "unmount stale " + mnt, check=False)
    if shutil.which("losetup"):
        out = run_cmd(["losetup", "-a"], "losetup -a", check=False)
        for line in out.splitlines():
            if PREFIX in line and _stale(line):
                dev = line.split(":")[0]
                log("stale: detaching %s" % dev)
                run_cmd(["losetup", "-d", dev], "detach stale " + dev, check=False)
    for root in cgroup_roots():
        for name in os.listdir(root):
            if name.startswith(PREFIX) and _stale(name):
                log("stale: removing cgroup %s/%s" % (root, name))
                Cgroup.remove_dir(os.path.join(root, name))
    for d in (base, "/tmp"):
        for name in os.listdir(d):
            if name.startswith(PREFIX) and _stale(name):
                log("stale: removing %s/%s" % (d, name))
                shutil.rmtree(os.path.join(d, name), ignore_errors=True)


# --- cgroups -----------------------------------------------------------------------------------

def parse_cpus(text):
    """A CPU list as the kernel writes it ("0-3,8,10-11") as a set of ints; "" is empty."""
    cpus = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise SetupError("CPU list %r: %r is not N or N-M" % (text, part)) from None
        if a < 0 or b < a:
            raise SetupError("CPU list %r: %r is not a range" % (text, part))
        cpus.update(range(a, b + 1))
    return cpus


def cpu_list(cpus):
    """The kernel's form of a set of CPU numbers: "0-3,8"."""
    runs = []  # [first, last] of each run of consecutive CPUs
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join("%d-%d" % (a, b) if b > a else "%d" % a for a, b in runs)


def _mounts_of(fstype):
    with open("/proc/mounts") as f:
        return [line.split() for line in f if line.split()[2] == fstype]


def cgroup_roots():
    roots = [m[1] for m in _mounts_of("cgroup2")]
    roots += [m[1] for m in _mounts_of("cgroup") if "blkio" in m[3].split(",")]
    return [r for r in roots if os.path.isdir(r)]


def _write(path, text):
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        raise BenchError("writing %r to %s: %s" % (text, path, e.strerror or e)) from None


def _read(path):
    with open(path) as f:
        return f.read()


class Cgroup:
    """A cgroup capping read and write bytes/s per block device: v2 io.max, else v1 blkio
    throttling (io=False: v2 only, no cap, for limit_cpus alone). Processes enter it through
    wrap(cmd) before they exec."""

    def __init__(self, name, io=True):
        self.name = name
        self.dir = None
        self.how = None
        self.cpus = None
        self.io = io
        errors = []
        for make in ((lambda: self._make_v2(["io"]), self._make_v1) if io else
                     (lambda: self._make_v2([]),)):
            try:
                make()
                break
            except BenchError as e:
                errors.append(str(e))
        if self.dir is None:
            raise SetupError("no cgroup can %s here: %s" % ("cap I/O" if io else "be made",
                                                             "; ".join(errors)))
        TEARDOWN.push("remove cgroup " + self.dir, self.remove)

    def _make_v2(self, controllers):
        mounts = _mounts_of("cgroup2")
        if not mounts:
            raise BenchError("cgroup v2: not mounted")
        root = mounts[0][1]
        self._enable(root, controllers)
        self._mkdir(root)
        self.how = "v2"

    @staticmethod
    def _enable(root, controllers):
        for c in controllers:
            if c not in _read(os.path.join(root, "cgroup.controllers")).split():
                raise BenchError("cgroup v2 at %s: no %s controller in cgroup.controllers" % (
                    root, c))
            if c not in _read(os.path.join(root, "cgroup.subtree_control")).split():
                _write(os.path.join(root, "cgroup.subtree_control"), "+" + c)

    def limit_cpus(self, cpus):
        """Keeps this cgroup's processes on `cpus` (a set of CPU numbers), their io_uring
        workers too (a cgroup v2 cpuset holds them on every kernel; an affinity alone holds them
        only since Linux 6.2, which keeps a thread's requested affinity in the threads it makes)."""
        if self.how != "v2":
            raise SetupError("--tuttid-cpus needs cgroup v2 (cpuset); %s is v1" % self.dir)
        self._enable(os.path.dirname(self.dir), ["cpuset"])
        text = cpu_list(cpus)
        _write(os.path.join(self.dir, "cpuset.cpus"), text)
        got = parse_cpus(_read(os.path.join(self.dir, "cpuset.cpus.effective")).strip() or "")
        if got != set(cpus):
            raise BenchError("cgroup %s: cpuset.cpus.effective is %s, not %s" % (
                self.dir, cpu_list(got), text))
        self.cpus = set(cpus)

    def _make_v1(self):
        mounts = [m for m in _mounts_of("cgroup") if "blkio" in m[3].split(",")]
        if not mounts:
            raise BenchError("cgroup v1: no blkio hierarchy mounted")
        self._mkdir(mounts[0][1])
        if not os.path.exists(os.path.join(self.dir, "blkio.throttle.read_bps_device")):
            d, self.dir = self.dir, None
            os.rmdir(d)
            raise BenchError("cgroup v1 blkio: no throttle files (kernel without "
                             "CONFIG_BLK_DEV_THROTTLING)")
        self.how = "v1"

    def _mkdir(self, root):
        path = os.path.join(root, self.name)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise BenchError("mkdir %s: %s" % (path, e.strerror)) from None
        self.dir = path

    def cap(self, dev, bytes_per_sec):
        """Caps reads and writes of block device `dev` ("MAJ:MIN") at bytes_per_sec each and
        checks the kernel took it."""
        bps = int(bytes_per_sec)
        if self.how == "v2":
            _write(os.path.join(self.dir, "io.max"), "%s rbps=%d wbps=%d" % (dev, bps, bps))
            got = [l for l in _read(os.path.join(self.dir, "io.max")).splitlines()
                   if l.startswith(dev + " ")]
            if not got or "rbps=%d" % bps not in got[0] or "wbps=%d" % bps not in got[0]:
                raise BenchError("cgroup %s/io.max reads back %r for %s" % (self.dir, got, dev))
            return
        for knob in ("read", "write"):
            path = os.path.join(self.dir, "blkio.throttle.%s_bps_device" % knob)
            _write(path, "%s %d" % (dev, bps))
            if "%s %d" % (dev, bps) not in _read(path):
                raise BenchError("%s reads back %r" % (path, _read(path)))

    def io_bytes(self):
        """(read, written) bytes of this cgroup's processes on its capped devices so far."""
        rd = wr = 0
        if self.how == "v2":
            for line in _read(os.path.join(self.dir, "io.stat")).splitlines():
                kv = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
                rd += int(kv.get("rbytes", 0))
                wr += int(kv.get("wbytes", 0))
            return rd, wr
        for line in _read(os.path.join(self.dir, "blkio.throttle.io_service_bytes")).splitlines():
            f = line.split()
            if len(f) == 3 and f[1] == "Read":
                rd += int(f[2])
            elif len(f) == 3 and f[1] == "Write":
                wr += int(f[2])
        return rd, wr

    def describe(self):
        if not self.io:
            return "cgroup v2 %s" % self.dir + (
                " (cpuset %s)" % cpu_list(self.cpus) if self.cpus else "")
        return ("cgroup v2 %s/io.max" % self.dir if self.how == "v2"
                else "cgroup v1 %s blkio.throttle" % self.dir) + (
                    ", cpuset %s" % cpu_list(self.cpus) if self.cpus else "")

    def wrap(self, cmd):
        """`cmd` started inside this cgroup: the shell writes its pid, then execs cmd."""
        return ["sh", "-c", 'echo $$ > "$0" || exit 97; exec "$@"',
                os.path.join(self.dir, "cgroup.procs")] + list(cmd)

    def contains(self, pid):
        return str(pid) in _read(os.path.join(self.dir, "cgroup.procs")).split()

    @staticmethod
    def remove_dir(path):
        parent = os.path.join(os.path.dirname(path), "cgroup.procs")
        for attempt in range(50):
            try:
                for pid in _read(os.path.join(path, "cgroup.procs")).split():
                    try:
                        _write(parent, pid)
                    except BenchError:
                        pass
                os.rmdir(path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)  # a process still exiting keeps it busy
        os.rmdir(path)

    def remove(self):
        if self.dir is not None:
            Cgroup.remove_dir(self.dir)
            self.dir = None


# --- the emulated array ------------------------------------------------------------------------

class Array:
    """N devices: per device a pool directory for tuttid and a raw file for raw_array_io."""

    def __init__(self, emulation, n, roots, cgroup=None, devices=()):
        self.emulation, self.n, self.cgroup, self.devices = emulation, n, cgroup, list(devices)
        self.cpu_cgroup = None  # confine_cpus on an array without an I/O cap
        self.pool_dirs = [os.path.join(r, "pool") for r in roots]
        self.raw_files = [os.path.join(r, "raw", "raw.dat") for r in roots]
        for d in self.pool_dirs + [os.path.dirname(f) for f in self.raw_files]:
            os.makedirs(d, exist_ok=True)

    @property
    def name(self):
        return "%s:%d" % (self.emulation, self.n)

    def confine_cpus(self, cpus):
        """tuttid and the raw tool on `cpus` only (--tuttid-cpus), with their io_uring workers:
        the I/O cap's cgroup where there is one, else a cgroup of its own."""
        if self.cgroup is None:
            self.cpu_cgroup = Cgroup("%s%d-cpus-%s%d" % (PREFIX, os.getpid(), self.emulation,
                                                         self.n), io=False)
        self.process_cgroup().limit_cpus(cpus)

    def process_cgroup(self):
        """The cgroup tuttid and the raw tool run in, or None."""
        return self.cgroup if self.cgroup is not None else self.cpu_cgroup

    def wrap(self, cmd):
        cg = self.process_cgroup()
        return cg.wrap(cmd) if cg is not None else list(cmd)

    def describe(self):
        cg = self.process_cgroup()
        cpus = "; tuttid and raw reads on CPUs %s" % cpu_list(cg.cpus) if cg and cg.cpus else ""
        if self.emulation == "tmpfs":
            return "%d directories on tmpfs%s" % (self.n, cpus)
        return "%d loop devices over tmpfs files, ext4, %s%s" % (
            self.n, ("capped by " + self.cgroup.describe()) if self.cgroup else "no cap", cpus)


def takes_o_direct(d):
    probe = os.path.join(d, ".odirect-probe-%d" % os.getpid())
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    try:
        import mmap
        buf = mmap.mmap(-1, 4096)
        return os.pwrite(fd, buf, 0) == 4096
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(probe)


def make_root(base, name):
    path = os.path.join(base, "%s%d" % (PREFIX, os.getpid()), name)
    os.makedirs(path)
    TEARDOWN.push("remove " + path, lambda: shutil.rmtree(path))
    return path


WARM_MARK = "/tmp/%swarm" % PREFIX


def warm_guest_memory(args):
    """Touches --warm-gib GiB of memory through a file on --base, then deletes it; once per boot
    (WARM_MARK holds the boot id and the GiB touched). The GPU machines are virtual machines whose
    memory the host backs at a page's first touch: a fresh machine's first tuttid pool (fallocated,
    written first by the store) paid that in its stores (0.25-0.49 of raw writes in the first run
    of three fresh machines, 0.6-0.9 after, docs/gpu.md "Stop 57"), while the raw baseline writes
    files it filled first. Whether the pages freed here back later tmpfs files well enough to
    remove that is for the next fresh machine's first run to say (--warm-gib 0 turns it off). An
    SSD has no such cost."""
    want = int(args.warm_gib * GiB)
    if want <= 0:
        return
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    try:
        with open(WARM_MARK) as f:
            mark_boot, mark_bytes = f.read().split()
        if mark_boot == boot and int(mark_bytes) >= want:
            return
    except (OSError, ValueError):
        pass
    st = os.statvfs(args.base)
    want = min(want, int(st.f_bavail * st.f_frsize * 0.8))
    path = os.path.join(args.base, "%swarm-%d" % (PREFIX, os.getpid()))
    chunk = bytes(64 * MiB)
    t0 = time.perf_counter()
    try:
        with open(path, "wb") as f:
            for _ in range(want // len(chunk)):
                f.write(chunk)
    finally:
        os.unlink(path)
    with open(WARM_MARK, "w") as f:
        f.write("%s %d\n" % (boot, want))
    log("  warmed %.1f GiB of this machine's memory in %.1f s (a virtual machine's memory is "
        "backed at first touch; once per boot)" % (want / GiB, time.perf_counter() - t0))


def build_tmpfs_array(args, n):
    warm_guest_memory(args)
    root = make_root(args.base, "tmpfs%d" % n)
    array = Array("tmpfs", n, [os.path.join(root, "d%d" % i) for i in range(n)])
    if args.tuttid_cpus:
        array.confine_cpus(args.tuttid_cpus)
    return array


def build_loop_array(args, n, bytes_per_device):
    """N loop devices over image files on --base, ext4, mounted; capped through a cgroup."""
    warm_guest_memory(args)
    root = make_root(args.base, "loop%d" % n)
    mnt_root = os.path.join("/tmp", "%s%d" % (PREFIX, os.getpid()), "mnt-loop%d" % n)
    os.makedirs(mnt_root, exist_ok=True)
    TEARDOWN.push("remove " + mnt_root, lambda: shutil.rmtree(mnt_root, ignore_errors=True))
    cgroup = None
    if args.io_cap_gbps > 0:
        cgroup = Cgroup("%s%d-loop%d" % (PREFIX, os.getpid(), n))
    roots, devices = [], []
    image_bytes = (int(bytes_per_device * 1.05) + 512 * MiB) // MiB * MiB
    for i in range(n):
        img = os.path.join(root, "d%d.img" % i)
        with open(img, "wb") as f:
            f.truncate(image_bytes)
        dev = run_cmd(["losetup", "-f", "--show", img], "losetup of " + img).strip()
        TEARDOWN.push("detach " + dev, lambda dev=dev: run_cmd(["losetup", "-d", dev],
                                                               "losetup -d " + dev))
        run_cmd(["mkfs.ext4", "-q", "-F", "-T", "largefile", "-m", "0", "-E",
                 "lazy_itable_init=0,lazy_journal_init=0", dev], "mkfs.ext4 on " + dev)
        mnt = os.path.join(mnt_root, "d%d" % i)
        os.makedirs(mnt)
        run_cmd(["mount", "-o", "noatime", dev, mnt], "mount %s on %s" % (dev, mnt))
        TEARDOWN.push("unmount " + mnt, lambda mnt=mnt: unmount(mnt))
        rdev = os.stat(dev).st_rdev
        majmin = "%d:%d" % (os.major(rdev), os.minor(rdev))
        if cgroup is not None:
            cgroup.cap(majmin, args.io_cap_gbps * GB)
        devices.append((dev, majmin))
        roots.append(mnt)
        if not takes_o_direct(mnt):
            raise BenchError("%s (ext4 on %s) does not take O_DIRECT" % (mnt, dev))
    log("  %d loop devices of %.1f GiB: %s%s" % (n, image_bytes / GiB,
                                                 ", ".join("%s (%s)" % d for d in devices),
                                                 "; " + cgroup.describe() + " at %.2f GB/s "
                                                 "read and write each" % args.io_cap_gbps
                                                 if cgroup else "; no I/O cap"))
    array = Array("loop", n, roots, cgroup, devices)
    if args.tuttid_cpus:
        array.confine_cpus(args.tuttid_cpus)
    return array


# --- the raw baseline --------------------------------------------------------------------------

def run_rawio(args, array, op, span_bytes, volume, fill=False, buffer_bytes=0):
    """raw_array_io over the array's raw files; returns the best run's JSON object (with
    "runs_gbps"). Each run moves `volume` bytes, as tuttid's transfer does (a capped device's
    throttle lets a short burst through, alike for both), repeated until --raw-min-seconds have
    passed; or one run of --raw-seconds. Reads of a tmpfs array run both plainly and with
    --async (each read on an io_uring worker, as tuttid reads tmpfs), alternating, and the best
    of either counts ("runs_async" says which run was which)."""
    volume = max(volume, 64 * array.n * args.io_kib * 1024)  # at least 64 requests a file
    amount = ("--seconds=%g" % args.raw_seconds if args.raw_seconds > 0
              else "--bytes=%d" % volume)
    modes = [False, True] if op == "read" and array.emulation == "tmpfs" else [False]
    runs, spent = [], 0.0
    while len(runs) < len(modes) or (args.raw_seconds <= 0 and spent < args.raw_min_seconds and
                                     len(runs) < 50):
        out = raw_once(args, array, op, span_bytes, amount, fill and not runs,
                       modes[len(runs) % len(modes)], buffer_bytes)
        runs.append(out)
        spent += out["seconds"]
    best = max(runs, key=lambda r: r["gbps"])
    best["runs_gbps"] = [r["gbps"] for r in runs]
    best["runs_async"] = [r.get("async", False) for r in runs]
    log("  raw %-5s %s%s: %.3f GB/s%s, best of %d runs of %.2f GB (%.2f s in all; per file %s; "
        "%s CPU s/GB)" % (
            op, array.name, " (after a fill of %.1f s)" % runs[0]["fill_seconds"] if fill else "",
            best["gbps"], " (--async)" if best.get("async") else "", len(runs),
            best["bytes"] / GB, spent, best["per_file_gbps"], best["cpu_s_per_gb"]))
    if array.cgroup is None or args.raw_seconds > 0 or args.raw_sustained_seconds <= 0:
        return best
    # A capped device: the throttle lets a run that starts after a quiet spell through at up to
    # 1.3x its cap (blk-throttle's slice; loop:8 on the H200 machine, stop 37: 3.3 GB/s a
    # device after the fill, 2.5 right after tuttid's transfers), so the best of a few short
    # runs measures the throttle's slack more than the device. The baseline is one run long
    # enough for the cap to bind; the short runs stay as "burst_gbps" and "runs_gbps".
    sustained = raw_once(args, array, op, span_bytes,
                         "--seconds=%g" % args.raw_sustained_seconds, False, False, buffer_bytes)
    sustained.update(burst_gbps=best["gbps"], runs_gbps=best["runs_gbps"],
                     runs_async=best["runs_async"], fill_seconds=best.get("fill_seconds"))
    log("  raw %-5s %s: %.3f GB/s sustained over %.1f s (the baseline; short runs' best %.3f)" % (
        op, array.name, sustained["gbps"], sustained["seconds"], best["gbps"]))
    return sustained


def raw_beside_copy(args, array, span_bytes, volume):
    """Raw reads (the faster of plain and --async, as in run_rawio) while torch copies 256 MiB
    pinned buffers to the GPU without pause: what the host gives the two halves of a retrieve at
    once, since on tmpfs both draw on the same memory. {"raw_gbps", "copy_gbps"} (the copy's
    rate over the raw run's span), or None with --local."""
    if args.local:
        return None
    import threading
    import torch
    n = 256 << 20
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    host.fill_(1)
    stop, moved = threading.Event(), [0, 0.0]

    def copier():
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            t0 = time.perf_counter()
            while not stop.is_set():
                for _ in range(4):
                    dev.copy_(host, non_blocking=True)
                stream.synchronize()
                moved[0] += 4 * n
            moved[1] = time.perf_counter() - t0

    volume = max(volume, 64 * array.n * args.io_kib * 1024)
    best = None
    for async_reads in ([False, True] if array.emulation == "tmpfs" else [False]):
        moved[0], moved[1] = 0, 0.0
        stop.clear()
        th = threading.Thread(target=copier)
        th.start()
        try:
            time.sleep(0.2)
            out = raw_once(args, array, "read", span_bytes, "--bytes=%d" % volume, False,
                           async_reads)
        finally:
            stop.set()
            th.join()
        row = {"raw_gbps": out["gbps"], "async": async_reads,
               "copy_gbps": round(moved[0] / moved[1] / GB, 3) if moved[1] else 0.0}
        if best is None or row["raw_gbps"] > best["raw_gbps"]:
            best = row
    host = dev = None  # the closure holds them too: drop both before freeing
    free_device_memory()
    log("  raw read beside a pinned copy to the GPU: raw %.3f GB/s%s, copy %.3f GB/s" % (
        best["raw_gbps"], " (--async)" if best["async"] else "", best["copy_gbps"]))
    return best


def raw_gpu(args, array, op):
    """raw_gpu_io over the array's raw files: the least any mover between the array and GPU
    memory does (reads: each landed read copied to the GPU at once, its slot reused after the
    copy; writes: each slot copied from the GPU, then written; 2 x qd slots a file, the fastest
    setting on the H200). The best of two 2-second runs, or None without the binary (--local,
    or not built). Reads on tmpfs use --async (on io_uring's workers), as tuttid's do."""
    if not args.rawgpu_cmd:
        return None
    best = None
    for _ in range(2):
        cmd = array.wrap(args.rawgpu_cmd + [
            "--op=" + op, "--io_bytes=%d" % (args.io_kib * 1024), "--qd=%d" % args.qd,
            "--slots=%d" % (2 * args.qd), "--seconds=2"] +
            (["--async"] if op == "read" and array.emulation == "tmpfs" else []) +
            array.raw_files)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise BenchError("raw_gpu_io exited %d: %s\ncommand: %s" % (
                p.returncode, p.stderr.strip()[-2000:], shlex.join(cmd)))
        out = json.loads(p.stdout.strip().splitlines()[-1])
        if best is None or out["gbps"] > best["gbps"]:
            best = out
    log("  raw %s %s the GPU %s: %.3f GB/s (each request copied %s the GPU; %d slots a file)" % (
        op, "to" if op == "read" else "from", array.name, best["gbps"],
        "to" if op == "read" else "from", best["slots"]))
    return best


def cold_buffer_bytes(args, n):
    """Each file's share of tuttid's retrieve staging, in whole requests (at least qd of them)."""
    io = args.io_kib * 1024
    staging = (args.retrieve_staging_mib or 256) << 20
    return max(args.qd, staging // n // io) * io


def raw_once(args, array, op, span_bytes, amount, fill, async_reads=False, buffer_bytes=0):
    cmd = array.wrap(args.rawio_cmd + [
        "--op=" + op, "--io_bytes=%d" % (args.io_kib * 1024), "--qd=%d" % args.qd,
        amount, "--span_bytes=%d" % span_bytes,
        "--seed=%d" % random.randrange(1, 1 << 30)] + (["--fill"] if fill else []) +
        (["--async"] if async_reads else []) +
        (["--buffer_bytes=%d" % buffer_bytes] if buffer_bytes else []) + array.raw_files)
    # The raw process's CPU, its io_uring workers' included (threads of it): what tuttid's
    # CPU s/GB is set against. Children reaped meanwhile would count too; none run beside it.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    CHILDREN.add(p)
    try:
        stdout, stderr = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise BenchError("raw_array_io %s ran past 600 s: %s" % (op, shlex.join(cmd))) from None
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        CHILDREN.discard(p)
    if p.returncode == 97:
        raise BenchError("raw_array_io: could not enter %s" % array.process_cgroup().describe())
    if p.returncode != 0:
        raise BenchError("raw_array_io %s exited %d: %s\ncommand: %s" % (
            op, p.returncode, stderr.strip()[-2000:], shlex.join(cmd)))
    try:
        out = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BenchError("raw_array_io printed no JSON: %r" % stdout[-500:]) from None
    if out.get("files") != array.n or not out.get("gbps", 0) > 0:
        raise BenchError("raw_array_io: unexpected answer %s" % out)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["cpu_s"] = round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 3)
    # (A run that fills the files first spent CPU on that too: no figure.)
    out["cpu_s_per_gb"] = (round(out["cpu_s"] / (out["bytes"] / GB), 4)
                           if out["bytes"] and not fill else None)
    return out


# --- tuttid ------------------------------------------------------------------------------------

def parse_sets(items):
    """--set key.path=value -> [(["key", "path"], value text)]."""
    out = []
    for item in items:
        if "=" not in item:
            raise SetupError("--set %r: want key.path=value (e.g. datapath.checksum_threads=4)"
                             % item)
        key, value = item.split("=", 1)
        if not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*", key):
            raise SetupError("--set %r: %r is not a field path" % (item, key))
        out.append((key.split("."), value))
    return out


def tuttid_settings(args):
    """The lines' tuttid_set: the --set items, and --ring-nice where given."""
    return args.set + (["ring_nice=%d" % args.ring_nice] if args.ring_nice else [])


def config_value(text):
    """A text-proto value: numbers, true/false and quoted strings as given, else quoted."""
    if re.fullmatch(r"-?[0-9][0-9.eE+\-]*|true|false|\".*\"", text):
        return text
    return json.dumps(text)


def apply_sets(cfg, sets):
    for path, value in sets:
        node = cfg
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SetupError("--set %s: %s is not a message" % (".".join(path), part))
        if isinstance(node.get(path[-1]), (dict, list)):
            raise SetupError("--set %s: a message or repeated field; set its fields"
                             % ".".join(path))
        node[path[-1]] = config_value(value)
    return cfg


def render_config(cfg, indent=""):
    """Text format of a nested dict: each message field once (tuttid rejects repeats)."""
    lines = []
    for key, value in cfg.items():
        if isinstance(value, dict):
            lines.append("%s%s {" % (indent, key))
            lines.append(render_config(value, indent + "  "))
            lines.append("%s}" % indent)
        elif isinstance(value, list):
            lines.extend("%s%s: %s" % (indent, key, config_value(str(v))) for v in value)
        else:
            lines.append("%s%s: %s" % (indent, key, value if isinstance(value, str)
                                       else json.dumps(value)))
    return "\n".join(lines)


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def io_series(daemon):
    """{name: {labels: value}} of tuttid's tutti_io_* series (its metrics endpoint), or {} when
    the endpoint is off or does not answer."""
    import urllib.request
    listen = json.loads(daemon.cfg.get("metrics", {}).get("listen", '"off"'))
    if listen in ("", "off"):
        return {}
    try:
        text = urllib.request.urlopen("http://%s/metrics" % listen, timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r'^(tutti_io_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$', line)
        if m:
            out.setdefault(m.group(1), {})[m.group(2) or ""] = float(m.group(3))
    return out


def read_emission_ms(io0, io1):
    """The mean time (ms) the I/O scheduler's read emissions took from the backend's start to
    their completion (tutti_io_latency_seconds, every device), between two io_series() readings:
    the device's part of a batch's reads, its wait in the scheduler excluded. None without the
    endpoint or reads."""
    def delta(name):
        return sum(v - io0.get(name, {}).get(k, 0) for k, v in io1.get(name, {}).items()
                   if 'op="read"' in k)
    if not io0 or not io1:
        return None
    count = delta("tutti_io_latency_seconds_count")
    return round(1e3 * delta("tutti_io_latency_seconds_sum") / count, 3) if count else None


def request_figures(io0, io1, op):
    """The requests of `op` ("read" or "write") a phase handed the backend and their mean size,
    from two io_series() readings, or None where the endpoint is off."""
    if not io0 or not io1:
        return None
    def delta(name):
        labels = '{op="%s"}' % op
        return io1.get(name, {}).get(labels, 0) - io0.get(name, {}).get(labels, 0)
    reqs = delta("tutti_io_requests_total")
    nbytes = delta("tutti_io_bytes_total")
    return {"requests": int(reqs), "mean_kib": round(nbytes / reqs / 1024, 1) if reqs else 0}


def write_io_figures(io0, io1):
    """The writes a phase handed the backend (request_figures) and the write windows at its end
    (per device, and how often they were cut in it), from two io_series() readings."""
    figures = request_figures(io0, io1, "write")
    if figures is None:
        return None
    windows = io1.get("tutti_io_write_window_bytes", {})
    cuts = io1.get("tutti_io_write_window_cuts_total", {})
    figures.update({"window_mib_at_end": [round(v / MiB, 1) for v in windows.values()],
                    "window_cuts": int(sum(cuts.values()) - sum(
                        io0.get("tutti_io_write_window_cuts_total", {}).values()))})
    return figures


def uring_depth(io0, io1):
    """The uring backend's io_uring_enter calls between two io_series() readings and the mean
    requests in flight at each (tutti_io_uring_*): whether the devices were kept busy. None where
    the endpoint is off or another backend ran."""
    if not io0 or not io1 or "tutti_io_uring_enter_calls_total" not in io1:
        return None
    def delta(name):
        return sum(io1.get(name, {}).values()) - sum(io0.get(name, {}).values())
    calls = delta("tutti_io_uring_enter_calls_total")
    return {"enter_calls": int(calls),
            "mean_in_flight": round(delta("tutti_io_uring_in_flight_at_enter_total") / calls, 2)
            if calls else None}


def device_balance(io0, io1, op):
    """GB each pool device took for `op` ("read" or "write") between two io_series() readings
    (tutti_io_device_bytes_total), and the least over the most: 1.0 is an even spread. None where
    the endpoint is off or this tuttid does not count bytes per device."""
    if not io0 or not io1 or "tutti_io_device_bytes_total" not in io1:
        return None
    before, after = io0.get("tutti_io_device_bytes_total", {}), io1["tutti_io_device_bytes_total"]
    per = {}
    for labels, value in after.items():
        dev = re.search(r'device="([^"]*)"', labels)
        if dev and ('op="%s"' % op) in labels:
            per[int(dev.group(1))] = (value - before.get(labels, 0)) / GB
    if not per:
        return None
    gbs = [round(per[d], 3) for d in sorted(per)]
    most = max(gbs)
    return {"gb": gbs, "least_over_most": round(min(gbs) / most, 3) if most > 0 else None}


def tuttid_config(args, array, root, socket_path, capacity, dram):
    cfg = {
        "state_dir": json.dumps(os.path.join(root, "state")),
        "listen": {"socket_path": json.dumps(socket_path), "socket_mode": 384},
        # On a free loopback port: the store's write figures read the I/O scheduler's series.
        "metrics": {"listen": json.dumps("127.0.0.1:%d" % free_port())},
        "pool": {"dirs": array.pool_dirs, "capacity_bytes": int(capacity),
                 "object_bytes": OBJECT_BYTES, "max_objects": 2 * LAYERS},
        "dram": {"capacity_bytes": int(dram)},
        "gpu": {"mode": '"host"' if args.local else '"cuda"'},
        # The raw baseline's queue depth per file (the issue: same request size and queue depth);
        # --set io.queue_depth=N overrides it.
        "io": {"queue_depth": args.qd},
    }
    if args.retrieve_staging_mib > 0:  # --set limits.retrieve_staging_bytes=N overrides it
        cfg["limits"] = {"retrieve_staging_bytes": args.retrieve_staging_mib << 20}
    return apply_sets(cfg, args.sets)


class Daemon:
    """One tuttid: its config, process (inside the array's cgroup), socket and log."""

    def __init__(self, args, array, cfg_fn, name):
        self.args, self.array = args, array
        self.root = make_root(args.base, name)
        os.makedirs(os.path.join(self.root, "state"))
        sock_dir = os.path.join("/tmp", "%s%d" % (PREFIX, os.getpid()), name)
        os.makedirs(sock_dir)
        TEARDOWN.push("remove " + sock_dir, lambda: shutil.rmtree(sock_dir, ignore_errors=True))
        self.socket = os.path.join(sock_dir, "tuttid.sock")
        self.admin_socket = self.socket + ".admin"
        self.cfg = cfg_fn(self.root, self.socket)
        self.config_path = os.path.join(self.root, "tuttid.textproto")
        self.log_path = os.path.join(self.root, "tuttid.log")
        self.proc = None
        self.pid = None
        TEARDOWN.push("stop tuttid " + name, self.stop)

    def set_dram(self, capacity):
        self.cfg["dram"]["capacity_bytes"] = int(capacity)

    def start(self, timeout=300.0):
        if self.proc is not None:
            raise BenchError("tuttid already runs")
        with open(self.config_path, "w") as f:
            f.write(render_config(self.cfg) + "\n")
        with open(self.log_path, "ab") as logf:
            cmd = self.array.wrap(self.args.tuttid_cmd + ["--config=" + self.config_path])
            self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                code, self.proc = self.proc.returncode, None
                raise BenchError("tuttid exited %d during start-up%s; config %s:\n%s\nlog:\n%s" % (
                    code, " (could not enter the cgroup)" if code == 97 else "",
                    self.config_path, render_config(self.cfg), self.log_tail()))
            if self._answers():
                break
            if time.monotonic() > deadline:
                self.stop()
                raise BenchError("tuttid did not answer on %s within %.0f s:\n%s" % (
                    self.socket, timeout, self.log_tail()))
            time.sleep(0.05)
        self.pid = self._find_tuttid(self.proc.pid)
        cg = self.array.process_cgroup()
        if cg is not None and not cg.contains(self.pid):
            raise BenchError("tuttid (pid %d) is not in %s" % (self.pid, cg.describe()))
        if self.args.ring_nice:
            self._renice_rings(self.args.ring_nice)
        return self

    def _renice_rings(self, nice):
        """--ring-nice: every ring owner thread of tuttid to `nice` (their io_uring workers,
        started later, inherit it); BenchError if it finds none."""
        tids = []
        for tid in os.listdir("/proc/%d/task" % self.pid):
            try:
                comm = _read("/proc/%d/task/%s/comm" % (self.pid, tid)).strip()
            except OSError:
                continue
            if comm.startswith(("tutti-uring-", "tutti-urd-")):
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
                tids.append(int(tid))
        if not tids:
            raise BenchError("--ring-nice: no ring owner thread (tutti-uring-*) in tuttid %d"
                             % self.pid)
        log("tuttid: %d ring owner threads reniced to %d" % (len(tids), nice))

    def _answers(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    @staticmethod
    def _find_tuttid(pid):
        """The tuttid process: `pid` itself when the wrappers exec'd, else its descendant."""
        todo = [pid]
        while todo:
            p = todo.pop(0)
            try:
                if _read("/proc/%d/comm" % p).strip() == "tuttid":
                    return p
                kids = _read("/proc/%d/task/%d/children" % (p, p)).split()
            except OSError:
                continue
            todo.extend(int(k) for k in kids)
        raise BenchError("no process named tuttid under pid %d (a wrapper that does not exec?)"
                         % pid)

    def stop(self, timeout=60.0):
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log("tuttid did not stop within %.0f s of SIGTERM: killed" % timeout)
            self.proc.kill()
            code = self.proc.wait()
        self.proc = self.pid = None
        return code

    def log_tail(self, n=4000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stats(self):
        import admin_stats
        return admin_stats.stats(self.admin_socket)

    def set_log_level(self, subsystem, level):
        import admin_stats
        admin_stats.set_log_level(self.admin_socket, subsystem, level)


# --- tuttid's CPU ------------------------------------------------------------------------------

def _machine_ticks():
    """(busy, all) CPU ticks of the whole machine from /proc/stat (idle and iowait not busy)."""
    fields = [int(x) for x in _read("/proc/stat").split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # guest time is already in user
    return total - fields[3] - fields[4], total


def _stat_fields(stat_text):
    """(comm, the fields after it: state first) from a /proc/.../stat line."""
    head, rest = stat_text.rsplit(")", 1)
    return head.split("(", 1)[1], rest.split()


def _ticks_of(stat_text):
    """(comm, utime + stime ticks) from a /proc/.../stat line."""
    comm, fields = _stat_fields(stat_text)
    return comm, int(fields[11]) + int(fields[12])


class CpuSampler:
    """tuttid's CPU over one phase: the process's utime + stime delta (exited threads included),
    and each thread's delta (sampled every `period` s, so threads that exit mid-phase count with
    their last sample; a thread born in the phase counts from zero). With `worker_period` (s) it
    also counts, that often, how many io_uring workers are runnable (state R): on tmpfs, how many
    reads or writes are being copied at once (bench/worker_sampler.h says why)."""

    def __init__(self, pid, period=0.2, worker_period=0.0):
        self.pid, self.period, self.worker_period = pid, period, worker_period
        self.tck = os.sysconf("SC_CLK_TCK")
        self.first, self.last = {}, {}
        self._halt = threading.Event()
        self._thread = None
        self._worker_thread = None
        self.runnable = []  # per worker sample: io_uring workers in state R
        self._iou_stats = []  # the stat files of the io_uring workers the last _sample saw

    def _sample(self, initial=False):
        task_dir = "/proc/%d/task" % self.pid
        iou = []
        for tid in os.listdir(task_dir):
            path = os.path.join(task_dir, tid, "stat")
            try:
                comm, ticks = _ticks_of(_read(path))
            except (OSError, IndexError, ValueError):
                continue
            self.first.setdefault(tid, (comm, ticks if initial else 0))
            self.last[tid] = (comm, ticks)
            if comm.startswith("iou-"):
                iou.append(path)
        self._iou_stats = iou

    def _process_ticks(self):
        return _ticks_of(_read("/proc/%d/stat" % self.pid))[1]

    def start(self):
        self.t0 = time.monotonic()
        self.p0 = self._process_ticks()
        self.m0 = _machine_ticks()
        self._sample(initial=True)
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()
        if self.worker_period > 0:
            self._worker_thread = threading.Thread(target=self._run_workers,
                                                   name="worker-sampler", daemon=True)
            self._worker_thread.start()
        return self

    def _run_workers(self):
        """Counts runnable io_uring workers every worker_period, over the workers the CPU
        sampler last listed (every `period`), so a sample reads only their stat files."""
        while not self._halt.wait(self.worker_period):
            r = 0
            for path in self._iou_stats:
                try:
                    r += _stat_fields(_read(path))[1][0] == "R"
                except (OSError, IndexError, ValueError):
                    continue
            self.runnable.append(r)

    def _run(self):
        while not self._halt.wait(self.period):
            try:
                self._sample()
            except OSError:
                return

    def stop(self, gbytes):
        """A dict of the phase's CPU figures for `gbytes` GB moved."""
        self._halt.set()
        self._thread.join()
        if self._worker_thread is not None:
            self._worker_thread.join()
        self._sample()
        wall = time.monotonic() - self.t0
        total = (self._process_ticks() - self.p0) / self.tck
        m1 = _machine_ticks()
        ncpu = os.cpu_count()
        # /proc/stat counts every CPU's ticks: its busy share times the CPUs is the busy cores.
        busy = ncpu * (m1[0] - self.m0[0]) / max(1, m1[1] - self.m0[1])
        threads = []
        for tid, (comm, ticks) in self.last.items():
            delta = (ticks - self.first[tid][1]) / self.tck
            threads.append((delta / wall, comm, tid))
        threads.sort(reverse=True)
        own = [t for t in threads if not t[1].startswith("iou-")]
        iou = [t for t in threads if t[1].startswith("iou-")]
        busiest = own[0] if own else (0.0, "none", "0")
        iou_s = sum(t[0] for t in iou) * wall
        return {
            "wall_s": wall, "cpu_s": total, "cpu_s_per_gb": total / gbytes if gbytes else None,
            "cpu_s_per_gb_without_iou": (total - iou_s) / gbytes if gbytes else None,
            "cores": total / wall, "threads": len(threads),
            "busiest_thread": {"name": busiest[1], "share": round(busiest[0], 3)},
            "top_threads": [{"name": c, "share": round(s, 3)} for s, c, _ in own[:5]],
            "iou_workers": dict(
                {"threads": len(iou), "cores": round(sum(t[0] for t in iou), 3),
                 "busiest_share": round(iou[0][0], 3) if iou else 0.0},
                **({"runnable_mean": round(sum(self.runnable) / len(self.runnable), 2),
                    "runnable_max": max(self.runnable), "runnable_samples": len(self.runnable)}
                   if self.runnable else {})),
            # The whole machine over the phase: tmpfs reads and writes are memory copies on its
            # CPUs, so where it is busy throughout, the CPUs bound the rate, not tuttid's design.
            "machine_cpu": {"cpus": ncpu, "busy_cores": round(busy, 2),
                            "outside_tuttid_cores": round(max(0.0, busy - total / wall), 2)},
        }


# --- the engine side ---------------------------------------------------------------------------

class Session:
    """One attached engine: a Llama-3-8B-shaped byte cache [layers, 2, 2n, object_bytes] (GPU or
    shared host memory) whose blocks [0, n) hold random content stored under `keys`, retrieved
    into blocks [n, 2n)."""

    def __init__(self, args, daemon, index, n):
        self.call_times = []  # per Retrieve call: (Lookup s, Retrieve s), client side
        import torch
        import tutti
        self.n, self.index, self.local = n, index, args.local
        self.torch = torch
        layout = tutti.KvLayout(num_layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                                dtype_bytes=DTYPE_BYTES, block_tokens=BLOCK_TOKENS)
        ns = tutti.Namespace("ssd-array-bench-llama3-8b-shape", layout)
        shape = (LAYERS, 2, 2 * n, OBJECT_BYTES)
        self.shm = None
        if args.local:
            self.shm = tutti.SharedMemory(tutti.cache_bytes(layout, 2 * n), "ssd-array")
            numel = LAYERS * 2 * 2 * n * OBJECT_BYTES
            self.cache = torch.frombuffer(self.shm.buffer, dtype=torch.uint8,
                                          count=numel).view(shape)
            self.stream = None
        else:
            self.cache = torch.empty(shape, dtype=torch.uint8, device="cuda")
            self.stream = torch.cuda.Stream()
        gen = torch.Generator(device=self.cache.device)
        gen.manual_seed(1000 + index)
        for layer in range(LAYERS):
            self.cache[layer, :, :n].random_(0, 256, generator=gen)
        objects = tutti.objects_from_tensors(layout, [self.cache[l] for l in range(LAYERS)])
        engine_id = "ssd-array-%d" % index
        if args.local:
            self.client = tutti.Client.attach(ns, 2 * n, objects,
                                              host_regions=[self.shm.region()],
                                              socket_path=daemon.socket, engine_id=engine_id)
        else:
            self.client = tutti.Client.attach(ns, 2 * n, objects, cuda_device=0,
                                              socket_path=daemon.socket, engine_id=engine_id)
        # A random parent: keys of no other session or run (tuttid must store every block).
        self.keys = tutti.chain_keys(range(n * BLOCK_TOKENS), BLOCK_TOKENS,
                                     parent=os.urandom(16))

    def rekey(self):
        """New keys for the same blocks: the next store() stores every block again."""
        import tutti
        self.keys = tutti.chain_keys(range(self.n * BLOCK_TOKENS), BLOCK_TOKENS,
                                     parent=os.urandom(16))

    def sync(self):
        if not self.local:
            self.torch.cuda.synchronize()

    def store(self, batch, wait_durable, deadline, staging_wait_ms=0):
        """Stores every block (retrying rejected_full until `deadline`). Counts the Store calls,
        the blocks refused for full staging and the seconds slept before retrying them in
        self.store_counts."""
        counts = self.store_counts = {"calls": 0, "rejected_full_blocks": 0, "retry_sleep_s": 0.0,
                                      "call_s": 0.0}
        for begin in range(0, self.n, batch):
            todo = list(range(begin, min(self.n, begin + batch)))
            while todo:
                t = time.perf_counter()
                out = self.client.store([self.keys[i] for i in todo], todo,
                                        wait_durable=wait_durable,
                                        staging_wait_ms=staging_wait_ms)
                counts["call_s"] += time.perf_counter() - t
                counts["calls"] += 1
                bad = sorted({o for o in out if o not in ("captured", "durable",
                                                          "rejected_full")})
                if bad:
                    raise BenchError("session %d: Store answered %s (%s)" % (
                        self.index, bad, out.rejected_why))
                if wait_durable and "captured" in out:
                    raise BenchError("Store with wait_durable answered captured")
                todo = [i for i, o in zip(todo, out) if o == "rejected_full"]
                if todo:
                    counts["rejected_full_blocks"] += len(todo)
                    if time.monotonic() > deadline:
                        raise BenchError("session %d: Stores stayed rejected_full (%s)" % (
                            self.index, out.rejected_why))
                    if staging_wait_ms == 0:  # else tuttid waited for room already
                        t = time.perf_counter()
                        time.sleep(0.002)
                        counts["retry_sleep_s"] += time.perf_counter() - t

    def retrieve(self, call_blocks):
        """Every layer of every block into blocks [n, 2n), in calls of call_blocks."""
        for begin in range(0, self.n, call_blocks):
            keys = self.keys[begin:begin + call_blocks]
            t0 = time.perf_counter()
            lease = self.client.lookup(keys)
            t1 = time.perf_counter()
            if lease.hits != len(keys):
                raise BenchError("session %d: Lookup found %d of %d stored blocks" % (
                    self.index, lease.hits, len(keys)))
            r = self.client.retrieve(lease, keys, [self.n + begin + i for i in range(len(keys))])
            if self.stream is not None:
                for layer in range(LAYERS):
                    r.wait_layer(layer, self.stream)
            out = r.wait()
            self.call_times.append((t1 - t0, time.perf_counter() - t1))
            if not out.ok or out.failed:
                raise BenchError("session %d: Retrieve: %s %s, %d blocks failed" % (
                    self.index, out.code, out.message, len(out.failed)))
        if self.stream is not None:
            self.stream.synchronize()

    def clear_destination(self):
        self.cache[:, :, self.n:].zero_()

    def mismatches(self, limit=5):
        """[(layer, block)] where the retrieved copy differs from the stored block (first few)."""
        bad = []
        for layer in range(LAYERS):
            src, dst = self.cache[layer, :, :self.n], self.cache[layer, :, self.n:]
            if self.torch.equal(src, dst):
                continue
            diff = (src != dst).any(dim=2).any(dim=0).nonzero().flatten().tolist()
            bad.extend((layer, b) for b in diff[:limit])
            if len(bad) >= limit:
                break
        return bad[:limit]

    def close(self):
        try:
            self.client.detach()
        finally:
            self.cache = None
            if self.shm is not None:
                import gc
                gc.collect()  # the tensors over the mapping go before it is unmapped
                self.shm.close()


def in_threads(fn, items):
    """fn(item) for every item, each on its own thread; re-raises the first failure."""
    errors = []

    def run(item):
        try:
            fn(item)
        except BaseException as e:  # noqa: B036 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def wait_durable_all(daemon, stored_before, blocks, timeout):
    """Polls admin Stats until `blocks` more blocks are durable and the write backlog is empty."""
    deadline = time.monotonic() + timeout
    while True:
        s = daemon.stats()
        if (s.get("blocks_stored", 0) - stored_before >= blocks and
                s.get("write_backlog_bytes", 0) == 0):
            return
        if time.monotonic() > deadline:
            raise BenchError("not durable within %.0f s: blocks_stored +%d of %d, backlog %d "
                             "bytes" % (timeout, s.get("blocks_stored", 0) - stored_before,
                                        blocks, s.get("write_backlog_bytes", 0)))
        time.sleep(0.005)


def phase_store(args, daemon, sessions):
    """Stores every session's blocks at once; (GB/s, seconds, CPU figures)."""
    blocks = sum(s.n for s in sessions)
    st0 = daemon.stats()
    series0 = io_series(daemon)
    before = st0.get("blocks_stored", 0)
    for s in sessions:
        s.sync()
    io0 = daemon.array.cgroup.io_bytes() if daemon.array.cgroup else None
    cpu = CpuSampler(daemon.pid, worker_period=args.worker_sample_ms / 1000).start()
    t0 = time.perf_counter()
    deadline = time.monotonic() + args.phase_timeout
    in_threads(lambda s: s.store(args.store_batch, args.store_wait == "durable", deadline,
                                 args.store_staging_wait_ms), sessions)
    wait_durable_all(daemon, before, blocks, max(deadline - time.monotonic(), 1))
    seconds = time.perf_counter() - t0
    gbytes = blocks * BLOCK_BYTES / GB
    figures = cpu.stop(gbytes)
    st1 = daemon.stats()
    d = lambda k: st1.get(k, 0) - st0.get(k, 0)
    # Where the write pipeline's batches spent the phase (admin Stats write_*).
    figures["writes"] = {"batches": d("write_batches"), "phase_s": round(seconds, 4),
                         "prepare_s": round(d("write_prepare_seconds"), 4),
                         "slots_s": round(d("write_slot_seconds"), 4),
                         "checksums_s": round(d("write_checksum_seconds"), 4),
                         # Objects whose checksum came with the gather (GPU) or the writer's.
                         "objects_summed_at_gather": d("write_objects_summed_at_gather"),
                         "objects_summed_by_writer": d("write_objects_summed_by_writer"),
                         "io_s": round(d("write_io_seconds"), 4),
                         "commit_s": round(d("write_commit_seconds"), 4),
                         # Commits (each of the batches written by then) and their pool syncs.
                         "commits": d("write_commits"),
                         "commit_sync_s": round(d("write_commit_sync_seconds"), 4)}
    # Where each Store call's time went: the client's whole call, tuttid's part until captured,
    # of which waiting for staging room and the gather from the engine (admin Stats capture_*).
    calls = sum(s.store_counts["calls"] for s in sessions)
    per_call = lambda v: round(1000 * v / max(calls, 1), 3)
    figures["captures"] = {"calls": calls,
                           "client_call_ms": per_call(sum(s.store_counts["call_s"]
                                                          for s in sessions)),
                           "tuttid_ms": per_call(d("capture_seconds")),
                           "staging_wait_ms": per_call(d("capture_wait_seconds")),
                           "gather_ms": per_call(d("capture_gather_seconds")),
                           "tuttid_captures": d("captures")}
    # The writes themselves: how many, how large, and the windows that held them.
    series1 = io_series(daemon)
    figures["write_io"] = write_io_figures(series0, series1)
    figures["device_balance"] = device_balance(series0, series1, "write")
    # How much of the phase the clients spent refused for full staging, waiting to retry.
    figures["store_calls"] = calls
    figures["store_rejected_full_blocks"] = sum(
        s.store_counts["rejected_full_blocks"] for s in sessions)
    figures["store_retry_sleep_s"] = round(
        sum(s.store_counts["retry_sleep_s"] for s in sessions), 4)
    if io0 is not None:
        figures["cgroup_write_gb"] = (daemon.array.cgroup.io_bytes()[1] - io0[1]) / GB
        if figures["cgroup_write_gb"] < 0.9 * gbytes:
            raise BenchError("the cgroup counted %.3f GB written on its devices during a store "
                             "of %.3f GB: tuttid's writes escape the cap" % (
                                 figures["cgroup_write_gb"], gbytes))
    return gbytes / seconds, seconds, figures


def lead_split(st0, st1, seconds):
    """Where the threads leading the retrieve's SSD-tier layers spent the phase (admin Stats
    read_lead_*): seconds waiting for a layer's reads and checks, seconds handing layers to the
    engine, per layer (ms), and each as a share of the phase's wall time summed over leaders; and
    what the waiting was made of (read_batch_*): per batch of reads (one device each), ms waiting
    for a bounce slot, from the scheduler to the reads' completion, and in the verifier."""
    d = lambda k: st1.get(k, 0) - st0.get(k, 0)
    wait, sink, layers = d("read_lead_wait_seconds"), d("read_lead_sink_seconds"), d("read_layers")
    calls, call_s, post = d("read_calls"), d("read_call_seconds"), d("read_lead_post_seconds")
    batches = d("read_batches")
    per_batch = lambda k: round(1e3 * d(k) / batches, 3) if batches else None
    return {"batches": batches, "batch_slot_ms": per_batch("read_batch_slot_seconds"),
            "batch_io_ms": per_batch("read_batch_io_seconds"),
            "batch_check_ms": per_batch("read_batch_check_seconds"),
            # Of batch_check_ms: until the verifier gave the batch's bounce slot back.
            "batch_release_ms": per_batch("read_batch_release_seconds"),
            # Of that, with copies on arrival (gpu_check_arrival_*): per batch copied, ms from
            # its arrival to its copies enqueued, and from then to its slot back; and batches a
            # group (copied together, given back together).
            "arrival_pickup_ms": per_arrival(st0, st1, "gpu_check_arrival_pickup_seconds"),
            "arrival_copy_release_ms": per_arrival(st0, st1,
                                                   "gpu_check_arrival_copy_release_seconds"),
            "arrivals_a_group": (round(d("gpu_check_arrivals") / d("gpu_check_arrival_groups"), 2)
                                 if d("gpu_check_arrival_groups") else None),
            "reads": calls, "read_s": round(call_s, 4), "phase_s": round(seconds, 4),
            "post_s": round(post, 4),"wait_s": round(wait, 4), "sink_s": round(sink, 4), "layers": layers,
            "wait_ms_per_layer": round(1e3 * wait / layers, 3) if layers else None,
            "sink_ms_per_layer": round(1e3 * sink / layers, 3) if layers else None,
            "wait_share": round(wait / (wait + sink), 3) if wait + sink > 0 else None}


def per_arrival(st0, st1, key):
    """ms of admin Stats `key` per batch copied on arrival between two snapshots (None: none)."""
    n = st1.get("gpu_check_arrivals", 0) - st0.get("gpu_check_arrivals", 0)
    return round(1e3 * (st1.get(key, 0) - st0.get(key, 0)) / n, 3) if n else None


def phase_retrieve(args, daemon, sessions, call_blocks):
    """One round: every block's every layer retrieved, verified; (GB/s, seconds, CPU)."""
    for s in sessions:
        s.clear_destination()
        s.sync()
        s.call_times = []
    st0 = daemon.stats()
    series0 = io_series(daemon)
    io0 = daemon.array.cgroup.io_bytes() if daemon.array.cgroup else None
    cpu = CpuSampler(daemon.pid, worker_period=args.worker_sample_ms / 1000).start()
    t0 = time.perf_counter()
    in_threads(lambda s: s.retrieve(call_blocks), sessions)
    for s in sessions:
        s.sync()
    seconds = time.perf_counter() - t0
    gbytes = sum(s.n for s in sessions) * BLOCK_BYTES / GB
    figures = cpu.stop(gbytes)
    st1 = daemon.stats()
    figures["dram_hits"] = st1.get("dram_hits", 0) - st0.get("dram_hits", 0)
    series1 = io_series(daemon)
    figures["device_balance"] = device_balance(series0, series1, "read")
    figures["uring"] = uring_depth(series0, series1)
    figures["read_io"] = request_figures(series0, series1, "read")
    figures["lead"] = lead_split(st0, st1, seconds)
    times = [t for s in sessions for t in s.call_times]
    figures["lead"]["client_lookup_s"] = round(sum(t[0] for t in times), 4)
    figures["lead"]["client_retrieve_s"] = round(sum(t[1] for t in times), 4)
    if io0 is not None:
        figures["cgroup_read_gb"] = (daemon.array.cgroup.io_bytes()[0] - io0[0]) / GB
        if figures["cgroup_read_gb"] < 0.9 * gbytes:
            raise BenchError("the cgroup counted %.3f GB read on its devices during a retrieve "
                             "of %.3f GB: tuttid's reads escape the cap" % (
                                 figures["cgroup_read_gb"], gbytes))
    verify(sessions)
    return gbytes / seconds, seconds, figures


def verify(sessions):
    for s in sessions:
        bad = s.mismatches()
        if bad:
            raise BenchError("session %d: retrieved content differs from what was stored at "
                             "(layer, block) %s" % (s.index, bad))


def checker_self_test(sessions):
    """A flipped byte in a retrieved (and verified) block must be caught: the check is not
    vacuous."""
    s = sessions[0]
    where = (LAYERS - 1, 1, 2 * s.n - 1, OBJECT_BYTES - 1)
    old = int(s.cache[where])
    s.cache[where] = (old + 1) % 256
    bad = s.mismatches()
    s.cache[where] = old
    if bad != [(LAYERS - 1, s.n - 1)]:
        raise BenchError("the content check missed a flipped byte (found %s)" % bad)


def plan(args, blocks, sessions):
    """(blocks per session, pool capacity bytes, Retrieve call size)."""
    per = blocks // sessions
    if per < 1:
        raise SetupError("--gib %.3f gives %d blocks, fewer than --sessions %d" % (
            args.gib, blocks, sessions))
    call = min(args.call_blocks or args.max_blocks_per_call, per)
    # Room for every block (no eviction) plus headroom, and for the pins of one call per
    # session within a user's share of the pool (limits.max_pinned_pool_share_per_user 0.5).
    slots = max(int(1.25 * per * sessions), int(sessions * call / 0.45)) + 64
    return per, slots * SLOT_BYTES + 256 * MiB, call


def open_sessions(args, daemon, n_sessions, per):
    out = []
    try:
        for i in range(n_sessions):
            out.append(Session(args, daemon, i, per))
    except BaseException:
        close_sessions(out)
        raise
    return out


def close_sessions(sessions):
    for s in sessions:
        try:
            s.close()
        except Exception as e:
            log("detach failed: %r" % e)
    sessions.clear()
    free_device_memory()


def free_device_memory():
    import gc
    gc.collect()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def store_and_retrieve(args, array, name, dram):
    """tuttid on `array` (DRAM tier `dram` bytes, 0: off): store --gib of blocks, then
    --retrieve-rounds retrieves, each verified. Returns the figures."""
    blocks = int(args.gib * GiB) // BLOCK_BYTES
    per, capacity, call = plan(args, blocks, args.sessions)
    check_room(args.base, capacity, "tuttid's pool on " + array.name)
    dram_bytes = int(1.25 * per * args.sessions * BLOCK_BYTES) + 256 * MiB if dram else 0
    daemon = Daemon(args, array, lambda root, sock: tuttid_config(
        args, array, root, sock, capacity, dram_bytes), name)
    t0 = time.perf_counter()
    daemon.start()
    log("  tuttid pid %d up in %.1f s (pool %.2f GiB on %s, DRAM tier %s)" % (
        daemon.pid, time.perf_counter() - t0, capacity / GiB, array.name,
        "%.2f GiB" % (dram_bytes / GiB) if dram_bytes else "off"))
    sessions = []
    try:
        sessions = open_sessions(args, daemon, args.sessions, per)
        mbpc = sessions[0].client.info["max_blocks_per_call"]
        call = min(call, mbpc)
        # Round 1 fills a fresh pool; each later round stores the same blocks under new keys
        # into the full pool, which evicts the oldest blocks first (a cache's steady state). Not
        # until round 3 does every write land on a slot written before (the pool has a quarter
        # more slots than blocks): on loop devices a first write to a block of a sparse image file
        # also allocates its tmpfs page, which no SSD does and the raw runs (over files filled
        # first) never pay. The figures are the last round's; every round's rate is kept.
        store_rounds = []
        for r in range(args.store_rounds):
            if r > 0:
                for s in sessions:
                    s.rekey()
            store_gbps, store_s, store_cpu = phase_store(args, daemon, sessions)
            store_rounds.append(store_gbps)
            log("  store round %d (%s pool): %d blocks (%.2f GiB) in %.2f s: %.3f GB/s; tuttid "
                "%.2f cores, %.3f CPU s/GB, busiest thread %s; iou-wrk %s; Store calls %s; "
                "write pipeline %s; writes %s; GB per device %s" % (
                    r + 1, "fresh" if r == 0 else "full", per * args.sessions,
                    per * args.sessions * BLOCK_BYTES / GiB, store_s, store_gbps,
                    store_cpu["cores"], store_cpu["cpu_s_per_gb"], store_cpu["busiest_thread"],
                    store_cpu["iou_workers"], store_cpu["captures"], store_cpu["writes"],
                    store_cpu["write_io"],
                    store_cpu["device_balance"]))
        rounds = []
        for r in range(args.retrieve_rounds):
            gbps, secs, cpu = phase_retrieve(args, daemon, sessions, call)
            if r == 0:
                checker_self_test(sessions)
            rounds.append((gbps, secs, cpu))
            log("  retrieve round %d: %.2f s, %.3f GB/s (calls of %d blocks, %d session%s), "
                "verified; tuttid %.2f cores, %.3f CPU s/GB, busiest thread %s; iou-wrk %s; "
                "DRAM hits %d; leading threads %s; GB per device %s; machine CPU %s" % (
                    r + 1, secs, gbps, call, args.sessions, "s" if args.sessions > 1 else "",
                    cpu["cores"], cpu["cpu_s_per_gb"], cpu["busiest_thread"],
                    cpu["iou_workers"], cpu["dram_hits"], cpu["lead"],
                    cpu["device_balance"], cpu["machine_cpu"]) +
                ("; the cgroup read %.3f GB" % cpu["cgroup_read_gb"]
                 if "cgroup_read_gb" in cpu else ""))
            if dram and cpu["dram_hits"] == 0:
                log("  WARNING: no DRAM hits in a DRAM-tier retrieve (admin Stats dram_hits)")
            if not dram and cpu["dram_hits"] > 0:
                raise BenchError("the DRAM tier is off but Stats counted %d DRAM hits" %
                                 cpu["dram_hits"])
    finally:
        close_sessions(sessions)
        code = daemon.stop()
        if code not in (0, None):
            log("  tuttid exited %s on SIGTERM; log tail:\n%s" % (code, daemon.log_tail()))
    best = max(rounds, key=lambda x: x[0])
    return {
        "blocks": per * args.sessions, "call_blocks": call, "sessions": args.sessions,
        "store_gbps": store_gbps, "store_s": store_s, "store_cpu": store_cpu,
        "store_rounds_gbps": [round(x, 3) for x in store_rounds],
        "retrieve_gbps": best[0], "retrieve_rounds_gbps": [round(x[0], 3) for x in rounds],
        "retrieve_cpu": best[2], "capacity": capacity, "dram_bytes": dram_bytes,
    }


def check_room(base, need, what):
    st = os.statvfs(base)
    free = st.f_bavail * st.f_frsize
    if free < need * 1.02:
        raise BenchError("%s needs %.2f GiB on %s, %.2f GiB free" % (what, need / GiB, base,
                                                                   free / GiB))


# --- reference: contiguous copies --------------------------------------------------------------

def measure_copy(args):
    """{"h2d": GB/s, "d2h": GB/s} of 1 GiB copies between pinned host and GPU memory, best of 5
    (--local: a host-to-host copy, both directions the same figure)."""
    import torch
    n = GiB
    best = {"h2d": 0.0, "d2h": 0.0}
    if args.local:
        a, b = torch.empty(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
        a.fill_(1)
        for _ in range(4):
            t0 = time.perf_counter()
            b.copy_(a)
            best["h2d"] = max(best["h2d"], n / (time.perf_counter() - t0) / GB)
        best["d2h"] = best["h2d"]
        del a, b
    else:
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        host.fill_(1)
        for name, (dst, src) in (("h2d", (dev, host)), ("d2h", (host, dev))):
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            for _ in range(5):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                e0.record()
                dst.copy_(src, non_blocking=True)
                e1.record()
                e1.synchronize()
                best[name] = max(best[name], n / (e0.elapsed_time(e1) / 1e3) / GB)
        del host, dev
    free_device_memory()
    log("contiguous copy of 1 GiB (%s): %.2f GB/s to the %s, %.2f GB/s back" % (
        "host to host: --local" if args.local else "pinned host <-> GPU, torch",
        best["h2d"], "copy" if args.local else "GPU", best["d2h"]))
    return best


# --- results -----------------------------------------------------------------------------------

class Results:
    """Appends each figure to --out as it is measured; keeps the rows for the table."""

    def __init__(self, args, machine, command):
        self.path, self.machine, self.command, self.label = (args.out, machine, command,
                                                             args.label)
        self.rows = []
        self.table_rows = []

    def add(self, metric, measured, baseline_name, baseline, unit, **fields):
        """One figure: value = ratio = measured / baseline (tuttid against what the devices or
        the recompute give in the same run); both sides are kept, in `unit`, as
        measured_value and baseline_value."""
        ratio = measured / baseline
        line = {"bench": "ssd_array", "metric": metric, "value": _round(ratio, 4),
                "unit": "ratio", "baseline_name": baseline_name,
                "baseline_value": _round(baseline, 4), "measured_value": _round(measured, 4),
                "measured_unit": unit, "ratio": _round(ratio, 4)}
        line.update({k: _round(v, 4) for k, v in fields.items()})
        line.update({"label": self.label, "machine": self.machine,
                     "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "command": self.command})
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
        self.rows.append(line)
        log("  -> %s = %.4f (%.3f %s against %s %.3f)" % (metric, ratio, measured, unit,
                                                          baseline_name, baseline))

    def table(self):
        log("")
        log("ssd_array (%s%s); GB/s unless named; emulated devices, not NVMe" % (
            self.machine, ", label " + self.label if self.label else ""))
        cols = ("config", "raw rd", "raw wr", "copy", "retrieve", "rd/base", "rd>gpu", "store",
                "st/wr", "gpu>wr", "cpu s/GB r|s", "busiest thread r | s (share)",
                "iou-wrk r|s cores")
        fmt = "%-8s %7s %7s %6s %8s %7s %6s %6s %6s %6s %12s %-40s %s"
        log(fmt % cols)
        for r in self.table_rows:
            log(fmt % r)
        ttft = [x for x in self.rows if x["metric"].startswith("ssd_array_ttft")]
        for x in ttft:
            log("%-34s %9.2f %s against %-34s %9.2f %s: %.4f" % (
                x["metric"], x["measured_value"], x["measured_unit"], x["baseline_name"],
                x["baseline_value"], x["measured_unit"], x["ratio"]))
        for x in self.rows:
            if x["metric"] == "ssd_array_engine_beside_retrieve":
                split = ""
                own, turn = x["engine_op_ms"], x["engine_turnaround_ms"]
                if None not in own + turn:
                    split = "; per op during vs alone: own %+.3f ms, host turnaround %+.3f ms" % (
                        own[1] - (own[0] + own[2]) / 2, turn[1] - (turn[0] + turn[2]) / 2)
                log("engine beside retrieve (MPS %s): loss %.2f%%, tuttid %.2f GB/s during vs "
                    "%.2f alone%s" % ("on" if x["mps"] else "off", 100 * x["engine_loss"],
                                      x["tuttid_gbps_during"], x["tuttid_gbps_alone"], split))
        log("results appended to %s" % self.path)


def _round(x, digits=3):
    if isinstance(x, float):
        return None if x != x else round(x, digits)
    if isinstance(x, dict):
        return {k: _round(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v, digits) for v in x]
    return x


# --- parts -------------------------------------------------------------------------------------

def parse_configs(text):
    out = []
    for item in text.split(","):
        m = re.fullmatch(r"(tmpfs|loop):([1-9][0-9]?)", item.strip())
        if not m:
            raise SetupError("--configs item %r: want tmpfs:N or loop:N" % item)
        out.append((m.group(1), int(m.group(2))))
    return out


def raw_amount(args, array=None):
    if args.raw_seconds > 0:
        return "one run of %g s each" % args.raw_seconds
    if array is not None and array.cgroup is not None and args.raw_sustained_seconds > 0:
        return ("each one run of %g s, where the cap binds (burst_gbps: the best of runs of as "
                "many bytes as tuttid moved, after a quiet spell)" % args.raw_sustained_seconds)
    return ("each the best of runs of as many bytes as tuttid moved, repeated for %g s" %
            args.raw_min_seconds)


def raw_span(args, n):
    """Bytes of each raw file: the blocks' bytes spread over the devices, at least 64 requests."""
    per = int(args.gib * GiB) // n
    io = args.io_kib * 1024
    return max(per // io * io, 64 * io)


def each_config(args, part, one):
    """one(emulation, n) for every configuration in turn, each torn down after it; one that fails
    is reported and the next one runs."""
    failed = []
    for emulation, n in args.configs:
        name = "%s:%d" % (emulation, n)
        log("=== %s %s" % (part, name))
        mark = TEARDOWN.mark()
        try:
            one(emulation, n)
        except SystemExit:
            raise
        except BaseException as e:
            if not isinstance(e, BenchError):
                traceback.print_exc()
            log("=== %s %s FAILED: %s" % (part, name, e))
            failed.append(name)
        finally:
            undone = TEARDOWN.run_to(mark)
            if undone:
                raise BenchError("teardown of %s failed (%s); stopping before the next "
                                 "configuration" % (name, undone))
    if failed:
        raise BenchError("configurations failed: %s" % ", ".join(failed))


def build_array(args, emulation, n, per_device, what):
    """The array of a configuration, once there is room for `per_device` bytes on each device."""
    check_room(args.base, per_device * n * (1.1 if emulation == "loop" else 1.0), what)
    array = (build_tmpfs_array(args, n) if emulation == "tmpfs"
             else build_loop_array(args, n, per_device))
    log("  %s" % array.describe())
    return array


def part_array(args, results, ctx):
    each_config(args, "array",
                lambda emulation, n: one_array_config(args, results, ctx, emulation, n))


def one_array_config(args, results, ctx, emulation, n):
    span = raw_span(args, n)
    blocks = int(args.gib * GiB) // BLOCK_BYTES
    _, capacity, _ = plan(args, blocks, args.sessions)
    array = build_array(args, emulation, n, capacity / n + span,
                        "%s:%d (pool and raw files)" % (emulation, n))
    volume = blocks * BLOCK_BYTES
    w0 = run_rawio(args, array, "write", span, volume, fill=True)
    r0 = run_rawio(args, array, "read", span, volume)
    t = store_and_retrieve(args, array, "tuttid-%s%d" % (emulation, n), dram=False)
    r1 = run_rawio(args, array, "read", span, volume)
    # For reference, not the baseline: the same reads (and below, writes) with buffers as large as
    # tuttid's retrieve staging (split over the files), as a consumer must keep its data until
    # the copy to the GPU; the raw runs reuse qd requests' buffers, largely cache-resident (on
    # tmpfs a read or write is a memory copy, so that matters there).
    cold = run_rawio(args, array, "read", span, volume, buffer_bytes=cold_buffer_bytes(args, n))
    beside = raw_beside_copy(args, array, span, volume)
    to_gpu = raw_gpu(args, array, "read")
    from_gpu = raw_gpu(args, array, "write")
    w1 = run_rawio(args, array, "write", span, volume)
    cold_w = run_rawio(args, array, "write", span, volume, buffer_bytes=cold_buffer_bytes(args, n))
    raw_read = (r0["gbps"] + r1["gbps"]) / 2
    raw_write = (w0["gbps"] + w1["gbps"]) / 2
    copy = ctx["copy"]["h2d"]
    baseline = min(raw_read, copy)
    common = dict(n_devices=n, emulation=emulation, sessions=t["sessions"],
                  blocks=t["blocks"], block_bytes=BLOCK_BYTES, object_bytes=OBJECT_BYTES,
                  io_bytes=args.io_kib * 1024, queue_depth=args.qd,
                  io_cap_gbps=args.io_cap_gbps if emulation == "loop" else None,
                  tuttid_set=tuttid_settings(args), retrieve_staging_mib=args.retrieve_staging_mib,
                  array=array.describe())
    rc, sc = t["retrieve_cpu"], t["store_cpu"]
    results.add(
        "ssd_array_read_vs_raw", t["retrieve_gbps"], "min(raw_read, pinned_copy)", baseline,
        "GB/s",
        tuttid_gbps=t["retrieve_gbps"], baseline_gbps=baseline, raw_gbps=raw_read,
        raw_gbps_before_after=[r0["gbps"], r1["gbps"]],
        raw_runs_gbps=[r0["runs_gbps"], r1["runs_gbps"]], copy_gbps=copy,
        raw_staging_sized_gbps=cold["gbps"], raw_staging_sized_buffer_bytes=cold["buffer_bytes"],
        raw_iou_workers_max=max(r0.get("iou_workers_max", 0), r1.get("iou_workers_max", 0)),
        raw_runs_async=[r0["runs_async"], r1["runs_async"]],
        raw_cpu_s_per_gb_before_after=[r0["cpu_s_per_gb"], r1["cpu_s_per_gb"]],
        retrieve_rounds_gbps=t["retrieve_rounds_gbps"], call_blocks=t["call_blocks"],
        cpu_s_per_gb=rc["cpu_s_per_gb"], cpu_s_per_gb_without_iou=rc["cpu_s_per_gb_without_iou"],
        cores=rc["cores"], busiest_thread=rc["busiest_thread"], top_threads=rc["top_threads"],
        iou_workers=rc["iou_workers"], machine_cpu=rc["machine_cpu"],
        cgroup_read_gb=rc.get("cgroup_read_gb"), lead=rc.get("lead"),
        device_balance=rc.get("device_balance"), uring=rc.get("uring"), read_io=rc.get("read_io"),
        raw_beside_copy=beside,
        raw_to_gpu_gbps=to_gpu["gbps"] if to_gpu else None,
        # What the minimal reader into the GPU reaches of this baseline, in the same run: on
        # tmpfs its reads and its copies share host memory, which neither half of the baseline
        # pays alone, so this is about as high as the ratio above can go there.
        raw_to_gpu_vs_baseline=round(to_gpu["gbps"] / baseline, 4) if to_gpu else None, **common,
        note="tuttid: best of %d SSD-tier Retrieves (DRAM tier off) of every layer of %d "
             "blocks into other blocks of the %s cache, every byte verified; raw: mean of "
             "raw_array_io random reads right before and after tuttid (%s); baseline: the "
             "lower of raw and the contiguous %s copy" % (
                 args.retrieve_rounds, t["blocks"], "host (--local)" if args.local else "GPU",
                 raw_amount(args, array), "host-to-host (--local)" if args.local
                 else "pinned host-to-GPU"))
    if to_gpu:
        # For reference beside the acceptance's baseline: where every read is a CPU copy
        # (tmpfs), reading and moving the data to the GPU costs host memory bandwidth that
        # neither raw reads nor the contiguous copy pay alone.
        results.add(
            "ssd_array_read_vs_raw_to_gpu", t["retrieve_gbps"], "raw_gpu_io_read",
            to_gpu["gbps"], "GB/s", tuttid_gbps=t["retrieve_gbps"], raw_to_gpu=to_gpu,
            **common, note="baseline: raw_gpu_io --op=read, the same random reads each copied "
                           "to the GPU at once (no checks, no layout), best of two runs")
    if from_gpu:
        results.add(
            "ssd_array_store_vs_raw_from_gpu", t["store_gbps"], "raw_gpu_io_write",
            from_gpu["gbps"], "GB/s", tuttid_gbps=t["store_gbps"], raw_from_gpu=from_gpu,
            **common, note="baseline: raw_gpu_io --op=write, random writes of slots each "
                           "copied from the GPU first (no checksums, no journal), best of two")
    results.add(
        "ssd_array_store_vs_raw_write", t["store_gbps"], "raw_write", raw_write, "GB/s",
        tuttid_gbps=t["store_gbps"], baseline_gbps=raw_write, raw_gbps=raw_write,
        raw_gbps_before_after=[w0["gbps"], w1["gbps"]],
        raw_runs_gbps=[w0["runs_gbps"], w1["runs_gbps"]], store_wait=args.store_wait,
        raw_staging_sized_gbps=cold_w["gbps"], raw_staging_sized_buffer_bytes=cold_w["buffer_bytes"],
        raw_iou_workers_max=max(w0.get("iou_workers_max", 0), w1.get("iou_workers_max", 0)),
        raw_cpu_s_per_gb_before_after=[w0["cpu_s_per_gb"], w1["cpu_s_per_gb"]],
        store_rounds_gbps=t["store_rounds_gbps"],
        pool_state="fresh" if len(t["store_rounds_gbps"]) == 1 else "full, evicting",
        store_batch=args.store_batch, cpu_s_per_gb=sc["cpu_s_per_gb"],
        cpu_s_per_gb_without_iou=sc["cpu_s_per_gb_without_iou"], cores=sc["cores"],
        busiest_thread=sc["busiest_thread"], top_threads=sc["top_threads"],
        machine_cpu=sc.get("machine_cpu"),
        iou_workers=sc["iou_workers"], cgroup_write_gb=sc.get("cgroup_write_gb"),
        store_staging_wait_ms=args.store_staging_wait_ms, store_calls=sc["store_calls"], store_rejected_full_blocks=sc["store_rejected_full_blocks"],
        store_retry_sleep_s=sc["store_retry_sleep_s"], writes=sc.get("writes"),
        captures=sc.get("captures"),
        write_io=sc.get("write_io"), device_balance=sc.get("device_balance"), **common,
        note="tuttid: Stores of %d blocks (batches of %d, %s) until every block is durable "
             "(admin Stats blocks_stored and an empty write backlog), %s; raw: mean of "
             "raw_array_io random writes (fdatasync at the end) over files filled first, right "
             "before and after tuttid (%s)" % (
                 t["blocks"], args.store_batch, "wait_durable" if args.store_wait == "durable"
                 else "no wait_durable, rejected_full retried",
                 "into a fresh pool" if len(t["store_rounds_gbps"]) == 1 else
                 "the last of %d rounds, each after the first into the full pool under new "
                 "keys (evicting); store_rounds_gbps[0] filled the fresh pool" %
                 len(t["store_rounds_gbps"]), raw_amount(args, array)))
    bt = lambda c: "%s %.2f" % (c["busiest_thread"]["name"], c["busiest_thread"]["share"])
    results.table_rows.append((
        "%s:%d" % (emulation, n), "%.2f" % raw_read, "%.2f" % raw_write, "%.1f" % copy,
        "%.2f" % t["retrieve_gbps"], "%.3f" % (t["retrieve_gbps"] / baseline),
        "%.2f" % to_gpu["gbps"] if to_gpu else "-", "%.2f" % t["store_gbps"],
        "%.3f" % (t["store_gbps"] / raw_write), "%.2f" % from_gpu["gbps"] if from_gpu else "-",
        "%.2f|%.2f" % (rc["cpu_s_per_gb"], sc["cpu_s_per_gb"]), bt(rc) + " | " + bt(sc),
        "%.2f|%.2f" % (rc["iou_workers"]["cores"], sc["iou_workers"]["cores"])))


def part_dram(args, results, ctx):
    log("=== dram: the DRAM tier (reference)")
    mark = TEARDOWN.mark()
    try:
        array = build_tmpfs_array(args, 1)
        t = store_and_retrieve(args, array, "tuttid-dram", dram=True)
    finally:
        TEARDOWN.run_to(mark)
    copy = ctx["copy"]["h2d"]
    rc = t["retrieve_cpu"]
    results.add(
        "ssd_array_dram_vs_copy", t["retrieve_gbps"], "pinned_copy" if not args.local
        else "host_copy", copy, "GB/s", n_devices=1, emulation="dram",
        tuttid_gbps=t["retrieve_gbps"], baseline_gbps=copy, raw_gbps=None,
        retrieve_rounds_gbps=t["retrieve_rounds_gbps"], cpu_s_per_gb=rc["cpu_s_per_gb"],
        busiest_thread=rc["busiest_thread"], top_threads=rc["top_threads"],
        iou_workers=rc["iou_workers"], dram_hits=rc["dram_hits"], sessions=t["sessions"],
        blocks=t["blocks"], tuttid_set=tuttid_settings(args),
        retrieve_staging_mib=args.retrieve_staging_mib,
        note="tuttid with the DRAM tier on (%.2f GiB) and the pool on one tmpfs directory: best "
             "of %d Retrieves of every layer of %d blocks, verified, against one contiguous "
             "1 GiB copy" % (t["dram_bytes"] / GiB, args.retrieve_rounds, t["blocks"]))
    bt = "%s %.2f" % (rc["busiest_thread"]["name"], rc["busiest_thread"]["share"])
    results.table_rows.append(("dram", "-", "-", "%.1f" % copy, "%.2f" % t["retrieve_gbps"],
                               "%.3f" % (t["retrieve_gbps"] / copy), "-",
                               "%.2f" % t["store_gbps"], "-", "-", "%.2f|-" % rc["cpu_s_per_gb"], bt, "-"))


# --- share ---------------------------------------------------------------------------------------

def _quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def part_share(args, results, ctx):
    """Per configuration: a small Retrieve (--share-small-blocks, every layer, as a new request's
    prefix) beside a large one that keeps the array busy, against each alone."""
    each_config(args, "share", lambda emulation, n: one_share_config(args, results, emulation, n))


def one_share_config(args, results, emulation, n):
    small_n = args.share_small_blocks
    big_n = int(args.gib * GiB) // BLOCK_BYTES - small_n
    if big_n < small_n:
        raise SetupError("--gib %.3f leaves no large session beside %d small blocks" % (
            args.gib, small_n))
    _, capacity, call = plan(args, big_n + small_n, 2)
    array = build_array(args, emulation, n, capacity / n, "share %s:%d" % (emulation, n))
    daemon = Daemon(args, array, lambda root, sock: tuttid_config(
        args, array, root, sock, capacity, 0), "tuttid-share-%s%d" % (emulation, n))
    daemon.start()
    sessions = []
    try:
        big = Session(args, daemon, 0, big_n)
        sessions.append(big)
        small = Session(args, daemon, 1, small_n)
        sessions.append(small)
        call = min(call, big.client.info["max_blocks_per_call"])
        phase_store(args, daemon, sessions)

        def small_calls(count):
            small.call_times = []
            for _ in range(count):
                small.retrieve(small_n)
            return [t[1] for t in small.call_times]

        def big_round():
            t0 = time.perf_counter()
            big.retrieve(call)
            return big_n * BLOCK_BYTES / GB / (time.perf_counter() - t0)

        big_round()  # warm-up: the first reads after the stores
        big_alone = max(big_round(), big_round())
        small_calls(2)
        # Each Read's own split (its debug line): where the small one's time goes, alone and
        # beside. The logger exists once the first Read has run.
        daemon.set_log_level("datapath", "debug")
        log_from = os.path.getsize(daemon.log_path)
        io_from = io_series(daemon)
        alone = small_calls(args.share_small_calls)
        log_beside = os.path.getsize(daemon.log_path)
        io_beside = io_series(daemon)
        stop = threading.Event()
        big_bytes, beside = [0], []

        def big_loop():
            while not stop.is_set():
                big.retrieve(call)
                big_bytes[0] += big_n * BLOCK_BYTES

        def small_beside():
            try:
                time.sleep(args.share_lead_s)  # the large one's reads queued first
                beside.extend(small_calls(args.share_small_calls))
            finally:
                stop.set()

        t0 = time.perf_counter()
        in_threads(lambda fn: fn(), [big_loop, small_beside])
        big_beside = big_bytes[0] / GB / (time.perf_counter() - t0)
        io_to = io_series(daemon)
        daemon.set_log_level("datapath", "info")
        split_alone = read_split(daemon.log_path, log_from, log_beside, small_n)
        split_beside = read_split(daemon.log_path, log_beside, None, small_n)
        for s in sessions:
            bad = s.mismatches()
            if bad:
                raise BenchError("session %d: retrieved bytes differ at (layer, block) %s" % (
                    s.index, bad))
    finally:
        close_sessions(sessions)
        daemon.stop()
    small_gb = small_n * BLOCK_BYTES / GB
    alone_med, beside_med = _quantile(alone, 0.5), _quantile(beside, 0.5)
    small_alone_gbps, small_beside_gbps = small_gb / alone_med, small_gb / beside_med
    fair = min(small_alone_gbps, big_alone / 2)
    results.add(
        "ssd_array_share_small_vs_fair", small_beside_gbps, "fair_share", fair, "GB/s",
        n_devices=n, emulation=emulation, small_blocks=small_n, big_blocks=big_n,
        big_call_blocks=call, small_alone_ms=[round(x * 1e3, 2) for x in alone],
        small_beside_ms=[round(x * 1e3, 2) for x in beside],
        small_alone_median_ms=alone_med * 1e3, small_beside_median_ms=beside_med * 1e3,
        small_beside_p90_ms=_quantile(beside, 0.9) * 1e3, small_beside_first_ms=beside[0] * 1e3,
        small_alone_split=split_alone, small_beside_split=split_beside,
        device_read_ms_alone=read_emission_ms(io_from, io_beside),
        device_read_ms_beside=read_emission_ms(io_beside, io_to),
        small_alone_gbps=small_alone_gbps, big_alone_gbps=big_alone,
        big_beside_gbps=big_beside, io_cap_gbps=args.io_cap_gbps if emulation == "loop" else None,
        tuttid_set=tuttid_settings(args), retrieve_staging_mib=args.retrieve_staging_mib,
        note="a small Retrieve (every layer of %d blocks, one call, repeated %d times) while a "
             "large session Retrieves every layer of its %d blocks in calls of %d, over and "
             "over (started %.1f s before), against the small one alone; fair_share = the "
             "lower of the small one's rate alone and half the large one's rate alone" % (
                 small_n, args.share_small_calls, big_n, call, args.share_lead_s))
    for name, sp, device_ms in (
            ("alone", split_alone, read_emission_ms(io_from, io_beside)),
            ("beside", split_beside, read_emission_ms(io_beside, io_to))):
        if sp:
            log("  small %s (medians of %d Reads, ms): %.1f in all, waiting %.1f (first layer "
                "%.1f), sink %.1f; per batch: slot %.2f, reads %.2f (the devices' part, every "
                "Read's: %s), checks %.2f; the first layer's last batch: slot %.2f, reads %.2f, "
                "checks %.2f" % (
                    name, sp["reads"], sp["ms"], sp["wait_ms"], sp["first_layer_ms"],
                    sp["sink_ms"], sp["batch_slot_ms"], sp["batch_reads_ms"], device_ms,
                    sp["batch_checks_ms"], sp["first_last_slot_ms"], sp["first_last_reads_ms"],
                    sp["first_last_checks_ms"]))
    results.table_rows.append((
        "share %s:%d" % (emulation, n), "-", "-", "-", "%.2f" % big_beside,
        "%.3f" % (small_beside_gbps / fair), "-", "-", "-", "-", "-",
        "small %.1f ms alone, %.1f beside" % (alone_med * 1e3, beside_med * 1e3), "-"))


_READ_LINE = re.compile(
    r"read \d+: (\d+) items, (\d+) of \d+ layers of \d+ KiB in ([\d.]+) ms: staging ([\d.]+) ms "
    r"\((\d+) leases\), posting ([\d.]+), waiting ([\d.]+) \(first layer ([\d.]+), longest "
    r"([\d.]+)\), sink ([\d.]+); (\d+) batches, each on average: slot ([\d.]+) ms, reads "
    r"([\d.]+), checks ([\d.]+); the first layer's last: slot ([\d.]+), reads ([\d.]+), checks "
    r"([\d.]+)")


def read_split(log_path, start, end, items):
    """The medians over the Reads of `items` items whose debug lines (LayerReader's, logger
    "datapath") lie in bytes [start, end) of tuttid's log: where each one's time went (ms)."""
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read(-1 if end is None else end - start).decode(errors="replace")
    rows = [m for m in _READ_LINE.finditer(text) if int(m.group(1)) == items]
    if not rows:
        return None
    keys = ["layers", "ms", "staging_ms", "leases", "post_ms", "wait_ms", "first_layer_ms",
            "longest_layer_ms", "sink_ms", "batches", "batch_slot_ms", "batch_reads_ms",
            "batch_checks_ms", "first_last_slot_ms", "first_last_reads_ms",
            "first_last_checks_ms"]
    out = {"reads": len(rows)}
    for i, k in enumerate(keys):
        out[k] = round(_quantile([float(m.group(i + 2)) for m in rows], 0.5), 3)
    return out


# --- ttft --------------------------------------------------------------------------------------

class TtftDaemon:
    """What tests/e2e's helpers need of a daemon (socket), over a Daemon."""

    def __init__(self, daemon):
        self.socket = daemon.socket


def part_ttft(args, results, ctx):
    import gpu_e2e as g
    import ttft_grid as tg
    g.DEV = "cpu" if args.local else "cuda"
    emulation, n = args.ttft_emulation, args.ttft_devices
    log("=== ttft: T=%d, %.0f%% cached, load-all, prefix on %s:%d" % (
        args.ttft_tokens, 100 * args.ttft_share, emulation, n))
    shape, dtype = tg.shapes(args)["8b"]
    T = args.ttft_tokens
    cached_blocks = int(args.ttft_share * T) // BLOCK_TOKENS
    block_bytes = 2 * shape.layers * BLOCK_TOKENS * shape.kv_heads * shape.head_dim * \
        tg.dtype_bytes(dtype)
    prefix_bytes = cached_blocks * block_bytes
    mark = TEARDOWN.mark()
    bench = None
    if args.engine_cpus:
        # Here this process is the engine: its thread, and the client's threads made after,
        # on the engine's CPUs (tuttid and the raw tool are on --tuttid-cpus).
        everywhere = os.sched_getaffinity(0)
        os.sched_setaffinity(0, args.engine_cpus)
        TEARDOWN.push("give the engine back every CPU", lambda: os.sched_setaffinity(0, everywhere))
    try:
        span = max(prefix_bytes // n // (args.io_kib * 1024), 64) * args.io_kib * 1024
        slot = block_bytes + 8192
        # Over twice the prefix: one session may pin at most half the pool (limits.
        # max_pinned_pool_share_per_user).
        cap = int(2.25 * cached_blocks * slot) + 256 * MiB
        check_room(args.base, (cap + span * n) * (1.1 if emulation == "loop" else 1.0),
                   "the TTFT part")
        array = (build_tmpfs_array(args, n) if emulation == "tmpfs"
                 else build_loop_array(args, n, cap / n + span))
        log("  %s" % array.describe())
        run_rawio(args, array, "write", span, prefix_bytes, fill=True)
        raw0 = run_rawio(args, array, "read", span, prefix_bytes)
        model = tg.build_model(shape, dtype)
        layout = g.layout_of(shape, tg.dtype_bytes(dtype))

        def cfg(root, sock):
            c = tuttid_config(args, array, root, sock, cap, cap)
            c["pool"]["object_bytes"] = layout.object_bytes
            c["pool"]["max_objects"] = 2 * shape.layers
            return c

        daemon = Daemon(args, array, cfg, "tuttid-ttft")
        daemon.start()
        ns = tutti_namespace(layout, shape)
        nb = 2 * ((T + BLOCK_TOKENS - 1) // BLOCK_TOKENS) + 16
        cache = g.new_cache(model, nb)
        client = tg.attach(cache, ns, TtftDaemon(daemon), "ssd-array-ttft")
        bench = tg.Bench(model, cache, client)
        if cached_blocks > bench.max_keys:
            raise BenchError("%d cached blocks exceed max_blocks_per_call %d (--set "
                             "limits.max_blocks_per_call=...)" % (cached_blocks, bench.max_keys))
        prompts = tg.store_prefixes(bench, [T], args.ttft_share)
        tokens, hits = tg.point_prompt(prompts[T], T, args.ttft_share, seed=T + 980)
        recompute = [bench.recompute(prompts[T]) for _ in range(args.ttft_runs + 1)][1:]
        dram_phases, ssd_phases = [], []
        dram = load_all(bench, tokens, hits, args.ttft_runs, dram_phases)
        spans, total = tg.timed_layers(bench, tokens, hits * BLOCK_TOKENS)
        spans2, total2 = tg.timed_layers(bench, tokens, hits * BLOCK_TOKENS)
        layer_ms = min(sum(spans) / len(spans), sum(spans2) / len(spans2))
        compute_ms = min(total, total2)
        gen = client.info["generation"]
        daemon.stop()
        daemon.set_dram(0)
        daemon.start()
        g.await_generation(client, gen + 1)
        ssd = load_all(bench, tokens, hits, args.ttft_runs, ssd_phases)
        client.detach()
        bench = None
        daemon.stop()
        raw1 = run_rawio(args, array, "read", span, prefix_bytes)
    finally:
        if bench is not None:
            bench.client.detach()
        TEARDOWN.run_to(mark)
        free_device_memory()
    raw = (raw0["gbps"] + raw1["gbps"]) / 2
    limit_ms = prefix_bytes / (raw * GB) * 1e3 + layer_ms
    # The pipeline's other stage: where the array reads faster than the model computes, the
    # prefill cannot end before one layer has loaded and every layer has computed.
    compute_bound_ms = prefix_bytes / shape.layers / (raw * GB) * 1e3 + compute_ms
    pipeline_limit_ms = max(limit_ms, compute_bound_ms)
    rec, ssd_ms, dram_ms = min(recompute), min(ssd), min(dram)
    # Where the time of the best runs went (ms from the start of each).
    phases = {"ssd": best_phases(ssd, ssd_phases), "dram": best_phases(dram, dram_phases)}
    for tier, p in phases.items():
        log("  %s tier, best run: keys hashed at %.1f ms, Lookup answered at %.1f, Retrieve "
            "called at %.1f, forward pass enqueued at %.1f, Retrieve ended (host) at %.1f, GPU "
            "done at %.1f" % (tier, p["keys"], p["lookup"], p["retrieve_called"],
                              p["forward_enqueued"], p["retrieve_end"], p["gpu_done"]))
    common = dict(n_devices=n, emulation=emulation, array=array.describe(),
                  io_cap_gbps=args.io_cap_gbps if emulation == "loop" else None, tokens=T,
                  cached_tokens=hits * BLOCK_TOKENS, prefix_bytes=prefix_bytes,
                  raw_gbps=raw, raw_gbps_before_after=[raw0["gbps"], raw1["gbps"]],
                  layer_ms=layer_ms, compute_ms=compute_ms, recompute_ms=rec, ssd_ms=ssd_ms,
                  dram_ms=dram_ms, pipeline_limit_ms=pipeline_limit_ms,
                  ssd_vs_pipeline_limit=ssd_ms / pipeline_limit_ms,
                  dram_vs_pipeline_limit=dram_ms / pipeline_limit_ms, mps=mps_running(),
                  runs={"recompute": recompute, "ssd": ssd, "dram": dram}, phases_ms=phases,
                  tuttid_gbps=prefix_bytes / (ssd_ms / 1e3) / GB,
                  tuttid_set=tuttid_settings(args), retrieve_staging_mib=args.retrieve_staging_mib,
                  engine_cpus=cpu_list(args.engine_cpus) if args.engine_cpus else None,
                  tuttid_cpus=cpu_list(args.tuttid_cpus) if args.tuttid_cpus else None)
    how = ("TTFT = lookup + layer-wise load-all of %d blocks overlapped with computing the last "
           "%d tokens, synchronized; min of %d runs after a warm-up; model %s %s" % (
               hits, T - hits * BLOCK_TOKENS, args.ttft_runs, "Llama-3-8B shape, random weights"
               if not args.local else "tiny (--local)", dtype))
    results.add("ssd_array_ttft_vs_recompute", ssd_ms, "recompute_all", rec, "ms",
                note="SSD tier (DRAM tier off). " + how, **common)
    results.add("ssd_array_ttft_vs_limit", ssd_ms, "prefix_at_raw_read_plus_one_layer",
                limit_ms, "ms",
                note="limit = prefix bytes / raw read rate of the same array in this run (mean "
                "of before and after, each reading as many bytes) + one layer's compute of the "
                "new tokens with the prefix present (CUDA events, mean over layers, best of 2): "
                "%.2f + %.2f ms. pipeline_limit_ms: the larger of that and one layer's load at "
                "the raw rate + every layer's compute (%.2f ms, the prefill without loads, best "
                "of 2): %.2f ms. " % (limit_ms - layer_ms, layer_ms, compute_ms,
                                      pipeline_limit_ms) + how, **common)
    results.add("ssd_array_ttft_dram_vs_recompute", dram_ms, "recompute_all", rec, "ms",
                note="DRAM tier (reference). " + how, **common)


def part_engine_loss(args, results, ctx):
    """What a busy engine loses beside a full-speed SSD-tier retrieve (issue 20: at most 5% under
    MPS). bench/busy_engine.py keeps every SM busy with timed bf16 matrix multiplications: alone
    for --loss-alone-s, then beside tuttid's Retrieves of every block from a tmpfs array
    (back to back for --loss-overlap-s, DRAM tier off, tuttid's copier and verifier as
    configured: the defaults unless --set), then alone again. Loss = 1 - its rate during / the
    mean of its rates before and after; tuttid's rate during is set against its rate alone just
    before (best of 2 rounds). Each window's time per multiplication is also split into the
    multiplication's own time on the GPU and the host's turnaround between two (the engine waits
    for each one before launching the next): a loss in the second is CPU contention on the host,
    not the GPU's. --engine-cpus and --tuttid-cpus keep the two apart on the host's CPUs.
    --local: a dry run of the part's logic, the engine multiplying on the CPU."""
    n = args.ttft_devices
    log("=== engine_loss: a busy engine beside SSD-tier retrieves from tmpfs:%d (MPS %s; "
        "engine on CPUs %s, tuttid on %s)" % (
            n, "running" if mps_running() else "not running",
            cpu_list(args.engine_cpus) or "any", cpu_list(args.tuttid_cpus) or "any"))
    mark = TEARDOWN.mark()
    try:
        array = build_tmpfs_array(args, n)
        blocks = int(args.gib * GiB) // BLOCK_BYTES
        per, capacity, call = plan(args, blocks, args.sessions)
        check_room(args.base, capacity, "tuttid's pool on " + array.name)
        daemon = Daemon(args, array, lambda root, sock: tuttid_config(
            args, array, root, sock, capacity, 0), "tuttid-engine-loss")
        daemon.start()
        sessions = []
        try:
            sessions = open_sessions(args, daemon, args.sessions, per)
            call = min(call, sessions[0].client.info["max_blocks_per_call"])
            phase_store(args, daemon, sessions)
            alone = max(phase_retrieve(args, daemon, sessions, call)[0] for _ in range(2))
            # One round's time alone: the engine runs long enough for the overlap's last round,
            # slower beside it (copy-engine scatter under MPS took over 5 s more: stop 50).
            round_s = per * args.sessions * BLOCK_BYTES / GB / alone
            m = engine_beside(args, lambda: in_threads(lambda s: s.retrieve(call), sessions),
                              sessions, round_s)
            verify(sessions)
        finally:
            close_sessions(sessions)
            daemon.stop()
    finally:
        TEARDOWN.run_to(mark)
    during = m["rounds"] * per * args.sessions * BLOCK_BYTES / m["overlap_s"] / GB
    base = (m["before"] + m["after"]) / 2
    results.add(
        "ssd_array_engine_beside_retrieve", m["during"], "engine_alone", base, "ops/s",
        engine_loss=1 - m["during"] / base, engine_tflops_alone=base * m["flops_per_op"] / 1e12,
        engine_ops_per_s=[m["before"], m["during"], m["after"]],
        engine_op_ms=[x["op_ms"] for x in m["split"]],
        engine_turnaround_ms=[x["turnaround_ms"] for x in m["split"]],
        tuttid_gbps_during=during,
        tuttid_gbps_alone=alone, tuttid_during_vs_alone=during / alone, rounds=m["rounds"],
        overlap_s=m["overlap_s"], mps=mps_running(), n_devices=n, emulation="tmpfs",
        sessions=args.sessions, blocks=per * args.sessions, call_blocks=call,
        tuttid_set=tuttid_settings(args), retrieve_staging_mib=args.retrieve_staging_mib,
        engine_cpus=cpu_list(args.engine_cpus) if args.engine_cpus else None,
        tuttid_cpus=cpu_list(args.tuttid_cpus) if args.tuttid_cpus else None,
        note="engine: bench/busy_engine.py (%s matmuls back to back, each timed) alone "
             "%.1f s, beside %d SSD-tier Retrieves of every layer of %d blocks (verified after), "
             "alone again; ratio = its rate during / the mean of before and after; engine_op_ms and "
             "engine_turnaround_ms (before / during / after): each multiplication's own time "
             "and the host's turnaround between two" % (
                 "256^3 float32 CPU (--local)" if args.local else "8192^3 bf16",
                 args.loss_alone_s, m["rounds"], per * args.sessions))
    log("  engine %.1f / %.1f / %.1f ops/s (before / during / after): loss %.2f%%; tuttid "
        "%.2f GB/s during, %.2f alone; per op, own / host turnaround ms: %s" % (
            m["before"], m["during"], m["after"], 100 * (1 - m["during"] / base), during, alone,
            " | ".join("%s / %s" % (x["op_ms"], x["turnaround_ms"]) for x in m["split"])))


def engine_beside(args, one_round, sessions, round_s=0.0):
    """Runs bench/busy_engine.py alone, beside one_round() repeated for --loss-overlap-s, and
    alone again: its rate (ops/s) in each window, the rounds run and the overlap's seconds. The
    engine's run has room for the last round to take 4 x round_s (one round's seconds alone)."""
    for s in sessions:  # the check after the overlap then sees what its rounds wrote
        s.clear_destination()
        s.sync()
    seconds = 2 * args.loss_alone_s + args.loss_overlap_s + 5 + 4 * round_s
    cpus = args.engine_cpus
    engine = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "busy_engine.py"), "--seconds", "%.1f" % seconds] +
        (["--device", "cpu", "--n", "256"] if args.local else []),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    TEARDOWN.push("stop the busy engine", lambda: engine.poll() is not None or engine.kill())
    first = engine.stdout.readline().split()
    if len(first) != 2 or first[0] != "ready":
        engine.kill()
        raise BenchError("busy_engine did not start: %r %s" % (first, engine.stderr.read()))
    ready = float(first[1])
    time.sleep(args.loss_alone_s)
    rounds, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < args.loss_overlap_s:
        one_round()
        rounds += 1
    for s in sessions:
        s.sync()
    t1 = time.monotonic()
    out, err = engine.communicate(timeout=seconds + 60)
    if engine.returncode != 0:
        raise BenchError("busy_engine exited %s: %s" % (engine.returncode, err.strip()))
    r = json.loads(out.strip().splitlines()[-1])
    ends = r["ends"]
    after_end = min(t1 + args.loss_alone_s, ends[-1])
    if after_end - t1 < 0.5 * args.loss_alone_s:
        raise BenchError("the engine stopped %.2f s after the overlap (the rounds ran long)" % (
            ends[-1] - t1))
    rate = lambda a, b: sum(1 for e in ends if a <= e < b) / (b - a)
    windows = ((ready, t0), (t0, t1), (t1, after_end))
    return {"before": rate(ready, t0), "during": rate(t0, t1), "after": rate(t1, after_end),
            "split": [op_split(ends, r["op_ms"], a, b) for a, b in windows],
            "rounds": rounds, "overlap_s": t1 - t0, "flops_per_op": r["flops_per_op"]}


def op_split(ends, op_ms, a, b):
    """The busy engine's time per multiplication ending in [a, b), split in two (ms, means): its
    own time (on the GPU, between CUDA events) and the host's turnaround around it (the rest of
    the time since the previous one ended: the wait's wake-up and the next launch). A loss in the
    first is the GPU's, shared with tuttid's copies and checks; in the second the host's CPUs'."""
    own = [op_ms[i] for i in range(1, len(ends)) if a <= ends[i] < b]
    gaps = [(ends[i] - ends[i - 1]) * 1e3 - op_ms[i] for i in range(1, len(ends))
            if a <= ends[i] < b]
    mean = lambda xs: round(sum(xs) / len(xs), 4) if xs else None
    return {"op_ms": mean(own), "turnaround_ms": mean(gaps)}


def tutti_namespace(layout, shape):
    import tutti
    return tutti.Namespace("ssd-array-ttft-%d-layers" % shape.layers, layout)


def load_all(bench, tokens, hits, runs, phases=None):
    """TTFT ms of `runs` load-all prefills after a warm-up; `phases` (a list) gets each run's
    bench.last_phases: ms from the start to the keys hashed, the Lookup's answer, the Retrieve
    called, the forward pass enqueued, the Retrieve's end seen by the host, and the GPU done."""
    out = []
    for i in range(runs + 1):
        ms, lease, n = bench.load(tokens, decide=False)
        if lease.hits != hits or n != hits:
            raise BenchError("load-all: %d hits, %d loaded, %d blocks stored" % (lease.hits, n,
                                                                              hits))
        if i > 0:
            out.append(ms)
            if phases is not None:
                phases.append(list(bench.last_phases))
    return out


def best_phases(ms, phases):
    """The phases of the fastest run, by name."""
    p = phases[ms.index(min(ms))]
    return dict(zip(("keys", "lookup", "retrieve_called", "forward_enqueued", "retrieve_end",
                     "gpu_done"), p))


# --- set-up, main ------------------------------------------------------------------------------

def resolve_binaries(args):
    """--tuttid and --rawio as command lists; defaults: bazel-bin, or the bundle beside
    --tuttid (DIR/tuttid.sh -> DIR/run.sh bench/raw_array_io)."""
    tuttid = args.tuttid or os.environ.get("TUTTID_BIN") or os.path.join(REPO,
                                                                         "bazel-bin/daemon/tuttid")
    args.tuttid_cmd = shlex.split(tuttid)
    rawio = args.rawio
    if not rawio:
        bundle = os.path.dirname(os.path.abspath(args.tuttid_cmd[0]))
        if os.path.basename(args.tuttid_cmd[0]) == "tuttid.sh" and os.path.exists(
                os.path.join(bundle, "bin/bench/raw_array_io")):
            rawio = "%s bench/raw_array_io" % os.path.join(bundle, "run.sh")
        else:
            rawio = os.path.join(REPO, "bazel-bin/bench/raw_array_io")
    args.rawio_cmd = shlex.split(rawio)
    # raw_gpu_io (CUDA): beside raw_array_io in the bundle or bazel-bin; none in --local.
    args.rawgpu_cmd = None
    if not args.local:
        if os.path.basename(args.rawio_cmd[0]) == "run.sh" and os.path.exists(os.path.join(
                os.path.dirname(args.rawio_cmd[0]), "bin/bench/raw_gpu_io")):
            args.rawgpu_cmd = [args.rawio_cmd[0], "bench/raw_gpu_io"]
        elif os.path.exists(os.path.join(REPO, "bazel-bin/bench/raw_gpu_io")):
            args.rawgpu_cmd = [os.path.join(REPO, "bazel-bin/bench/raw_gpu_io")]
    for what, cmd in (("--tuttid", args.tuttid_cmd), ("--rawio", args.rawio_cmd)):
        if not (os.path.isfile(cmd[0]) and os.access(cmd[0], os.X_OK)):
            raise SetupError("%s: %s is not an executable file (build it: bazel build "
                             "//daemon:tuttid //bench:raw_array_io, or bundle them with "
                             "tools/gpu_bundle.sh)" % (what, cmd[0]))
    if os.path.basename(args.rawio_cmd[0]) == "run.sh" and len(args.rawio_cmd) > 1:
        target = os.path.join(os.path.dirname(args.rawio_cmd[0]), "bin", args.rawio_cmd[1])
        if not os.path.exists(target):
            raise SetupError("--rawio: %s is not in the bundle (add //bench:raw_array_io to "
                             "tools/gpu_bundle.sh's targets)" % target)


def preflight(args):
    """Everything this run needs, checked before anything is built."""
    resolve_binaries(args)
    try:
        import torch
        import tutti
        del tutti  # importable is all this checks
    except ImportError as e:
        raise SetupError("%s: put the tutti package on PYTHONPATH (bazel build "
                         "//client/python:tutti; PYTHONPATH=bazel-bin/client/python/site, or "
                         "the bundle's site/) and use a python3 with torch" % e) from None
    if not args.local and not torch.cuda.is_available():
        raise SetupError("torch sees no CUDA device: run on the GPU machine, or use --local")
    if not os.path.isdir(args.base) or not takes_o_direct(args.base):
        raise SetupError("--base %s does not take O_DIRECT (tmpfs does since Linux 6.6; "
                         "/dev/shm on the GPU machine does)" % args.base)
    loops = [c for c in args.configs if c[0] == "loop"] if "array" in args.parts else []
    if loops:
        if os.geteuid() != 0:
            raise SetupError("loop configurations need root (losetup, mount, cgroups)")
        for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
            if shutil.which(tool) is None:
                raise SetupError("loop configurations need %s" % tool)
        if args.io_cap_gbps > 0:
            probe = Cgroup("%s%d-probe" % (PREFIX, os.getpid()))
            log("I/O cap through %s works here" % probe.describe())
            TEARDOWN.run_to(TEARDOWN.mark() - 1)
    if args.ttft_share <= 0 or args.ttft_share >= 1:
        raise SetupError("--ttft-share must be in (0, 1)")


def machine_description(args):
    gpu = "no GPU: --local host mode"
    if not args.local:
        import torch
        gpu = torch.cuda.get_device_name(0)
    return "%s (%s, %d cores, Linux %s)" % (platform.node(), gpu, os.cpu_count(),
                                            platform.release())


def start_watchdog(seconds):
    def fire():
        log("watchdog: %.0f s passed; stacks:" % seconds)
        faulthandler.dump_traceback(all_threads=True)
        log("watchdog: tearing down")
        kill_children()
        TEARDOWN.run_to(0)
        os._exit(3)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


def on_signal(signum, frame):
    log("ssd_array: signal %d: tearing down, then exiting %d" % (signum, 128 + signum))
    raise SystemExit(128 + signum)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--configs", default="tmpfs:1,tmpfs:2,tmpfs:4,tmpfs:8,loop:4",
                    help="array configurations: tmpfs:N, loop:N (default %(default)s)")
    ap.add_argument("--parts", default="array,dram,ttft",
                    help="of array, dram, ttft, engine_loss")
    ap.add_argument("--gib", type=float, default=8.0, help="GiB of blocks stored and retrieved "
                    "(2 MiB each; default 8: 4096 blocks); also the raw files' total")
    ap.add_argument("--sessions", type=int, default=1,
                    help="engines storing and retrieving at once, each its share of the blocks "
                    "in a cache of its own (the client runs one Retrieve per session)")
    ap.add_argument("--call-blocks", type=int, default=0,
                    help="blocks per Retrieve call (0: tuttid's limits.max_blocks_per_call)")
    ap.add_argument("--max-blocks-per-call", type=int, default=2048, help=argparse.SUPPRESS)
    ap.add_argument("--store-batch", type=int, default=64, help="blocks per Store call")
    ap.add_argument("--store-staging-wait-ms", type=int, default=200,
                    help="StoreRequest.staging_wait_ms: tuttid waits up to this long for staging "
                    "room for one more block before refusing, and refused blocks are offered "
                    "again at once (default 200, measured against 0 on 2026-12-02: tmpfs:4 0.79 "
                    "vs 0.37, tmpfs:8 0.54 vs 0.40; 0: refused at once, retried after 2 ms)")
    ap.add_argument("--store-wait", choices=("backlog", "durable"), default="backlog",
                    help="backlog: Stores without wait_durable, then wait until Stats shows "
                    "every block durable; durable: every Store waits (default %(default)s)")
    ap.add_argument("--retrieve-staging-mib", type=int, default=-1,
                    help="limits.retrieve_staging_bytes in MiB (default 1024 on the GPU, where a "
                    "layer of a 2048-block call is 128 MiB and 256 MiB holds two: with 1 GiB, "
                    "8 layers are read ahead; 0: tuttid's default, 256 MiB; --local: 0)")
    ap.add_argument("--store-rounds", type=int, default=3,
                    help="store rounds: the first into a fresh pool, each later one the same "
                         "blocks under new keys into the full pool (evicting); the store figures "
                         "are the last round's")
    ap.add_argument("--retrieve-rounds", type=int, default=3,
                    help="retrieves of every block; the best counts (the first is often a "
                    "warm-up)")
    ap.add_argument("--io-kib", type=int, default=1024, help="raw request size, KiB")
    ap.add_argument("--qd", type=int, default=16, help="raw queue depth per file")
    ap.add_argument("--raw-seconds", type=float, default=0,
                    help="one raw run of this length (0: runs of as many bytes as tuttid moves "
                    "in one store or retrieve, repeated for --raw-min-seconds, the best "
                    "counting)")
    ap.add_argument("--raw-min-seconds", type=float, default=1.0)
    ap.add_argument("--raw-sustained-seconds", type=float, default=3.0,
                    help="capped (loop) arrays: the raw baseline is one run this long, where "
                    "the cap binds (the short runs' best is kept as burst_gbps; 0: as tmpfs)")
    ap.add_argument("--io-cap-gbps", type=float, default=2.5,
                    help="loop: cgroup cap per device for reads and for writes (0: none)")
    ap.add_argument("--base", default="/dev/shm", help="tmpfs for the devices and tuttid state")
    ap.add_argument("--warm-gib", type=float, default=None,
                    help="GiB of memory touched through --base once per boot before the first "
                         "array (a virtual machine backs its memory at first touch; default "
                         "2 x --gib + 4, 0: off)")
    ap.add_argument("--worker-sample-ms", type=float, default=0,
                    help="count tuttid's runnable io_uring workers this often during stores and "
                         "retrieves (iou_workers.runnable_mean in the lines; costs some CPU; "
                         "0: off)")
    ap.add_argument("--ring-nice", type=int, default=0,
                    help="renice tuttid's ring owner threads (tutti-uring-*, tutti-urd-*) by "
                         "this once it answers, before any Retrieve: the io_uring workers they "
                         "start later inherit it, so on tmpfs the workers' memory copies yield "
                         "the CPU to tuttid's hand-off threads (an experiment; 0: off)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a tuttid config field, e.g. datapath.checksum_threads=4 or "
                    "limits.retrieve_staging_bytes=1073741824 (repeatable)")
    ap.add_argument("--ttft-tokens", type=int, default=0, help="T (default 32768; --local 128)")
    ap.add_argument("--ttft-share", type=float, default=0.98, help="cached share of T")
    ap.add_argument("--ttft-devices", type=int, default=8,
                    help="devices of the TTFT part's array (and engine_loss's tmpfs directories)")
    ap.add_argument("--ttft-emulation", choices=("tmpfs", "loop"), default="tmpfs",
                    help="the TTFT part's array: tmpfs directories, or capped loop devices with "
                         "ext4 as the array part builds them")
    ap.add_argument("--ttft-runs", type=int, default=2, help="runs after a warm-up")
    ap.add_argument("--loss-alone-s", type=float, default=3.0,
                    help="engine_loss: seconds the busy engine runs alone before and after")
    ap.add_argument("--loss-overlap-s", type=float, default=6.0,
                    help="engine_loss: seconds of back-to-back retrieves beside it")
    ap.add_argument("--engine-cpus", default="",
                    help='engine_loss: the busy engine on these CPUs only, e.g. "12-15"; '
                    "ttft: this process's prefill, the engine there (default: anywhere)")
    ap.add_argument("--tuttid-cpus", default="",
                    help='tuttid and the raw tool, their io_uring workers included, on these '
                    'CPUs only (a cgroup v2 cpuset; every part), e.g. "0-11" (default: anywhere)')
    ap.add_argument("--share-small-blocks", type=int, default=64,
                    help="share: blocks of the small Retrieve (default 64: a 1K-token prefix)")
    ap.add_argument("--share-small-calls", type=int, default=10,
                    help="share: the small Retrieve's calls, alone and beside the large one")
    ap.add_argument("--share-lead-s", type=float, default=0.5,
                    help="share: seconds the large Retrieves run before the small ones start")
    ap.add_argument("--phase-timeout", type=float, default=300.0, help="seconds per store phase")
    ap.add_argument("--label", default="", help='what tuttid this is, e.g. "before", "after"')
    ap.add_argument("--tuttid", default=None, help="tuttid binary or wrapper (.bundle/tuttid.sh;"
                    " default $TUTTID_BIN, else bazel-bin/daemon/tuttid)")
    ap.add_argument("--rawio", default=None, help='raw_array_io command, e.g. ".bundle/run.sh '
                    'bench/raw_array_io" (default: beside --tuttid\'s bundle, else bazel-bin)')
    ap.add_argument("--out", default=os.path.join(REPO, "bench/results/ssd_array.jsonl"))
    ap.add_argument("--local", action="store_true",
                    help="here, without a GPU: tuttid in host mode, caches in shared memory")
    ap.add_argument("--watchdog", type=float, default=0,
                    help="after this many seconds: stacks, teardown, exit 3 (0: none)")
    args = ap.parse_args(argv)
    if args.retrieve_staging_mib < 0:
        args.retrieve_staging_mib = 0 if args.local else 1024
    args.sets = parse_sets(args.set)
    for path, value in args.sets:
        if path == ["limits", "max_blocks_per_call"]:
            args.max_blocks_per_call = int(value)
    args.configs = parse_configs(args.configs)
    args.engine_cpus, args.tuttid_cpus = parse_cpus(args.engine_cpus), parse_cpus(args.tuttid_cpus)
    for flag, cpus in (("--engine-cpus", args.engine_cpus), ("--tuttid-cpus", args.tuttid_cpus)):
        if cpus and max(cpus) >= os.cpu_count():
            raise SetupError("%s: CPU %d, but this machine has %d" % (flag, max(cpus),
                                                                      os.cpu_count()))
    if args.tuttid_cpus and os.geteuid() != 0:
        raise SetupError("--tuttid-cpus needs root (a cgroup)")
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    for p in args.parts:
        if p not in ("array", "dram", "ttft", "engine_loss", "share"):
            raise SetupError("--parts: unknown part %r (array, dram, ttft, engine_loss, share)"
                             % p)
    args.ttft_tokens = args.ttft_tokens or (128 if args.local else 32768)
    if args.warm_gib is None:
        args.warm_gib = 0 if args.local else 2 * args.gib + 4
    args.cpu_dry_run = args.local  # what tests/e2e's shapes() reads
    if args.sessions < 1:
        raise SetupError("--sessions must be at least 1")
    if args.store_rounds < 1:
        raise SetupError("--store-rounds must be at least 1")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
        preflight(args)
    except SetupError as e:
        log("ssd_array: %s" % e)
        return 2
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.watchdog > 0:
        start_watchdog(args.watchdog)
    clean_stale(args.base)
    for top in (os.path.join(args.base, "%s%d" % (PREFIX, os.getpid())),
                os.path.join("/tmp", "%s%d" % (PREFIX, os.getpid()))):
        TEARDOWN.push("remove " + top, lambda top=top: shutil.rmtree(top, ignore_errors=True))
    command = "python3 bench/ssd_array.py " + shlex.join(argv)
    results = Results(args, machine_description(args), command)
    log("ssd_array: %s; tuttid %s; raw %s; label %r; out %s" % (
        results.machine, shlex.join(args.tuttid_cmd), shlex.join(args.rawio_cmd), args.label,
        args.out))
    failed = []
    ctx = {}
    try:
        if "array" in args.parts or "dram" in args.parts:
            ctx["copy"] = measure_copy(args)
        for part in args.parts:
            t0 = time.perf_counter()
            try:
                globals()["part_" + part](args, results, ctx)
                log("=== %s: OK in %.1f s" % (part, time.perf_counter() - t0))
            except (BenchError, Exception) as e:
                if not isinstance(e, BenchError):
                    traceback.print_exc()
                log("=== %s: FAILED in %.1f s: %s" % (part, time.perf_counter() - t0, e))
                failed.append(part)
    finally:
        leftovers = TEARDOWN.run_to(0)
        if leftovers:
            log("teardown left: %s" % leftovers)
            failed.append("teardown")
    results.table()
    log("parts failed: %s" % (", ".join(failed) or "none"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

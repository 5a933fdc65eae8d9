"""A real tuttid for tests and examples: writes a config into a fresh directory (the pool on a
filesystem that takes O_DIRECT: $TEST_TMPDIR, else /var/tmp; the socket under /tmp), starts the
tuttid binary, waits until its socket answers, stops (SIGTERM) or kills (SIGKILL) it, and restarts
it on the same pool and journal. `socket` is the engines' socket (its handoff socket beside it:
socket + ".handoff"), `admin_socket` the operators' (socket + ".admin", tuttictl's --socket).

    with tutti.testing.Tuttid(binary="bazel-bin/daemon/tuttid") as daemon:
        client = tutti.Client.attach(..., socket_path=daemon.socket)
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

CONFIG = """state_dir: "{root}/state"
listen {{ socket_path: "{socket}" socket_mode: 384 {listen_extra} }}
metrics {{ listen: "{metrics_listen}" }}
pool {{ dirs: "{root}/pool" capacity_bytes: {capacity} object_bytes: {object_bytes} max_objects: {max_objects} {pool_extra} }}
io {{ backend: "uring" queue_depth: {queue_depth} }}
dram {{ capacity_bytes: {dram} }}
limits {{ max_blocks_per_call: {max_blocks_per_call} session_ttl_ms: {session_ttl_ms} lease_ttl_ms: 30000
         store_staging_bytes: {store_staging} retrieve_staging_bytes: {retrieve_staging} }}
{extra}
"""


def _takes_o_direct(d):
    probe = os.path.join(d, ".odirect-probe")
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


def find_tuttid():
    """$TUTTID_BIN, else the test's runfiles, else bazel-bin/daemon/tuttid."""
    if os.environ.get("TUTTID_BIN"):
        return os.environ["TUTTID_BIN"]
    for var in ("TEST_SRCDIR", "RUNFILES_DIR"):
        root = os.environ.get(var)
        if root and os.access(os.path.join(root, "tutti/daemon/tuttid"), os.X_OK):
            return os.path.join(root, "tutti/daemon/tuttid")
    return "bazel-bin/daemon/tuttid"


class Tuttid:
    def __init__(self, binary=None, capacity=256 << 20, object_bytes=64 << 10, max_objects=16,
                 dram=0, store_staging=64 << 20, retrieve_staging=64 << 20, session_ttl_ms=30000,
                 max_blocks_per_call=512, queue_depth=32, extra="", root=None, pool_extra="",
                 listen_extra="", metrics_listen="off"):
        """`extra`: more top-level config text; `pool_extra`: more fields of pool { }, e.g.
        'admission: "second_sight"'; `listen_extra`: of listen { }, e.g. 'lookup_socket: false';
        `metrics_listen`: metrics.listen ("off"; "127.0.0.1:0" for a free port, which tuttid logs
        as "metrics on http://...")."""
        self.binary = binary or find_tuttid()
        base = os.environ.get("TEST_TMPDIR")
        if not base or not _takes_o_direct(base):
            base = "/var/tmp"
        self.root = root or tempfile.mkdtemp(prefix="tuttid-py-", dir=base)
        self._sock_dir = tempfile.mkdtemp(prefix="tutti-py-sock-", dir="/tmp")
        self.socket = os.path.join(self._sock_dir, "tuttid.sock")
        self.admin_socket = self.socket + ".admin"
        os.makedirs(os.path.join(self.root, "state"), exist_ok=True)
        os.makedirs(os.path.join(self.root, "pool"), exist_ok=True)
        self.config_path = os.path.join(self.root, "tuttid.textproto")
        self.log_path = os.path.join(self.root, "tuttid.log")
        self.settings = dict(root=self.root, socket=self.socket, capacity=capacity,
                             object_bytes=object_bytes, max_objects=max_objects, dram=dram,
                             store_staging=store_staging, retrieve_staging=retrieve_staging,
                             session_ttl_ms=session_ttl_ms, queue_depth=queue_depth,
                             max_blocks_per_call=max_blocks_per_call, extra=extra,
                             pool_extra=pool_extra, listen_extra=listen_extra,
                             metrics_listen=metrics_listen)
        self.write_config()
        self.proc = None

    def write_config(self, **changes):
        """(Re)writes the config; takes effect at the next start."""
        self.settings.update(changes)
        with open(self.config_path, "w") as f:
            f.write(CONFIG.format(**self.settings))

    def start(self, timeout=60.0):
        if self.proc is not None:
            raise RuntimeError("tuttid already runs")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "--config=" + self.config_path],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError("tuttid exited during start-up:\n" + self.log_tail())
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket)
                return self
            except OSError:
                time.sleep(0.05)
            finally:
                s.close()
        self.kill()
        raise RuntimeError("tuttid did not answer within %.0f s:\n%s" % (timeout, self.log_tail()))

    def stop(self, timeout=60.0):
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.proc = None
        return code

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self):
        self.stop()
        return self.start()

    def log_tail(self, n=4000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def cleanup(self):
        self.kill()
        if not os.environ.get("TUTTI_KEEP_TEST_DIRS"):
            shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self._sock_dir, ignore_errors=True)

    def __enter__(self):
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.cleanup()
        return False

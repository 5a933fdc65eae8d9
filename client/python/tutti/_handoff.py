"""The handoff: before every Attach the engine proves who it is to tuttid and hands its host-mode
memory over as file descriptors (the protocol of common/handoff.h, docs/security.md).

One exchange on the SOCK_SEQPACKET unix socket <socket_path>.handoff:
  engine -> tuttid: b"TUTTIHO1", n as a little-endian uint32, n descriptors as SCM_RIGHTS;
  tuttid -> engine: b"OK" + a 16-byte credential, or b"ER" + one byte of status code + words.
The credential goes into AttachRequest.credential (single use, valid for a short time), and each
host_shm region names its descriptor by fd_index. tuttid reads the engine's pid, uid and gid from
the kernel, so it maps only memory this process could open, with the rights it opened it with.

Thread-safety: free functions, safe from any thread.
"""

import errno
import socket
import struct
import time

import grpc

from tutti import errors

MAGIC = b"TUTTIHO1"
MAX_FDS = 16
CREDENTIAL_BYTES = 16
MAX_MESSAGE = 512

# absl::StatusCode and grpc.StatusCode number the codes alike.
_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


def handoff_path(socket_path):
    """The handoff socket of the tuttid serving `socket_path`."""
    return socket_path + ".handoff"


def admin_path(socket_path):
    """The operator (Admin service) socket of a tuttid whose config leaves
    listen.admin_socket_path empty."""
    return socket_path + ".admin"


def hand_off(socket_path, fds, timeout):
    """Hands `fds` (not closed: the caller keeps them) and this process's credentials to the tuttid
    serving `socket_path`; returns the credential (bytes) for AttachRequest.credential.
    Raises InvalidArgument for more than MAX_FDS descriptors, Unavailable when the handoff socket
    cannot be reached, does not accept or does not answer within `timeout` seconds (the message
    names the path and what the error likely means), and tuttid's refusal ("tuttid refused the
    handoff: ...") as the error of its code otherwise (e.g. ResourceExhausted: too many
    credentials outstanding, or too many handoff connections of this user open, naming the
    limit)."""
    if len(fds) > MAX_FDS:
        raise errors.InvalidArgument("handoff: %d descriptors (host_regions); at most %d" %
                                     (len(fds), MAX_FDS))
    path = handoff_path(socket_path)
    deadline = time.monotonic() + timeout
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        try:
            _connect(s, path, deadline)
            s.settimeout(max(deadline - time.monotonic(), 0.001))
            request = MAGIC + struct.pack("<I", len(fds))
            try:
                if fds:
                    socket.send_fds(s, [request], list(fds))
                else:  # GPU mode: the credential alone
                    s.send(request)
                reply = s.recv(MAX_MESSAGE)
            except (BrokenPipeError, ConnectionResetError):
                # tuttid refuses a connection past its limits at once, before it reads the
                # request: the reason may be queued behind the failed send or the reset.
                reply = _waiting_reply(s)
                if reply is None:
                    raise
        except socket.timeout:
            raise errors.Unavailable("tuttid's handoff socket %s: no answer within %.1f s; is "
                                     "tuttid stopped?" % (path, timeout)) from None
        except OSError as e:
            raise errors.Unavailable("tuttid's handoff socket %s: %s%s" %
                                     (path, e.strerror or e, _hint(e.errno))) from None
    finally:
        s.close()
    return _parse_reply(path, reply)


def _connect(s, path, deadline):
    """Connects `s` to `path`, retrying while tuttid's backlog is full (EAGAIN) until `deadline`."""
    s.setblocking(False)
    while True:
        try:
            s.connect(path)
            return
        except BlockingIOError as e:
            if e.errno != errno.EAGAIN or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _waiting_reply(s):
    """A reply already queued on `s`, or None. The first read may report the reset (tuttid closed
    with the request unread) that the kernel gives before the reply queued ahead of it."""
    for _ in range(2):
        try:
            return s.recv(MAX_MESSAGE, socket.MSG_DONTWAIT) or None
        except ConnectionResetError:
            continue
        except OSError:
            return None
    return None


def _hint(err):
    """What a failed call on the handoff socket most likely means."""
    if err in (errno.ENOENT, errno.ECONNREFUSED):
        return "; is tuttid running?"
    if err in (errno.EACCES, errno.EPERM):
        return "; is this user in the group of tuttid's socket (listen.socket_group)?"
    if err == errno.EAGAIN:
        return ("; tuttid did not accept the connection in time (its backlog is full: tuttid is "
                "overloaded or stuck)")
    return ""


def _parse_reply(path, reply):
    if len(reply) == 2 + CREDENTIAL_BYTES and reply[:2] == b"OK":
        return reply[2:]
    if len(reply) >= 3 and reply[:2] == b"ER":
        code = _CODE_NAMES.get(reply[2], "UNKNOWN")
        raise errors.error(code, "tuttid refused the handoff: " +
                           reply[3:].decode(errors="replace"))
    raise errors.Unavailable("tuttid's handoff socket %s: an answer of %d bytes that is not a "
                             "handoff" % (path, len(reply)))

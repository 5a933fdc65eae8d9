"""tuttid's admin Stats over its operator socket, with no generated code: the `tutti` package
carries only kvcache.proto's modules, so this calls /tutti.v1.Admin/Stats with raw bytes and
decodes the answer's scalar fields by the numbers that proto/tutti/v1/admin.proto gives them
(read from the repository's copy, so fields added there are found by name).

    stats(admin_socket) -> {"bytes_written": 123, "write_backlog_bytes": 0, ...}
    set_log_level(admin_socket, "datapath", "debug"): SetLogLevel (tuttictl log-level)
    Sampler(admin_socket, period, pick).start() ... .stop(): Stats every `period` s on its own
        thread, samples [[t_s, *pick(stats)]] (t_s from the sampler's creation, now())

Fields the daemon does not send (zero, or unknown to it) are absent; callers use .get(name).
"""

import os
import re
import threading
import time

import grpc

_PROTO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto", "tutti",
                      "v1", "admin.proto")


def _field_numbers(proto_path=_PROTO):
    """{number: name} of StatsResponse's scalar fields."""
    with open(proto_path) as f:
        text = f.read()
    body = re.search(r"message StatsResponse \{(.*?)\n\}", text, re.S)
    if body is None:
        raise ValueError("no StatsResponse in %s" % proto_path)
    out = {}
    for typ, name, num in re.findall(r"^\s*(\w+)\s+(\w+)\s*=\s*(\d+);", body.group(1), re.M):
        if typ in ("uint64", "uint32", "int64", "int32", "bool", "fixed64", "double"):
            out[int(num)] = (name, typ)
    return out


def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def decode(buf, fields):
    """Scalar fields of one serialized message; others (nested messages) are skipped."""
    import struct
    out, i = {}, 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value = struct.unpack_from("<Q", buf, i)[0]
            if num in fields and fields[num][1] == "double":
                value = struct.unpack_from("<d", buf, i)[0]
            i += 8
        elif wire == 2:
            n, i = _varint(buf, i)
            i += n
            continue
        elif wire == 5:
            i += 4
            continue
        else:
            raise ValueError("wire type %d in StatsResponse" % wire)
        if num in fields:
            out[fields[num][0]] = value
    return out


def stats(admin_socket, timeout=5.0):
    """The daemon's Stats as a dict. Raises grpc.RpcError when it does not answer."""
    fields = _field_numbers()
    with grpc.insecure_channel("unix:" + admin_socket) as channel:
        call = channel.unary_unary("/tutti.v1.Admin/Stats", request_serializer=lambda _: b"",
                                   response_deserializer=lambda b: b)
        return decode(call(None, timeout=timeout), fields)


def _string_field(number, text):
    data = text.encode()
    assert len(data) < 128  # one-byte length
    return bytes([number << 3 | 2, len(data)]) + data


def set_log_level(admin_socket, subsystem, level, timeout=5.0):
    """Admin SetLogLevel: `subsystem`'s logger at `level` until restart (as tuttictl log-level).
    Raises grpc.RpcError on refusal (NOT_FOUND for a subsystem with no logger yet)."""
    request = _string_field(1, subsystem) + _string_field(2, level)
    with grpc.insecure_channel("unix:" + admin_socket) as channel:
        call = channel.unary_unary("/tutti.v1.Admin/SetLogLevel", request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        call(request, timeout=timeout)


class Sampler:
    """admin Stats every `period` s on its own thread until stop(). samples: [t_s, *pick(stats)]
    with t_s on the clock of now() (seconds since the sampler was made; t0 is that instant in
    time.monotonic()); marks: {name: t_s} set by mark(). A failed sample is counted in errors,
    never fatal."""

    def __init__(self, admin_socket, period, pick=lambda s: [s], name="stats-sampler"):
        self.admin_socket, self.period, self.pick = admin_socket, period, pick
        self.samples, self.marks, self.errors = [], {}, 0
        self._stop = threading.Event()
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def now(self):
        return time.monotonic() - self.t0

    def mark(self, name):
        self.marks[name] = round(self.now(), 3)

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append([round(self.now(), 3)] + list(self.pick(stats(
                    self.admin_socket))))
            except Exception:  # a missed sample is counted, never fatal
                self.errors += 1
            self._stop.wait(self.period)

    def stop(self):
        self._stop.set()
        self._thread.join(10)

"""tuttid's admin Stats over its operator socket, with no generated code: the `tutti` package
carries only kvcache.proto's modules, so this calls /tutti.v1.Admin/Stats with raw bytes and
decodes the answer's scalar fields by the numbers that proto/tutti/v1/admin.proto gives them
(read from the repository's copy, so fields added there are found by name).

    stats(admin_socket) -> {"bytes_written": 123, "write_backlog_bytes": 0, ...}

Fields the daemon does not send (zero, or unknown to it) are absent; callers use .get(name).
"""

import os
import re

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

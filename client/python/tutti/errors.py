"""Errors of the tutti client: one exception type per gRPC/Abseil code that an engine handles
differently; every one carries `code` (e.g. "UNAVAILABLE") and the daemon's message."""


class TuttiError(Exception):
    code = "UNKNOWN"

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self):
        return "%s: %s" % (self.code, self.message)


class Unavailable(TuttiError):
    """tuttid is unreachable or restarting: treat a Lookup as a miss, drop a Store."""
    code = "UNAVAILABLE"


class NotFound(TuttiError):
    code = "NOT_FOUND"


class InvalidArgument(TuttiError):
    code = "INVALID_ARGUMENT"


class FailedPrecondition(TuttiError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(TuttiError):
    code = "RESOURCE_EXHAUSTED"


_BY_CODE = {c.code: c for c in (Unavailable, NotFound, InvalidArgument, FailedPrecondition,
                                ResourceExhausted)}


def error(code, message):
    """The exception for `code` (a name such as "NOT_FOUND")."""
    cls = _BY_CODE.get(code)
    return cls(message) if cls is not None else TuttiError(message, code)


def from_rpc(e):
    """A TuttiError for a grpc.RpcError."""
    try:
        code = e.code().name
        details = e.details() or ""
    except Exception:  # not a call error (e.g. a channel error)
        code, details = "UNKNOWN", str(e)
    return error(code, details)

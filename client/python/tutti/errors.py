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


class DeadlineExceeded(Unavailable):
    """tuttid did not answer within the call's deadline (stopped, or overloaded): an Unavailable,
    so an engine treats it alike; its code says which."""
    code = "DEADLINE_EXCEEDED"


class NotFound(TuttiError):
    code = "NOT_FOUND"


class InvalidArgument(TuttiError):
    code = "INVALID_ARGUMENT"


class FailedPrecondition(TuttiError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(TuttiError):
    code = "RESOURCE_EXHAUSTED"


class PermissionDenied(TuttiError):
    """tuttid refused the caller: e.g. an Attach without a valid handoff credential."""
    code = "PERMISSION_DENIED"


_BY_CODE = {c.code: c for c in (Unavailable, DeadlineExceeded, NotFound, InvalidArgument,
                                FailedPrecondition, ResourceExhausted, PermissionDenied)}


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
